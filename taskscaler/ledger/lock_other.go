//go:build !unix

package ledger

// withLock runs fn. Without flock, two managers starting in the same
// instant could both take a lease; the expiry check still stops a second
// manager in every other case.
func withLock(path string, fn func() error) error { return fn() }
