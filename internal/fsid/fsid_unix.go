//go:build unix

// Package fsid tells files apart by what the file system knows of them.
package fsid

import (
	"io/fs"
	"syscall"
)

// Inode is the file's inode number (0 where the system has none).
func Inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
