//go:build unix

package flock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestTryLockExcludesAndReleases(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	a, err := TryLock(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(p, 0o600); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, p, 0o600, 5*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting lock: %v, want the context's deadline", err)
	}
	a.Close()
	b, err := Lock(context.Background(), p, 0o600, 5*time.Millisecond)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	b.Close()
	c, err := LockWait(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(p, 0o600); !errors.Is(err, ErrLocked) {
		t.Fatalf("under LockWait: %v, want ErrLocked", err)
	}
	c.Close()
}
