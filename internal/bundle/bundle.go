// Package bundle makes the berth binary runnable in an environment that
// has none of the host's libraries: a container image (musl, busybox,
// distroless with a shell) or a VM's initramfs. A statically linked
// binary is used as it is; a dynamically linked one (built with cgo
// against glibc) brings the host's ELF loader and every shared library it
// needs, started by a small #!/bin/sh wrapper.
//
// The bundle is a directory that works wherever it is put: the wrapper
// finds the loader and libraries beside itself, so executors mount or
// copy it to any path (the docker executor mounts it at
// /usr/local/berth, the microVM initramfs has it at /berth).
package bundle

import (
	"bufio"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/berthci/berth/internal/fsid"
)

// Helper prepares a directory holding the berth binary at bin, ready to
// be mounted or copied into an environment, once per checksum of the
// binary, under stateDir, and returns its path:
//
//	<stateDir>/helper-<sha256[:16]>/berth           the binary itself (static)
//
// or, when the binary names an ELF interpreter (dynamically linked, for
// example built with cgo against glibc), so that it runs in any image
// (musl, busybox, distroless with a shell):
//
//	<stateDir>/helper-<sha256[:16]>/berth           #!/bin/sh wrapper: exec <dir>/lib/<loader> --library-path <dir>/lib <dir>/bin/berth "$@"
//	<stateDir>/helper-<sha256[:16]>/bin/berth       the binary
//	<stateDir>/helper-<sha256[:16]>/lib/…           the host's loader and every shared library it needs
//
// where <dir> is the directory the wrapper is found in at run time (its
// $0, symbolic links resolved), so the directory can be mounted anywhere.
// The environment needs /bin/sh for a dynamically linked binary.
//
// The directory is built beside and renamed into place, so concurrent
// callers (and processes) share it safely; it must be treated as
// read-only. Bundles of other binaries unused for a week are removed.
func Helper(bin, stateDir string) (dir string, err error) {
	sum, err := binarySum(bin, stateDir)
	if err != nil {
		return "", fmt.Errorf("bundling helper %s: %w", bin, err)
	}
	dir = filepath.Join(stateDir, "helper-"+sum[:16])
	defer pruneBundles(stateDir, dir)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		now := time.Now()
		_ = os.Chtimes(filepath.Join(dir, ".complete"), now, now)
		return dir, nil
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return "", fmt.Errorf("bundling helper: %w", err)
	}
	tmp, err := os.MkdirTemp(stateDir, ".helper-*")
	if err != nil {
		return "", fmt.Errorf("bundling helper: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("bundling helper: %w", err)
	}
	if err := buildBundle(bin, tmp); err != nil {
		return "", fmt.Errorf("bundling helper %s: %w", bin, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(sum+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("bundling helper: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another caller finished first: use its bundle.
		if _, serr := os.Stat(filepath.Join(dir, ".complete")); serr == nil {
			return dir, nil
		}
		return "", fmt.Errorf("bundling helper: %w", err)
	}
	return dir, nil
}

// bundleMaxAge is how long a bundle no caller used is kept.
const bundleMaxAge = 7 * 24 * time.Hour

// pruneBundles removes the bundles of other binaries that no caller has
// used for bundleMaxAge (each use touches .complete), and leftovers of
// interrupted bundling as old.
func pruneBundles(stateDir, keep string) {
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(stateDir, e.Name())
		if strings.HasPrefix(e.Name(), sumPrefix) || strings.HasPrefix(e.Name(), ".tmp-sum-") {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > bundleMaxAge {
				_ = os.Remove(p)
			}
			continue
		}
		if p == keep || !e.IsDir() || !strings.HasPrefix(strings.TrimPrefix(e.Name(), "."), "helper-") {
			continue
		}
		fi, err := os.Stat(filepath.Join(p, ".complete"))
		if err != nil {
			fi, err = os.Stat(p)
		}
		if err == nil && time.Since(fi.ModTime()) > bundleMaxAge {
			_ = os.RemoveAll(p)
		}
	}
}

// sumPrefix names the files of stateDir that remember a binary's sum by
// what identifies the file (path, size, modification time, inode): hashing
// a 40 MB berth binary took 50-80 ms of every runner start and berth run.
const sumPrefix = ".sum-"

// binarySum is fileSum, remembered in stateDir while the file is the same.
func binarySum(bin, stateDir string) (string, error) {
	fi, err := os.Stat(bin)
	if err != nil {
		return "", err
	}
	id := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d", bin, fi.Size(), fi.ModTime().UnixNano(), fsid.Inode(fi)))
	memo := filepath.Join(stateDir, sumPrefix+hex.EncodeToString(id[:12]))
	if b, err := os.ReadFile(memo); err == nil {
		if sum := strings.TrimSpace(string(b)); len(sum) == 64 && isHex(sum) {
			now := time.Now()
			_ = os.Chtimes(memo, now, now)
			return sum, nil
		}
	}
	sum, err := fileSum(bin)
	if err != nil {
		return "", err
	}
	// Best effort: without it the next start hashes again.
	if os.MkdirAll(stateDir, 0o755) == nil {
		if f, err := os.CreateTemp(stateDir, ".tmp-sum-*"); err == nil {
			_, werr := f.WriteString(sum + "\n")
			if cerr := f.Close(); werr != nil || cerr != nil || os.Rename(f.Name(), memo) != nil {
				os.Remove(f.Name())
			}
		}
	}
	return sum, nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// buildBundle fills dir for the binary bin.
func buildBundle(bin, dir string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("reading ELF: %w", err)
	}
	defer f.Close()
	interp, err := elfInterp(f)
	if err != nil {
		return err
	}
	if interp == "" {
		return copyFile(bin, filepath.Join(dir, "berth"), 0o755)
	}
	libDir := filepath.Join(dir, "lib")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return err
	}
	if err := copyFile(bin, filepath.Join(dir, "bin", "berth"), 0o755); err != nil {
		return err
	}
	loader := filepath.Base(interp)
	if err := copyFile(interp, filepath.Join(libDir, loader), 0o755); err != nil {
		return fmt.Errorf("copying the loader: %w", err)
	}
	r := newLibResolver(f)
	libs, err := r.closure(bin, f)
	if err != nil {
		return err
	}
	for name, src := range libs {
		if name == loader {
			continue
		}
		if err := copyFile(src, filepath.Join(libDir, name), 0o755); err != nil {
			return fmt.Errorf("copying %s: %w", name, err)
		}
	}
	return os.WriteFile(filepath.Join(dir, "berth"), []byte(wrapper(loader)), 0o755)
}

// wrapper is the #!/bin/sh script that starts the bundled binary with
// the bundled loader and libraries, found beside the script.
func wrapper(loader string) string {
	return "#!/bin/sh\n" +
		"# berth helper: the berth binary run by the host's loader and libraries, so it\n" +
		"# runs in images without them (musl, busybox). They are beside this script.\n" +
		"b=$0\n" +
		"if [ -L \"$b\" ]; then b=$(readlink -f \"$b\" 2>/dev/null || echo \"$b\"); fi\n" +
		"case $b in */*) d=${b%/*} ;; *) d=. ;; esac\n" +
		"GODEBUG=netdns=go${GODEBUG:+,$GODEBUG} exec \"$d/lib/" + loader + "\" --library-path \"$d/lib\" \"$d/bin/berth\" \"$@\"\n"
}

// elfInterp returns the PT_INTERP of f ("" for a static binary).
func elfInterp(f *elf.File) (string, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return "", fmt.Errorf("reading the ELF interpreter: %w", err)
		}
		return strings.TrimRight(string(b), "\x00"), nil
	}
	return "", nil
}

