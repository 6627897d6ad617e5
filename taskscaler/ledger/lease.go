package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Lease is one manager's ownership of one instance group, kept as a file
// named after the group under <state dir>/leases. The holder renews it while
// it runs; a crashed holder's lease expires and another manager may take
// the group over. While a lease is held by someone else, a manager neither
// creates nor deletes instances of that group.
//
// Every read-modify-write of the file happens under an exclusive lock of
// a lock file beside it (flock on Unix), so two managers starting at once
// cannot both take the group. Managers on different hosts exclude each other
// only if the state directory is shared between them.
type Lease struct {
	path, lock string
	owner      string
	ttl        time.Duration
}

type leaseFile struct {
	Owner   string    `json:"owner"`
	Group   string    `json:"group"`
	Expires time.Time `json:"expires"`
}

// HeldError says another manager holds the group's lease.
type HeldError struct {
	Group, Owner string
	Expires      time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("instance group %s is managed by %s (lease until %s)", e.Group, e.Owner, e.Expires.Format(time.RFC3339))
}

// ErrLeaseHeld is matched by every *HeldError (errors.Is).
var ErrLeaseHeld = errors.New("instance group lease held by another manager")

// Is makes errors.Is(err, ErrLeaseHeld) hold.
func (e *HeldError) Is(target error) bool { return target == ErrLeaseHeld }

// LeasePath is the lease file of group under dir.
func LeasePath(dir, group string) string {
	return filepath.Join(dir, "leases", url.PathEscape(group)+".json")
}

// TakeLease takes group's lease for owner at now, for ttl. It fails with a
// *HeldError if another owner's lease has not expired. Taking one's own
// lease again renews it.
func TakeLease(dir, group, owner string, now time.Time, ttl time.Duration) (*Lease, error) {
	path := LeasePath(dir, group)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	l := &Lease{path: path, lock: path + ".lock", owner: owner, ttl: ttl}
	return l, l.Renew(group, now)
}

// Renew extends the lease to now+ttl. It fails with a *HeldError if another
// owner took the group while this one's lease had expired and still holds
// it.
func (l *Lease) Renew(group string, now time.Time) error {
	return withLock(l.lock, func() error {
		cur, err := l.read()
		if err != nil {
			return err
		}
		if cur.Owner != "" && cur.Owner != l.owner && now.Before(cur.Expires) {
			return &HeldError{Group: group, Owner: cur.Owner, Expires: cur.Expires}
		}
		return writeFile(l.path, leaseFile{Owner: l.owner, Group: group, Expires: now.Add(l.ttl)})
	})
}

// Release gives the lease up, if this owner holds it.
func (l *Lease) Release() error {
	return withLock(l.lock, func() error {
		cur, err := l.read()
		if err != nil || cur.Owner != l.owner {
			return err
		}
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("lease: %w", err)
		}
		return nil
	})
}

func (l *Lease) read() (leaseFile, error) {
	var cur leaseFile
	data, err := os.ReadFile(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return cur, nil
	}
	if err != nil {
		return cur, fmt.Errorf("lease: %w", err)
	}
	if err := json.Unmarshal(data, &cur); err != nil {
		return leaseFile{}, nil // a torn file: as if absent (it was being rewritten by a crash)
	}
	return cur, nil
}

func writeFile(path string, v any) error {
	data, _ := json.Marshal(v)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}
