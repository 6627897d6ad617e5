//go:build unix

package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// TryLock opens path (creating it with perm) and takes an exclusive lock
// on it without waiting: ErrLocked when another holds it. Close the file
// to release the lock.
func TryLock(path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return f, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, ErrLocked)
		default:
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
	}
}

// Lock is TryLock that waits for the lock until ctx is done, trying again
// every poll.
func Lock(ctx context.Context, path string, perm os.FileMode, poll time.Duration) (*os.File, error) {
	for {
		f, err := TryLock(path, perm)
		if !errors.Is(err, ErrLocked) {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// LockWait opens path and waits in the kernel for an exclusive lock, for
// short critical sections.
func LockWait(path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
	}
}
