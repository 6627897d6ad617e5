// Package snapshots keeps the VM snapshots of failed jobs: a runner whose
// job ran in a microVM and failed may upload the VM (memory, devices,
// disk) as an artifact of type berth_snapshot. The snapshot holds all the
// job had in memory, masked variables included, so it is a secret: it is
// stored only encrypted (format.go: a data key per snapshot, wrapped with
// a key derived from the coordinator's secrets key), and only admins read
// it, through the REST API; no artifact path serves it.
//
// A runner also takes snapshot points of a job (PointTypes) that a later
// job of the same pipeline resumes: stored the same way, never served as
// artifacts, and read decrypted only by a running job of that pipeline
// (runnerhttp, GET /jobs/:id/berth_snapshots/:point).
//
// A copy of the artifact storage alone reveals nothing (the key is not
// there), nor does a copy of the database (the bytes are not there).
package snapshots

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
)

// ArtifactType is the artifact_type of a failed job's snapshot.
const ArtifactType = "berth_snapshot"

// Points are the snapshot points a runner takes of a job, in order.
var Points = []string{"get_sources", "before_script", "end"}

// PointType is the artifact_type of the bundle of snapshot point point:
// berth_snapshot_<point>.
func PointType(point string) string { return ArtifactType + "_" + point }

// IsPoint reports whether point is one of Points.
func IsPoint(point string) bool { return slices.Contains(Points, point) }

// IsSnapshotType reports whether artifacts of type typ are snapshots,
// stored encrypted and never served as artifacts: ArtifactType, or
// PointType of one of Points.
func IsSnapshotType(typ string) bool {
	if typ == ArtifactType {
		return true
	}
	point, ok := strings.CutPrefix(typ, ArtifactType+"_")
	return ok && IsPoint(point)
}

// CheckType refuses an artifact type that claims to be a snapshot's and
// is not one this package knows (berth_snapshot_<unknown point>); any
// other type passes.
func CheckType(typ string) error {
	if strings.HasPrefix(typ, ArtifactType+"_") && !IsSnapshotType(typ) {
		return fmt.Errorf("artifact_type %q is not a snapshot type: want %s or %s_<point>, point one of %s",
			typ, ArtifactType, ArtifactType, strings.Join(Points, ", "))
	}
	return nil
}

// kekPurpose names the subkey of the coordinator's secrets key that
// wraps the snapshots' data keys (sealed.Key.Subkey).
const kekPurpose = "berth failed-job snapshot data keys v1"

// Available reports whether a is a snapshot that may be fetched at now:
// of a snapshot type (IsSnapshotType) and not expired (the reaper deletes an expired
// one at its next round).
func Available(a *store.Artifact, now time.Time) bool {
	return IsSnapshotType(a.Type) && (a.ExpireAt.IsZero() || now.Before(a.ExpireAt))
}

// Vault stores snapshots encrypted in an artifact storage.
type Vault struct {
	kek  []byte
	arts artifacts.Storage
}

// NewVault returns a vault over arts whose snapshots are sealed with a
// subkey of key, the coordinator's secrets key.
func NewVault(key *sealed.Key, arts artifacts.Storage) *Vault {
	return &Vault{kek: key.Subkey(kekPurpose), arts: arts}
}

// Put encrypts what r holds, a snapshot of job jobID of at most max
// bytes (max <= 0: no limit; artifacts.ErrTooLarge past it), and stores
// it under storageKey. It streams: no more than a chunk is held. It
// returns the size of the snapshot, not of the larger object stored
// (SealedSize).
func (v *Vault) Put(ctx context.Context, storageKey string, jobID int64, r io.Reader, max int64) (int64, error) {
	plain := &countingReader{r: r}
	enc, err := Encrypt(plain, v.kek, jobID)
	if err != nil {
		return 0, fmt.Errorf("storing the snapshot of job %d: %w", jobID, err)
	}
	limit := int64(0)
	if max > 0 {
		// One more byte of snapshot makes the object larger than this.
		limit = SealedSize(max)
	}
	stored, err := v.arts.Put(ctx, storageKey, enc, limit)
	if err != nil {
		return 0, err
	}
	if want := SealedSize(plain.n); stored != want {
		return 0, fmt.Errorf("storing the snapshot of job %d: %d bytes stored for %d of snapshot, want %d", jobID, stored, plain.n, want)
	}
	return plain.n, nil
}

// Open returns the snapshot a records, decrypted. The object must be as
// large as a's Size makes it, so that a reader of Size bytes that ends
// early tells of a snapshot that does not open (ErrCorrupt,
// ErrTruncated) past its header. artifacts.ErrNotFound when its bytes are
// gone.
func (v *Vault) Open(ctx context.Context, a *store.Artifact) (io.ReadCloser, error) {
	if !IsSnapshotType(a.Type) {
		return nil, fmt.Errorf("artifact %d of job %d is of type %s, not a snapshot", a.ID, a.JobID, a.Type)
	}
	rc, size, err := v.arts.Open(ctx, a.StorageKey)
	if err != nil {
		return nil, err
	}
	if want := SealedSize(a.Size); size != want {
		rc.Close()
		why := ErrCorrupt
		if size < want {
			why = ErrTruncated
		}
		return nil, fmt.Errorf("snapshot of job %d: %d bytes stored, want %d for its %d bytes: %w", a.JobID, size, want, a.Size, why)
	}
	plain, err := Decrypt(rc, v.kek, a.JobID)
	if err != nil {
		rc.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{plain, rc}, nil
}

// Unreadable reports whether err, of Open, says that the stored object
// is not a snapshot that opens (ErrNotSnapshot, ErrKey, ErrCorrupt,
// ErrTruncated): a fault of the storage or of the key, not of the asker.
func Unreadable(err error) bool {
	return errors.Is(err, ErrNotSnapshot) || errors.Is(err, ErrKey) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTruncated)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
