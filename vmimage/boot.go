package vmimage

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/internal/bundle"
)

// Boot is what a microVM boots: a kernel and the initramfs that starts
// the agent. Both files are read-only; many VMs boot them at once.
type Boot struct {
	Kernel string `json:"kernel"` // the kernel image (bzImage), where it was found
	// PVH is the same kernel uncompressed, booted through its PVH entry
	// (no self-decompression: seconds less per boot under emulation);
	// "" when Kernel has none (then Kernel is booted).
	PVH           string `json:"pvh_kernel,omitempty"`
	Initramfs     string `json:"initramfs"`      // gzip-compressed newc cpio archive, under the Store's Dir
	KernelVersion string `json:"kernel_version"` // as uname -r prints it in the guest, e.g. "6.1.0-56-amd64"
}

// BootOptions choose the files BootFiles puts together. The zero value
// takes everything from the host.
type BootOptions struct {
	// Kernel is the kernel image; default: the newest /boot/vmlinuz-*
	// (by version).
	Kernel string
	// Modules is the kernel's module directory; default:
	// /lib/modules/<version of Kernel>, the version taken from the file
	// name vmlinuz-<version>, else from the bzImage header.
	Modules string
	// Agent is the berth binary run as the VM's init (`berth guest
	// --init`); default: os.Executable(). A dynamically linked binary
	// brings its loader and libraries (internal/bundle).
	Agent string
	// Busybox is a statically linked busybox, the initramfs's shell and
	// tools; default /bin/busybox.
	Busybox string
}

// GuestModules are the kernel modules the initramfs loads, with their
// dependencies (modules.dep) and soft dependencies (modules.softdep, such
// as ext4's crc32c): the virtio transports (virtio-mmio for the microvm
// machine, virtio-pci for a full PC such as q35), the disks, the
// virtio-serial console (the agent's channel), the network, and the file
// systems of root filesystems (ext4, erofs) and of a copy-on-write layer
// over them (overlay). Those built into the kernel (modules.builtin) are
// left out.
var GuestModules = []string{"virtio_mmio", "virtio_pci", "virtio_blk", "virtio_console", "virtio_net", "ext4", "erofs", "overlay"}

// initScript is the initramfs's /init, run by busybox sh.
//
//go:embed init.sh
var initScript string

// initramfsLayout changes whenever what BootFiles writes changes, so
// initramfs files of older layouts are not taken for current ones.
const initramfsLayout = "2"

// BootFiles returns a kernel and an initramfs for microVMs, building the
// initramfs once per kernel version, agent, busybox and layout under
// Dir/boot (concurrent callers, also in other processes, build it once).
// Each call marks the initramfs used, for Prune.
//
// The initramfs holds:
//
//	/init                      POSIX sh script (init.sh): mounts proc, sysfs, devtmpfs, devpts,
//	                           insmods load-order, execs /berth/berth guest --init
//	/bin/busybox, /bin/<applet> → busybox, /sbin → bin, /usr/bin → ../bin, /usr/sbin → ../bin
//	/lib/modules/*.ko          GuestModules and their dependencies, uncompressed
//	/lib/modules/load-order    their file names, one a line, dependencies first
//	/berth/                    internal/bundle.Helper(Agent): /berth/berth runs the agent
//	/dev/console, /proc, /sys, /dev, /run, /tmp, /mnt, /root, /etc
func (s *Store) BootFiles(ctx context.Context, o BootOptions) (*Boot, error) {
	wrap := func(step string, err error) error { return fmt.Errorf("boot files: %s: %w", step, err) }
	var err error
	if o.Kernel == "" {
		if o.Kernel, err = newestKernel("/boot"); err != nil {
			return nil, wrap("finding a kernel", err)
		}
	}
	kver, err := kernelVersion(o.Kernel)
	if err != nil {
		return nil, wrap("kernel "+o.Kernel, err)
	}
	if o.Modules == "" {
		o.Modules = filepath.Join("/lib/modules", kver)
	}
	mods, err := moduleOrder(o.Modules, GuestModules)
	if err != nil {
		return nil, wrap("modules of kernel "+kver, err)
	}
	if o.Agent == "" {
		if o.Agent, err = os.Executable(); err != nil {
			return nil, wrap("agent", err)
		}
	}
	if o.Agent, err = filepath.EvalSymlinks(o.Agent); err != nil {
		return nil, wrap("agent", err)
	}
	if err := checkELF(o.Agent, false); err != nil {
		return nil, wrap("agent "+o.Agent, err)
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if err := checkELF(o.Busybox, true); err != nil {
		return nil, wrap("busybox "+o.Busybox, err)
	}
	agentSum, err := sha256File(o.Agent)
	if err != nil {
		return nil, wrap("agent", err)
	}
	bbSum, err := sha256File(o.Busybox)
	if err != nil {
		return nil, wrap("busybox", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "layout %s\nkernel %s\nagent %s\nbusybox %s\n", initramfsLayout, kver, agentSum, bbSum)
	for _, m := range mods {
		fmt.Fprintf(h, "module %s\n", m.file)
	}
	io.WriteString(h, initScript)
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir, err := s.dir()
	if err != nil {
		return nil, wrap("store", err)
	}
	bootDir := filepath.Join(dir, "boot")
	out := filepath.Join(bootDir, "initramfs-"+kver+"-"+key+".img")
	b := &Boot{Kernel: o.Kernel, Initramfs: out, KernelVersion: kver}
	if abs, err := filepath.Abs(o.Kernel); err == nil {
		b.Kernel = abs
	}
	if b.PVH, err = s.pvhKernel(ctx, b.Kernel, kver, bootDir); err != nil {
		if ctx.Err() != nil {
			return nil, wrap("kernel", ctx.Err())
		}
		s.log().Info("booting the compressed kernel", "kernel", b.Kernel, "why", err)
		b.PVH = ""
	}
	if touch(out) {
		return b, nil
	}
	unlock, err := s.lock(ctx, "initramfs-"+kver+"-"+key)
	if err != nil {
		return nil, wrap("locking", err)
	}
	defer unlock()
	if touch(out) {
		return b, nil
	}
	start := time.Now()
	s.log().Info("building the initramfs", "kernel", kver, "agent", o.Agent, "modules", len(mods))
	helper, err := bundle.Helper(o.Agent, filepath.Join(dir, "helpers"))
	if err != nil {
		return nil, wrap("agent", err)
	}
	applets, err := busyboxApplets(ctx, o.Busybox)
	if err != nil {
		return nil, wrap("busybox "+o.Busybox, err)
	}
	if err := os.MkdirAll(bootDir, 0o755); err != nil {
		return nil, wrap("writing the initramfs", err)
	}
	f, err := os.CreateTemp(bootDir, ".initramfs-*")
	if err != nil {
		return nil, wrap("writing the initramfs", err)
	}
	defer os.Remove(f.Name())
	bw := bufio.NewWriterSize(f, 1<<20)
	zw, _ := gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	err = writeInitramfs(zw, initramfs{busybox: o.Busybox, applets: applets, modules: mods, agentDir: helper})
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Chmod(0o444)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), out)
	}
	if err != nil {
		return nil, wrap("writing the initramfs", err)
	}
	if fi, err := os.Stat(out); err == nil {
		s.log().Info("built the initramfs", "path", out, "bytes", fi.Size(), "took", time.Since(start).Round(time.Millisecond))
	}
	return b, nil
}

// initramfs is what writeInitramfs puts in the archive.
type initramfs struct {
	busybox  string
	applets  []string
	modules  []kmod
	agentDir string // the bundle for /berth ("" or empty: none, for tests of init's failure)
}

// writeInitramfs writes the uncompressed cpio archive to w.
func writeInitramfs(w io.Writer, in initramfs) error {
	c := newCPIOWriter(w)
	for _, d := range []string{"bin", "dev", "etc", "lib", "lib/modules", "mnt", "proc", "root", "run", "sys", "usr", "berth"} {
		perm := uint32(0o755)
		if d == "root" {
			perm = 0o700
		}
		c.Dir(d, perm)
	}
	c.Dir("tmp", 0o1777)
	c.CharDev("dev/console", 0o600, 5, 1)
	c.Symlink("sbin", "bin")
	c.Symlink("usr/bin", "../bin")
	c.Symlink("usr/sbin", "../bin")
	c.File("init", 0o755, int64(len(initScript)), strings.NewReader(initScript))
	if err := addFile(c, "bin/busybox", in.busybox, 0o755); err != nil {
		return err
	}
	for _, a := range in.applets {
		if a != "busybox" {
			c.Symlink("bin/"+a, "busybox")
		}
	}
	var order strings.Builder
	for _, m := range in.modules {
		if err := addModule(c, "lib/modules/"+m.file, m.path); err != nil {
			return err
		}
		order.WriteString(m.file + "\n")
	}
	c.File("lib/modules/load-order", 0o644, int64(order.Len()), strings.NewReader(order.String()))
	if in.agentDir != "" {
		err := filepath.WalkDir(in.agentDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(in.agentDir, p)
			if rel == "." || rel == ".complete" {
				return nil
			}
			name := "berth/" + filepath.ToSlash(rel)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case d.IsDir():
				return c.Dir(name, uint32(fi.Mode().Perm()))
			case fi.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				return c.Symlink(name, t)
			case fi.Mode().IsRegular():
				return addFile(c, name, p, uint32(fi.Mode().Perm()))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("adding the agent: %w", err)
		}
	}
	return c.Close()
}

func addFile(c *cpioWriter, name, src string, perm uint32) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return c.File(name, perm, fi.Size(), f)
}

// addModule adds a kernel module, decompressing it: busybox's insmod
// takes only plain ELF modules.
func addModule(c *cpioWriter, name, src string) error {
	var data []byte
	var err error
	switch {
	case strings.HasSuffix(src, ".gz"):
		var f *os.File
		if f, err = os.Open(src); err == nil {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(f); err == nil {
				data, err = io.ReadAll(zr)
			}
			f.Close()
		}
	case strings.HasSuffix(src, ".xz"), strings.HasSuffix(src, ".zst"):
		tool := map[bool]string{true: "xz", false: "zstd"}[strings.HasSuffix(src, ".xz")]
		if _, lerr := exec.LookPath(tool); lerr != nil {
			return fmt.Errorf("module %s is compressed: %s is needed to decompress it", src, tool)
		}
		data, err = exec.Command(tool, "-dc", src).Output()
	default:
		return addFile(c, name, src, 0o644)
	}
	if err != nil {
		return fmt.Errorf("decompressing module %s: %w", src, err)
	}
	return c.File(name, 0o644, int64(len(data)), bytes.NewReader(data))
}

// busyboxApplets lists the applets of a busybox binary.
func busyboxApplets(ctx context.Context, bb string) ([]string, error) {
	out, err := exec.CommandContext(ctx, bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "" && !strings.ContainsAny(a, "/.") {
			applets = append(applets, a)
		}
	}
	if !slices.Contains(applets, "sh") || !slices.Contains(applets, "insmod") || !slices.Contains(applets, "mount") {
		return nil, fmt.Errorf("busybox --list: no sh, insmod or mount among %d applets", len(applets))
	}
	return applets, nil
}

// checkELF checks that p is an ELF executable for this machine, without
// an interpreter when static is set.
func checkELF(p string, static bool) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if want := elfMachine[runtime.GOARCH]; want != elf.EM_NONE && f.Machine != want {
		return fmt.Errorf("built for %s, not for this machine (%s)", f.Machine, runtime.GOARCH)
	}
	if static {
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				return errors.New("dynamically linked (it has an ELF interpreter); the initramfs needs a static busybox (Debian: apt-get install busybox-static)")
			}
		}
	}
	return nil
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "riscv64": elf.EM_RISCV, "s390x": elf.EM_S390, "ppc64le": elf.EM_PPC64}

// newestKernel returns the /boot/vmlinuz-* of the highest version.
func newestKernel(dir string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(dir, "vmlinuz-*"))
	if len(matches) == 0 {
		return "", fmt.Errorf("no %s/vmlinuz-* (Debian: apt-get install linux-image-amd64)", dir)
	}
	slices.SortFunc(matches, func(a, b string) int { return compareVersions(filepath.Base(a), filepath.Base(b)) })
	return matches[len(matches)-1], nil
}

// compareVersions orders strings with their digit runs compared as
// numbers: 6.1.0-9 < 6.1.0-56 < 6.10.1.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitsPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// kernelVersion is the version of the kernel image p: from its file name
// vmlinuz-<version>, else from the bzImage setup header (the kernel_version
// string the boot protocol points at).
func kernelVersion(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if v, ok := strings.CutPrefix(filepath.Base(p), "vmlinuz-"); ok && v != "" {
		return v, nil
	}
	hdr := make([]byte, 0x210)
	if _, err := io.ReadFull(f, hdr); err != nil || string(hdr[0x202:0x206]) != "HdrS" {
		return "", errors.New("no version: the file is not named vmlinuz-<version> and is not a bzImage")
	}
	off := int64(hdr[0x20E]) | int64(hdr[0x20F])<<8
	buf := make([]byte, 256)
	n, _ := f.ReadAt(buf, 0x200+off)
	v, _, _ := strings.Cut(string(buf[:n]), " ")
	v, _, _ = strings.Cut(v, "\x00")
	if off == 0 || v == "" {
		return "", errors.New("no version in the bzImage header")
	}
	return v, nil
}

// kmod is one module of the initramfs.
type kmod struct {
	name string // module name, "_" for "-"
	file string // file name in the initramfs: <name>.ko, so init matches name.param= arguments
	path string // where it is on the host
}

// moduleOrder resolves want (module names) against a kernel's module
// directory: it returns them with every dependency (modules.dep) and
// soft pre-dependency (modules.softdep, through modules.alias), each
// once, dependencies first, leaving out modules built into the kernel
// (modules.builtin). A wanted module that is neither is an error; a soft
// dependency that is neither is left out.
func moduleOrder(dir string, want []string) ([]kmod, error) {
	depData, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("%w (is the kernel's modules package installed? set BootOptions.Modules)", err)
	}
	deps := map[string][]string{} // name → dependency names
	paths := map[string]string{}  // name → path relative to dir
	for _, line := range strings.Split(string(depData), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n := modName(mod)
		paths[n] = mod
		for _, d := range strings.Fields(rest) {
			deps[n] = append(deps[n], modName(d))
		}
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[modName(line)] = true
		}
	}
	aliases := map[string][]string{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.alias")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "alias" {
				aliases[f[1]] = append(aliases[f[1]], modName(f[2]))
			}
		}
	}
	soft := map[string][]string{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.softdep")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "softdep" {
				continue
			}
			n, pre := modName(f[1]), false
			for _, w := range f[2:] {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						soft[n] = append(soft[n], w)
					}
				}
			}
		}
	}
	// resolveSoft turns a soft dependency (a module name or an alias such
	// as crypto-crc32c) into a module, preferring the generic
	// implementation, which works on every CPU.
	resolveSoft := func(w string) string {
		if n := modName(w); paths[n] != "" || builtin[n] {
			return n
		}
		cands := aliases[w]
		for _, c := range cands {
			if builtin[c] {
				return c
			}
		}
		for _, c := range cands {
			if strings.HasSuffix(c, "_generic") && paths[c] != "" {
				return c
			}
		}
		for _, c := range cands {
			if paths[c] != "" {
				return c
			}
		}
		return ""
	}
	var out []kmod
	seen := map[string]bool{}
	var visit func(n string, depth int) error
	visit = func(n string, depth int) error {
		if seen[n] || builtin[n] {
			return nil
		}
		if depth > 64 {
			return fmt.Errorf("module %s: dependency loop", n)
		}
		seen[n] = true
		for _, w := range soft[n] {
			if s := resolveSoft(w); s != "" {
				if err := visit(s, depth+1); err != nil {
					return err
				}
			}
		}
		for _, d := range deps[n] {
			if err := visit(d, depth+1); err != nil {
				return err
			}
		}
		rel := paths[n]
		if rel == "" {
			return fmt.Errorf("module %s: not in %s/modules.dep", n, dir)
		}
		p := rel
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, rel)
		}
		out = append(out, kmod{name: n, file: n + ".ko", path: p})
		return nil
	}
	for _, w := range want {
		n := modName(w)
		if builtin[n] {
			continue
		}
		if paths[n] == "" {
			return nil, fmt.Errorf("module %s: neither in %s/modules.dep nor built in", w, dir)
		}
		if err := visit(n, 0); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// modName is the module name of a modules.dep path or a name: base name
// without .ko[.gz|.xz|.zst], "-" read as "_".
func modName(s string) string {
	s = filepath.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// BootKernel is the file a hypervisor boots: PVH when there is one, else
// Kernel.
func (b *Boot) BootKernel() string {
	if b.PVH != "" {
		return b.PVH
	}
	return b.Kernel
}
