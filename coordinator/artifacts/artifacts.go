// Package artifacts stores the bytes of job artifacts behind a small
// interface: a local directory (Dir) or an S3-compatible object store
// (S3). Both pass the conformance suite in artifactstest. DeleteRecorded
// removes artifacts the store records, object and record.
package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/berthci/berth/coordinator/store"
)

// ErrTooLarge is returned by Put when the body exceeds the size limit.
var ErrTooLarge = errors.New("artifact too large")

// ErrNotFound is returned by Open and Delete for a missing key.
var ErrNotFound = errors.New("artifact not found")

// Storage keeps artifact bytes by key. Keys are relative slash-separated
// paths chosen by the coordinator (CheckKey); every method refuses any
// other key. Implementations are safe for concurrent use. Put is atomic:
// a reader sees either nothing or the whole object, and a Put that fails
// (ErrTooLarge, a reader error, the context ending) leaves the object as
// it was.
type Storage interface {
	// Put stores r under key, reading at most max bytes (max <= 0: no
	// limit); ErrTooLarge if r is longer. It returns the size stored.
	Put(ctx context.Context, key string, r io.Reader, max int64) (int64, error)
	// Open returns the object and its size.
	Open(ctx context.Context, key string) (io.ReadCloser, int64, error)
	// Delete removes the object; ErrNotFound if it does not exist.
	Delete(ctx context.Context, key string) error
}

// Dir stores artifacts as files below a directory.
type Dir struct {
	root   string
	noSync bool
}

// NewDir returns a Storage rooted at dir, creating it.
func NewDir(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating artifact directory: %w", err)
	}
	return &Dir{root: dir}, nil
}

// NoSync stops Put from syncing what it stores: for a directory thrown
// away with its coordinator (berth run).
func (d *Dir) NoSync() { d.noSync = true }

// Root is the directory the artifacts are stored under.
func (d *Dir) Root() string { return d.root }

// CheckKey reports whether key is a valid artifact key: a relative
// slash-separated path, already clean (no "", ".", ".." or empty parts),
// without backslashes.
func CheckKey(key string) error {
	clean := path.Clean("/" + key)
	if key == "" || clean == "/" || strings.Contains(key, "\\") || clean != "/"+key {
		return fmt.Errorf("invalid artifact key %q", key)
	}
	return nil
}

func (d *Dir) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// Put implements Storage: it writes to a temporary file, syncs it and
// renames it into place.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, max int64) (int64, error) {
	p, err := d.path(key)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return 0, fmt.Errorf("storing artifact %s: %w", key, err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".upload-*")
	if err != nil {
		return 0, fmt.Errorf("storing artifact %s: %w", key, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	src := r
	if max > 0 {
		src = io.LimitReader(r, max+1)
	}
	n, err := io.Copy(f, ctxReader{ctx, src})
	if err == nil && max > 0 && n > max {
		err = ErrTooLarge
	}
	if err == nil && !d.noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("storing artifact %s: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return 0, fmt.Errorf("storing artifact %s: %w", key, err)
	}
	return n, nil
}

// Open implements Storage.
func (d *Dir) Open(_ context.Context, key string) (io.ReadCloser, int64, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("opening artifact %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("opening artifact %s: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("opening artifact %s: %w", key, err)
	}
	return f, st.Size(), nil
}

// Delete implements Storage.
func (d *Dir) Delete(_ context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting artifact %s: %w", key, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("deleting artifact %s: %w", key, err)
	}
	return nil
}

// DeleteRecorded deletes artifacts recorded in st: each one's object from
// s first, then its record, so that a failure leaves the record to try
// again. An object or record already gone (a concurrent delete, another
// replica's reaper) is no error. It goes on past a failure and returns
// the errors joined.
func DeleteRecorded(ctx context.Context, st store.Store, s Storage, arts []*store.Artifact) error {
	var errs []error
	for _, a := range arts {
		if err := s.Delete(ctx, a.StorageKey); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, fmt.Errorf("%s artifact of job %d: %w", a.Type, a.JobID, err))
			continue
		}
		if err := st.DeleteArtifact(ctx, a.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, fmt.Errorf("%s artifact of job %d: %w", a.Type, a.JobID, err))
		}
	}
	return errors.Join(errs...)
}

// ctxReader stops a copy when the context ends (client gone).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