// libResolver finds shared libraries on this host the way the dynamic
// loader does: DT_RPATH/DT_RUNPATH, then /etc/ld.so.conf, then the
// default directories; a library must match the binary's class and
// machine.
type libResolver struct {
	class   elf.Class
	machine elf.Machine
	dirs    []string
}

func newLibResolver(f *elf.File) *libResolver {
	r := &libResolver{class: f.Class, machine: f.Machine}
	r.dirs = append(r.dirs, ldSoConf("/etc/ld.so.conf", 0)...)
	if t := multiarch(); t != "" {
		r.dirs = append(r.dirs, "/lib/"+t, "/usr/lib/"+t)
	}
	r.dirs = append(r.dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
	return r
}

// closure returns every library bin needs, directly or not, by name.
func (r *libResolver) closure(bin string, f *elf.File) (map[string]string, error) {
	out := map[string]string{}
	type item struct {
		path string
		f    *elf.File
	}
	queue := []item{{bin, f}}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		needed, err := it.f.ImportedLibraries()
		if err != nil {
			return nil, fmt.Errorf("reading the libraries %s needs: %w", it.path, err)
		}
		extra := runPaths(it.f, filepath.Dir(it.path))
		for _, name := range needed {
			if _, done := out[name]; done {
				continue
			}
			p, lf, err := r.find(name, extra)
			if err != nil {
				return nil, err
			}
			out[name] = p
			queue = append(queue, item{p, lf})
		}
		if it.f != f {
			it.f.Close()
		}
	}
	return out, nil
}

func (r *libResolver) find(name string, extra []string) (string, *elf.File, error) {
	if strings.Contains(name, "/") {
		lf, err := r.open(name)
		if err != nil {
			return "", nil, fmt.Errorf("library %s: %w", name, err)
		}
		return name, lf, nil
	}
	for _, d := range append(extra, r.dirs...) {
		p := filepath.Join(d, name)
		if lf, err := r.open(p); err == nil {
			return p, lf, nil
		}
	}
	return "", nil, fmt.Errorf("library %s: not found on this host (searched %s)", name, strings.Join(r.dirs, ", "))
}

// open opens p when it is an ELF file of the right class and machine.
func (r *libResolver) open(p string) (*elf.File, error) {
	lf, err := elf.Open(p)
	if err != nil {
		return nil, err
	}
	if lf.Class != r.class || lf.Machine != r.machine {
		lf.Close()
		return nil, errors.New("wrong ELF class or machine")
	}
	return lf, nil
}

// runPaths are f's DT_RUNPATH and DT_RPATH directories ($ORIGIN expanded).
func runPaths(f *elf.File, origin string) []string {
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
				if d != "" {
					dirs = append(dirs, d)
				}
			}
		}
	}
	return dirs
}

// ldSoConf reads the directories of an ld.so.conf and its includes.
func ldSoConf(p string, depth int) []string {
	if depth > 8 {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		if inc, ok := strings.CutPrefix(line, "include"); ok {
			pat := strings.TrimSpace(inc)
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(p), pat)
			}
			matches, _ := filepath.Glob(pat)
			for _, m := range matches {
				dirs = append(dirs, ldSoConf(m, depth+1)...)
			}
			continue
		}
		dirs = append(dirs, line)
	}
	return dirs
}

// multiarch is Debian's multiarch triplet of this architecture.
func multiarch() string {
	return map[string]string{
		"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "386": "i386-linux-gnu",
		"arm": "arm-linux-gnueabihf", "ppc64le": "powerpc64le-linux-gnu", "s390x": "s390x-linux-gnu",
		"riscv64": "riscv64-linux-gnu", "mips64le": "mips64el-linux-gnuabi64", "loong64": "loongarch64-linux-gnu",
	}[runtime.GOARCH]
}

// copyFile copies src (following symlinks) to dst with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}
