package vmimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whiteout names of image layers (OCI image spec, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// errEscape is returned for tar entries whose names leave the root.
var errEscape = errors.New("path escapes the root")

// extractor writes tar archives — a container export, or image layers in
// order — into a staging directory, root, as faithfully as the file
// system allows: contents (sparse where the archive has zeros), modes
// with setuid, setgid and sticky bits, owners, times, symbolic and hard
// links, extended attributes, and device nodes and FIFOs where mknod is
// allowed (skipped with a debug line otherwise).
//
// Nothing is ever written outside root: entry names are cleaned and
// refused when they climb above it, and directories on the way are
// resolved the way a chroot at root would (a symbolic link /var/run →
// /run leads to root/run), so a link in the image cannot lead a later
// entry out.
type extractor struct {
	root string
	log  *slog.Logger
	// devices allows mknod of device nodes (false in fuzzing).
	devices bool
	// dirTimes are the modification times of directories, set last:
	// writing into a directory changes its time.
	dirTimes map[string]time.Time
	// created are the paths (below root) the current layer wrote:
	// whiteouts apply only to lower layers.
	created map[string]bool
	entries int
}

func newExtractor(root string, log *slog.Logger) *extractor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &extractor{root: root, log: log, devices: true, dirTimes: map[string]time.Time{}}
}

// apply extracts one tar archive on top of what is there. With
// whiteouts, .wh.<name> entries remove <name> of lower layers and
// .wh..wh..opq hides everything lower layers put in its directory.
func (x *extractor) apply(r io.Reader, whiteouts bool) error {
	x.created = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tar archive: %w", err)
		}
		if err := x.entry(tr, hdr, whiteouts); err != nil {
			return fmt.Errorf("%q: %w", hdr.Name, err)
		}
	}
}

// cleanName turns an entry name into a slash-separated path below root
// ("" for root itself), refusing names that climb above it.
func cleanName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", errors.New("NUL in name")
	}
	c := path.Clean(strings.TrimLeft(name, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errEscape
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// resolve returns the host path for the in-image path rel (cleaned):
// its directories are followed as in a chroot at root, its last element
// is not.
func (x *extractor) resolve(rel string) (string, error) {
	if rel == "" {
		return x.root, nil
	}
	dir, base := path.Split(rel)
	if base == "" || base == "." || base == ".." {
		return "", fmt.Errorf("%q: %w", rel, errEscape)
	}
	d, err := x.resolveDir(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(d, base), nil
}

// resolveDir follows the directory path dir below root: ".." stops at
// root, symbolic links are read with root as "/" (at most 40 of them),
// missing elements are taken as directories to be made. Every existing
// element of the result is a real directory below root.
func (x *extractor) resolveDir(dir string) (string, error) {
	parts := strings.Split(dir, "/")
	var stack []string
	links := 0
	for len(parts) > 0 {
		c := parts[0]
		parts = parts[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		p := filepath.Join(x.root, filepath.Join(stack...), c)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			stack = append(stack, c)
			continue
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if links++; links > 40 {
				return "", errors.New("too many levels of symbolic links")
			}
			t, err := os.Readlink(p)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(t, "/") {
				stack = stack[:0]
			}
			parts = append(strings.Split(t, "/"), parts...)
			continue
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory", filepath.Join(stack...)+"/"+c)
		}
		stack = append(stack, c)
	}
	return filepath.Join(x.root, filepath.Join(stack...)), nil
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header, whiteouts bool) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if isSparse(hdr) {
		// Their holes cost nothing in the archive: a few bytes could
		// claim an exabyte. Image tools (Go's archive/tar in Docker,
		// BuildKit, containerd) never write them.
		return errors.New("GNU sparse tar entries are not supported")
	}
	x.entries++
	if whiteouts {
		base := path.Base(rel)
		if base == whiteoutOpaque {
			return x.opaque(path.Dir(rel))
		}
		if name, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
			if strings.HasPrefix(name, ".wh.") {
				return nil // AUFS internals (.wh..wh.plnk, .wh..wh.aufs)
			}
			if name == "" || name == "." || name == ".." {
				return fmt.Errorf("whiteout of %q: %w", name, errEscape)
			}
			return x.whiteout(path.Join(path.Dir(rel), name))
		}
	}
	p, err := x.resolve(rel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	// What is there gives way, except a directory to a directory.
	if fi, err := os.Lstat(p); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) && p != x.root {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	x.created[p] = true
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if p != x.root {
			if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
	case tar.TypeReg, tar.TypeRegA:
		if err := writeSparse(p, tr, hdr.Size); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
	case tar.TypeLink:
		trel, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		target, err := x.resolve(trel)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		if fi, err := os.Lstat(target); err != nil || fi.IsDir() {
			return fmt.Errorf("hard link to %q: no such file", hdr.Linkname)
		}
		return os.Link(target, p)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		typ := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if !x.devices && hdr.Typeflag != tar.TypeFifo {
			x.log.Debug("skipping a device node", "path", rel)
			return nil
		}
		if err := unix.Mknod(p, typ|mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			delete(x.created, p)
			x.log.Debug("skipping a device node or FIFO", "path", rel, "err", err)
			return nil
		}
	default:
		delete(x.created, p)
		x.log.Debug("skipping a tar entry of an unknown type", "path", rel, "type", string(hdr.Typeflag))
		return nil
	}
	if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if err := unix.Lsetxattr(p, attr, []byte(v), 0); err != nil {
				x.log.Debug("skipping an extended attribute", "path", rel, "attr", attr, "err", err)
			}
		}
	}
	if hdr.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	// After chown, which clears setuid and setgid bits.
	if err := unix.Chmod(p, mode); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeDir {
		x.dirTimes[p] = hdr.ModTime
		return nil
	}
	return os.Chtimes(p, hdr.ModTime, hdr.ModTime)
}

