//go:build !unix

package local

// fileLock is not available here: build directories are not kept.
type fileLock struct{}

func tryLock(string) (*fileLock, bool) { return nil, false }

func (*fileLock) unlock() {}
