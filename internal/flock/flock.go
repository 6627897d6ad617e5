// Package flock takes advisory whole-file locks (flock(2)) on lock files:
// held while the returned file is open, released by the kernel when the
// process dies, so a crash never leaves a stale lock behind.
package flock

import "errors"

var (
	// ErrLocked: another open file description holds the lock.
	ErrLocked = errors.New("locked by another process")
	// ErrUnsupported: this system has no flock; callers decide whether
	// going on unlocked is safe.
	ErrUnsupported = errors.New("file locks are not supported on this system")
)