// isSparse reports a GNU sparse entry (old GNU format or PAX records).
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// whiteout removes rel as lower layers left it.
func (x *extractor) whiteout(rel string) error {
	p, err := x.resolve(rel)
	if err != nil {
		return err
	}
	if x.created[p] || p == x.root {
		return nil
	}
	return os.RemoveAll(p)
}

// opaque removes what lower layers put in the directory rel (followed
// as in a chroot, so it is a real directory below root), keeping what
// this layer wrote.
func (x *extractor) opaque(rel string) error {
	p, err := x.resolveDir(rel)
	if err != nil {
		return err
	}
	var prune func(dir string) error
	prune = func(dir string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, e := range entries {
			c := filepath.Join(dir, e.Name())
			switch {
			case !x.created[c]:
				if err := os.RemoveAll(c); err != nil {
					return err
				}
			case e.IsDir():
				if err := prune(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return prune(p)
}

// finish sets the directories' times, deepest first.
func (x *extractor) finish() error {
	dirs := make([]string, 0, len(x.dirTimes))
	for d := range x.dirTimes {
		dirs = append(dirs, d)
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range dirs {
		t := x.dirTimes[d]
		if err := os.Chtimes(d, t, t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writeSparse writes size bytes of r to a new file p, leaving holes for
// blocks of zeros (images carry files such as a sparse /var/log/lastlog
// of gigabytes).
func writeSparse(p string, r io.Reader, size int64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	var off int64
	for off < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if n > 0 {
			if err := writeNonZero(f, buf[:n], off); err != nil {
				f.Close()
				return err
			}
			off += int64(n)
		}
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeNonZero writes b at off, skipping its all-zero 4 KiB blocks.
func writeNonZero(f *os.File, b []byte, off int64) error {
	const block = 4096
	for i := 0; i < len(b); i += block {
		chunk := b[i:min(i+block, len(b))]
		if isZero(chunk) {
			continue
		}
		if _, err := f.WriteAt(chunk, off+int64(i)); err != nil {
			return err
		}
	}
	return nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
