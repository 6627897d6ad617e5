package shell

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// scriptFile holds a stage's script for the shell to read: an anonymous
// memory file on Linux (no inode made and removed on the build
// directory's file system per stage; the shell reads it as /dev/fd/3,
// seekable, so in blocks), a temporary file elsewhere.
func scriptFile(tmpDir, stage, script string) (f *os.File, path string, cleanup func(), err error) {
	fd, err := unix.MemfdCreate("berth-stage-"+stage, unix.MFD_CLOEXEC)
	if err != nil {
		return tempScript(tmpDir, stage, script)
	}
	f = os.NewFile(uintptr(fd), "berth-stage-"+stage)
	if _, err := f.WriteString(script); err != nil {
		f.Close()
		return nil, "", nil, fmt.Errorf("writing script: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, "", nil, err
	}
	// ExtraFiles[0] is the child's fd 3.
	return f, "/dev/fd/3", func() { f.Close() }, nil
}
