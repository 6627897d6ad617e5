//go:build !unix

package ledger

import "os"

// withLock runs fn. Without flock, two managers starting in the same
// instant could both take a lease; the expiry check still stops a second
// manager in every other case.
func withLock(path string, fn func() error) error { return fn() }

// tryLockFile opens path; without flock it cannot tell a second process.
func tryLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
