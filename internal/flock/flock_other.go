//go:build !unix

package flock

import (
	"context"
	"os"
	"time"
)

// TryLock returns ErrUnsupported: there is no flock here.
func TryLock(path string, perm os.FileMode) (*os.File, error) { return nil, ErrUnsupported }

// Lock returns ErrUnsupported.
func Lock(ctx context.Context, path string, perm os.FileMode, poll time.Duration) (*os.File, error) {
	return nil, ErrUnsupported
}

// LockWait returns ErrUnsupported.
func LockWait(path string, perm os.FileMode) (*os.File, error) { return nil, ErrUnsupported }
