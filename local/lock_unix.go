//go:build unix

package local

import (
	"os"
	"syscall"
)

type fileLock struct{ f *os.File }

// tryLock takes an exclusive lock on path without waiting.
func tryLock(path string) (*fileLock, bool) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return &fileLock{f}, true
}

func (l *fileLock) unlock() {
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
}
