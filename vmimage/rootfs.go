package vmimage

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/berthci/berth/guest"
)

// Files added to images that lack them (or have them empty, as a
// container export does: the engine's mount points).
const (
	// GuestResolvConf points at QEMU user networking's DNS server.
	GuestResolvConf = "nameserver 10.0.2.3\n"
	guestHosts      = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
)

// prepareGuest adds to the staged root filesystem what the guest agent
// needs: the job's directories /builds and /cache, /tmp (1777), the
// mount points /proc, /sys, /dev, /usr/local/berth (the agent
// bind-mounts the helper there) and a resolv.conf and hosts file when
// the image has none (or empty ones). From a container export, the
// engine's /.dockerenv goes: the VM is no container.
func prepareGuest(x *extractor, fromDocker bool, cfg guest.ImageConfig) error {
	dirs := []struct {
		path string
		mode uint32
	}{
		{"builds", 0o755}, {"cache", 0o755}, {"tmp", 0o1777}, {"proc", 0o555}, {"sys", 0o555},
		{"dev", 0o755}, {"etc", 0o755}, {"usr/local/berth", 0o755},
	}
	for _, d := range dirs {
		p, err := x.resolve(d.path)
		if err != nil {
			return fmt.Errorf("/%s: %w", d.path, err)
		}
		fi, err := os.Lstat(p)
		switch {
		case err == nil && fi.IsDir():
			if d.path == "tmp" {
				if err := syscall.Chmod(p, d.mode); err != nil {
					return fmt.Errorf("/%s: %w", d.path, err)
				}
			}
			continue
		case err == nil:
			return fmt.Errorf("/%s is not a directory", d.path)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("/%s: %w", d.path, err)
		}
		if err := syscall.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("/%s: %w", d.path, err)
		}
	}
	for _, f := range []struct{ path, content string }{{"etc/resolv.conf", GuestResolvConf}, {"etc/hosts", guestHosts}} {
		p, err := x.resolve(f.path)
		if err != nil {
			return fmt.Errorf("/%s: %w", f.path, err)
		}
		fi, err := os.Lstat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
			continue
		}
		if err == nil && fi.IsDir() {
			return fmt.Errorf("/%s is a directory", f.path)
		}
		// Missing, empty, or a symbolic link (such as systemd-resolved's,
		// which points at nothing in a VM): replaced, never followed.
		_ = os.Remove(p)
		if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
			return fmt.Errorf("/%s: %w", f.path, err)
		}
	}
	// How the image says to run it, for the agent (guest.ImageConfigPath).
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	dir, err := x.resolve(filepath.Dir(guest.ImageConfigPath))
	if err != nil {
		return fmt.Errorf("/%s: %w", filepath.Dir(guest.ImageConfigPath), err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("/%s: %w", filepath.Dir(guest.ImageConfigPath), err)
	}
	p := filepath.Join(dir, filepath.Base(guest.ImageConfigPath))
	_ = os.Remove(p)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return fmt.Errorf("/%s: %w", guest.ImageConfigPath, err)
	}
	if fromDocker {
		if err := os.Remove(filepath.Join(x.root, ".dockerenv")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// makeFS makes the file system file from the staging directory.
func makeFS(ctx context.Context, f Format, staging, file string, log *slog.Logger) error {
	if f == FormatEROFS {
		return run(ctx, "mkfs.erofs", file, staging)
	}
	u, err := usage(staging)
	if err != nil {
		return fmt.Errorf("measuring the content: %w", err)
	}
	size, inodes := ext4Size(u)
	for try := 0; ; try++ {
		_ = os.Remove(file)
		err := run(ctx, "mkfs.ext4", "-q", "-F", "-b", "4096", "-N", strconv.FormatInt(inodes, 10),
			"-d", staging, "-L", "berth-root", "-E", "root_owner=0:0", file, strconv.FormatInt(size/1024, 10)+"k")
		var free int64
		if err == nil {
			if free, err = ext4Free(ctx, file); err != nil {
				return err
			}
			if free >= MinFree {
				log.Debug("made an ext4 file", "bytes", size, "free", free, "inodes", inodes, "content", u.bytes, "files", u.inodes)
				return nil
			}
		}
		if try == 3 || (err != nil && !strings.Contains(err.Error(), "Could not allocate") && !strings.Contains(err.Error(), "No space")) {
			if err == nil {
				err = fmt.Errorf("only %d bytes free in %d", free, size)
			}
			return err
		}
		// The estimate fell short: grow by what was missing, and some.
		grow := max(MinFree-free, size/4)
		log.Debug("ext4 estimate too small, growing it", "bytes", size, "free", free, "by", grow)
		size = roundUp(size+grow, 1<<20)
	}
}

// contentUsage is what a staged tree takes.
type contentUsage struct {
	bytes  int64 // 4 KiB blocks of file data (sparse files as allocated), directories and long symlinks
	inodes int64
}

func usage(root string) (contentUsage, error) {
	var u contentUsage
	seen := map[uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st != nil && st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		u.inodes++
		switch {
		case fi.Mode().IsRegular():
			alloc := fi.Size()
			if st != nil {
				alloc = min(alloc, st.Blocks*512)
			}
			u.bytes += roundUp(alloc, 4096)
			// Extent tree blocks of large files.
			u.bytes += fi.Size() / (128 << 20) * 4096
		case fi.IsDir():
			u.bytes += roundUp(max(fi.Size(), 4096), 4096)
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60:
			u.bytes += 4096
		}
		return nil
	})
	return u, err
}

// ext4Size is the size and inode count of an ext4 file system for
// content u with MinFree free: the data, the inode tables (256 bytes an
// inode), the journal mke2fs chooses for the size, 5% reserved for root,
// block group metadata, and a tenth of the content as slack.
func ext4Size(u contentUsage) (size, inodes int64) {
	inodes = roundUp(u.inodes+u.inodes/4+4096, 1024)
	base := u.bytes + u.bytes/10 + inodes*256 + MinFree
	size = base + journalSize(base)
	size += size/20 + size/64 // reserved blocks, group descriptors and bitmaps
	return roundUp(size, 1<<20), inodes
}

// journalSize is the journal mke2fs makes for a file system of size
// bytes with 4 KiB blocks (ext2fs_default_journal_size).
func journalSize(size int64) int64 {
	blocks := size / 4096
	switch {
	case blocks < 2048:
		return 0
	case blocks < 32768:
		return 1024 * 4096
	case blocks < 256*1024:
		return 4096 * 4096
	case blocks < 512*1024:
		return 8192 * 4096
	case blocks < 4096*1024:
		return 16384 * 4096
	case blocks < 8192*1024:
		return 32768 * 4096
	case blocks < 16384*1024:
		return 65536 * 4096
	case blocks < 32768*1024:
		return 131072 * 4096
	}
	return 262144 * 4096
}

// ext4Free is the space of an ext4 file for anyone (free blocks less
// those reserved for root), from dumpe2fs -h.
func ext4Free(ctx context.Context, file string) (int64, error) {
	out, err := exec.CommandContext(ctx, "dumpe2fs", "-h", file).Output()
	if err != nil {
		return 0, fmt.Errorf("dumpe2fs -h: %w", err)
	}
	vals := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			vals[k] = n
		}
	}
	bs := vals["Block size"]
	if bs == 0 {
		return 0, errors.New("dumpe2fs -h: no block size")
	}
	return (vals["Free blocks"] - vals["Reserved block count"]) * bs, nil
}

// run runs a program, its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return fmt.Errorf("%s: %w (Debian: apt-get install %s)", name, err, map[string]string{"mkfs.ext4": "e2fsprogs", "mkfs.erofs": "erofs-utils"}[name])
		}
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }
