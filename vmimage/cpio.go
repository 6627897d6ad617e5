package vmimage

import (
	"fmt"
	"io"
	"strings"
)

// File type bits of a cpio entry's mode (as in stat(2)).
const (
	cpioDir     = 0o040000
	cpioReg     = 0o100000
	cpioSymlink = 0o120000
	cpioChar    = 0o020000
)

// cpioWriter writes a "newc" cpio archive (magic 070701), the format the
// Linux kernel unpacks as an initramfs: each entry is a 110-byte ASCII
// header of thirteen 8-digit hexadecimal fields, the NUL-terminated name
// padded to 4 bytes, then the data padded to 4 bytes; a "TRAILER!!!"
// entry ends the archive. Entries are written in order, parents before
// children; hard links are not used. Every entry is owned by root and
// dated mtime, so the same input gives the same archive.
type cpioWriter struct {
	w     io.Writer
	n     int64
	ino   uint32
	mtime int64
	err   error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w} }

// write writes one entry: mode includes the file type bits; data (size
// bytes) is the file's content or the symbolic link's target.
func (c *cpioWriter) write(name string, mode uint32, rdevMajor, rdevMinor uint32, size int64, data io.Reader) error {
	if c.err != nil {
		return c.err
	}
	name = strings.TrimPrefix(name, "/")
	if size > 0xFFFFFFFF {
		c.err = fmt.Errorf("cpio: %s: %d bytes is too large for newc", name, size)
		return c.err
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, uint32(c.mtime), uint32(size), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.put([]byte(hdr))
	c.put(append([]byte(name), 0))
	c.pad()
	if size > 0 && c.err == nil {
		n, err := io.CopyN(c.w, data, size)
		c.n += n
		if err != nil {
			c.err = fmt.Errorf("cpio: %s: %w", name, err)
		}
		c.pad()
	}
	return c.err
}

func (c *cpioWriter) put(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.put(make([]byte, 4-r))
	}
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm uint32) error {
	return c.write(name, cpioDir|perm&0o7777, 0, 0, 0, nil)
}

// File adds a regular file of size bytes read from r.
func (c *cpioWriter) File(name string, perm uint32, size int64, r io.Reader) error {
	return c.write(name, cpioReg|perm&0o7777, 0, 0, size, r)
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(name, target string) error {
	return c.write(name, cpioSymlink|0o777, 0, 0, int64(len(target)), strings.NewReader(target))
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) error {
	return c.write(name, cpioChar|perm&0o7777, major, minor, 0, nil)
}

// Close writes the trailer. It does not close the underlying writer.
func (c *cpioWriter) Close() error {
	return c.write("TRAILER!!!", 0, 0, 0, 0, nil)
}
