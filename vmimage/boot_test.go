package vmimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
)

// bootEnv is what booting a microVM in a test needs: QEMU, a kernel in
// /boot with its modules, a static busybox and root.
type bootEnv struct {
	qemu, kernel, busybox string
}

func needBoot(t *testing.T) bootEnv {
	t.Helper()
	testenv.Root(t)
	e := bootEnv{qemu: testenv.LookPath(t, "qemu-system-x86_64")}
	k, err := newestKernel("/boot")
	if err != nil {
		testenv.Missing(t, "no kernel: %v", err)
	}
	e.kernel = k
	v, _ := kernelVersion(k)
	if _, err := os.Stat(filepath.Join("/lib/modules", v, "modules.dep")); err != nil {
		testenv.Missing(t, "no modules for kernel %s: %v", v, err)
	}
	e.busybox = "/bin/busybox"
	if err := checkELF(e.busybox, true); err != nil {
		testenv.Missing(t, "no static busybox (busybox-static): %v", err)
	}
	return e
}

// buildAgent builds testdata/agent, the stand-in for `berth guest --init`:
// statically linked (CGO_ENABLED=0), or dynamically linked against the
// host's libc as berth itself is when built with cgo.
func buildAgent(t *testing.T, dynamic bool) string {
	t.Helper()
	goTool := testenv.LookPath(t, "go")
	bin := filepath.Join(t.TempDir(), "agent")
	cmd := exec.Command(goTool, "build", "-o", bin, "./testdata/agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if dynamic {
		testenv.LookPath(t, "gcc")
		cmd = exec.Command(goTool, "build", "-ldflags=-linkmode=external", "-o", bin, "./testdata/agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the test agent: %v\n%s", err, out)
	}
	return bin
}

// console is QEMU's serial console, with the time each line came.
type console struct {
	mu    sync.Mutex
	buf   strings.Builder
	start time.Time
	seen  map[string]time.Duration
}

func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// at returns when the first line containing s came (false: none).
func (c *console) at(s string) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.seen[s]
	return d, ok
}

// disk is a drive of a test VM: read-only, or writable through a
// temporary copy-on-write overlay of QEMU's (snapshot=on), as the
// hypervisor gives each VM over the shared root filesystem.
type disk struct {
	file    string
	overlay bool
}

// bootVM runs QEMU's microvm machine under TCG, as the microVM
// hypervisor does, with the disks read-only, until the guest powers off
// or two minutes pass; it returns the console and how QEMU ended.
func bootVM(t *testing.T, e bootEnv, kernel, initrd string, disks []disk, marks ...string) (*console, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	args := []string{"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-accel", "tcg", "-cpu", "max", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 reboot=t lpj=4000000 tsc_early_khz=2000000"}
	for i, d := range disks {
		id := "d" + string(rune('0'+i))
		mode := "readonly=on"
		if d.overlay {
			mode = "snapshot=on"
		}
		args = append(args, "-drive", "id="+id+",file="+d.file+",format=raw,if=none,"+mode, "-device", "virtio-blk-device,drive="+id)
	}
	args = append(args, "-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path="+sock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=berth.agent", "-no-reboot")
	cmd := exec.CommandContext(ctx, e.qemu, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	c := &console{start: time.Now(), seen: map[string]time.Duration{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.buf.WriteString(line + "\n")
			for _, m := range marks {
				if _, ok := c.seen[m]; !ok && strings.Contains(line, m) {
					c.seen[m] = time.Since(c.start)
				}
			}
			c.mu.Unlock()
		}
	}()
	c.start = time.Now()
	err := cmd.Run()
	pw.Close()
	<-done
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return c, err
}

// TestBootAgent boots the microVM kernel and BootFiles' initramfs under
// TCG with two root filesystems of Build (ext4 and erofs) and the test
// agent as init: it must come up on the host's kernel, find the disks
// and the virtio-serial port, mount both (their modules loaded), write
// through an overlay and power the VM off. The agent is statically
// linked, then dynamically linked (started through the bundle's wrapper
// and loader, as a cgo-built berth is).
func TestBootAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	e := needBoot(t)
	testenv.LookPath(t, "mkfs.ext4")
	testenv.LookPath(t, "mkfs.erofs")
	dir := t.TempDir()
	for _, dynamic := range []bool{false, true} {
		t.Run(map[bool]string{false: "static", true: "dynamic"}[dynamic], func(t *testing.T) {
			bootAgent(t, e, &Store{Dir: dir, Logger: testLogger(t)}, buildAgent(t, dynamic))
		})
	}
}

func bootAgent(t *testing.T, e bootEnv, s *Store, agent string) {
	ctx := context.Background()
	start := time.Now()
	b, err := s.BootFiles(ctx, BootOptions{Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(b.Initramfs)
	t.Logf("initramfs %s: %d bytes, built in %v; kernel %s (%s)", b.Initramfs, fi.Size(), time.Since(start).Round(time.Millisecond), b.Kernel, b.KernelVersion)
	if b.Kernel != e.kernel {
		t.Errorf("kernel %s, want the newest, %s", b.Kernel, e.kernel)
	}
	layout := writeLayout(t, busyboxLayers(t))
	ext4, err := s.Build(ctx, "boot-test:ext4", BuildOptions{OCILayout: layout})
	if err != nil {
		t.Fatal(err)
	}
	erofs, err := s.Build(ctx, "boot-test:erofs", BuildOptions{OCILayout: layout, Format: FormatEROFS})
	if err != nil {
		t.Fatal(err)
	}
	sumBefore, _ := sha256File(ext4.Path)
	c, err := bootVM(t, e, b.Kernel, b.Initramfs, []disk{{file: ext4.Path}, {file: erofs.Path}, {file: ext4.Path, overlay: true}}, "AGENT UP", "AGENT POWEROFF")
	out := c.String()
	if err != nil {
		t.Fatalf("QEMU: %v\n%s", err, out)
	}
	up, ok := c.at("AGENT UP")
	if !ok {
		t.Fatalf("no AGENT UP on the console:\n%s", out)
	}
	off, _ := c.at("AGENT POWEROFF")
	t.Logf("boot to AGENT UP: %v (agent done %v; guest %s); %s", up.Round(time.Millisecond), off.Round(time.Millisecond), grepLine(out, "UPTIME"), grepLine(out, "WRITABLE"))
	for _, want := range []string{
		"ARGS guest --init PID 1",
		"KERNEL " + b.KernelVersion,
		"/dev/vda", "/dev/vdb", "/dev/vdc",
		"PORT /dev/vport",
		"name=berth.agent",
		`busybox=true tmp=1777 resolv="nameserver 10.0.2.3"`,
		" ext4 busybox=true",
		" erofs busybox=true",
		"OVERLAY write: true",
		"WRITABLE /dev/vdc",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	// The ext4 root mounts writable over a copy-on-write overlay, with
	// MinFree free, and the shared file does not change.
	var free int64
	var werr string
	if _, err := fmt.Sscanf(grepLine(out, "WRITABLE /dev/vdc"), "WRITABLE /dev/vdc free=%d write=%s", &free, &werr); err != nil || free < MinFree || werr != "<nil>" {
		t.Errorf("writable root: free %d, write error %s (%v)", free, werr, err)
	}
	if sum, _ := sha256File(ext4.Path); sum != sumBefore {
		t.Errorf("the shared root filesystem changed")
	}
	if strings.Contains(out, "berth init:") {
		t.Errorf("init complained")
	}
	if t.Failed() {
		t.Logf("console:\n%s", out)
	}
	// A second BootFiles is the same file, not rebuilt.
	b2, err := s.BootFiles(ctx, BootOptions{Agent: agent})
	if err != nil || b2.Initramfs != b.Initramfs {
		t.Fatalf("second BootFiles: %+v %v, want %s", b2, err, b.Initramfs)
	}
	if fi2, _ := os.Stat(b.Initramfs); !os.SameFile(fi, fi2) {
		t.Errorf("the initramfs was rebuilt")
	}
}

// TestBootNoAgentPowersOff boots an initramfs without an agent: init
// must say so on the console and power the VM off instead of hanging.
func TestBootNoAgentPowersOff(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	e := needBoot(t)
	v, _ := kernelVersion(e.kernel)
	mods, err := moduleOrder(filepath.Join("/lib/modules", v), GuestModules)
	if err != nil {
		t.Fatal(err)
	}
	applets, err := busyboxApplets(context.Background(), e.busybox)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(t.TempDir(), "initramfs.img")
	f, _ := os.Create(initrd)
	zw := gzip.NewWriter(f)
	if err := writeInitramfs(zw, initramfs{busybox: e.busybox, applets: applets, modules: mods}); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	f.Close()
	c, err := bootVM(t, e, e.kernel, initrd, nil, "berth init:")
	out := c.String()
	if err != nil {
		t.Fatalf("QEMU did not stop by itself: %v\n%s", err, out)
	}
	if !strings.Contains(out, "berth init: no agent") || !strings.Contains(out, "powering off") {
		t.Fatalf("init did not say why it stops:\n%s", out)
	}
	if strings.Contains(out, "Kernel panic") {
		t.Errorf("the VM panicked instead of powering off:\n%s", out)
	}
	if strings.Contains(out, "berth init: insmod") {
		t.Errorf("a module failed to load:\n%s", out)
	}
	d, _ := c.at("berth init:")
	t.Logf("init gave up %v after QEMU started", d.Round(time.Millisecond))
}

func TestInitScriptIsPOSIX(t *testing.T) {
	for _, sh := range []string{"/bin/busybox", "dash", "sh"} {
		p, err := exec.LookPath(sh)
		if err != nil {
			continue
		}
		args := []string{"-n", "-c", initScript}
		if sh == "/bin/busybox" {
			args = append([]string{"sh"}, args...)
		}
		if out, err := exec.Command(p, args...).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", sh, err, out)
		}
	}
}

func TestModuleOrder(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"modules.dep": "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n" +
			"kernel/lib/crc16.ko:\nkernel/fs/mbcache.ko:\nkernel/fs/jbd2/jbd2.ko:\n" +
			"kernel/crypto/crc32c_generic.ko:\nkernel/arch/x86/crypto/crc32c-intel.ko:\n" +
			"kernel/drivers/virtio/virtio_mmio.ko.xz: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n" +
			"kernel/drivers/virtio/virtio_ring.ko:\nkernel/drivers/virtio/virtio.ko:\n" +
			"kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n" +
			"kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko\nkernel/net/core/failover.ko:\n",
		"modules.builtin": "kernel/fs/overlayfs/overlay.ko\n",
		"modules.alias":   "alias crypto-crc32c crc32c_intel\nalias crypto-crc32c crc32c_generic\n",
		"modules.softdep": "# comment\nsoftdep ext4 pre: crypto-crc32c\nsoftdep jbd2 pre: crypto-crc32c post: nothing\n",
	}
	for n, c := range files {
		os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644)
	}
	names := func(ms []kmod) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.file)
		}
		return out
	}
	for _, c := range []struct {
		want []string
		out  []string
		err  string
	}{
		{[]string{"ext4"}, []string{"crc32c_generic.ko", "crc16.ko", "mbcache.ko", "jbd2.ko", "ext4.ko"}, ""},
		{[]string{"virtio_net", "virtio-mmio"}, []string{"failover.ko", "net_failover.ko", "virtio.ko", "virtio_ring.ko", "virtio_net.ko", "virtio_mmio.ko"}, ""},
		{[]string{"overlay"}, nil, ""},
		{[]string{"erofs"}, nil, "erofs: neither"},
	} {
		got, err := moduleOrder(dir, c.want)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: error %v, want %q", c.want, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(names(got), c.out) {
			t.Errorf("%v: %v %v, want %v", c.want, names(got), err, c.out)
		}
	}
	// Every module comes after its dependencies on the real kernel too.
	if k, err := newestKernel("/boot"); err == nil {
		v, _ := kernelVersion(k)
		ms, err := moduleOrder(filepath.Join("/lib/modules", v), GuestModules)
		if err != nil {
			t.Logf("host kernel %s: %v", v, err)
			return
		}
		t.Logf("host kernel %s: %v", v, names(ms))
	}
}

func TestKernelVersion(t *testing.T) {
	dir := t.TempDir()
	// A bzImage-like header: "HdrS" at 0x202, kernel_version at 0x20E
	// pointing (from 0x200) at the version string.
	img := make([]byte, 0x400)
	copy(img[0x202:], "HdrS")
	img[0x20E] = 0x00
	img[0x20F] = 0x01 // 0x100 → string at 0x300
	copy(img[0x300:], "6.9.7-custom (builder@host) #1 SMP\x00")
	os.WriteFile(filepath.Join(dir, "bzImage"), img, 0o644)
	os.WriteFile(filepath.Join(dir, "vmlinuz-6.1.0-9-amd64"), img, 0o644)
	os.WriteFile(filepath.Join(dir, "vmlinuz-6.1.0-56-amd64"), img, 0o644)
	os.WriteFile(filepath.Join(dir, "junk"), []byte("nothing"), 0o644)
	for p, want := range map[string]string{"bzImage": "6.9.7-custom", "vmlinuz-6.1.0-9-amd64": "6.1.0-9-amd64", "junk": ""} {
		v, err := kernelVersion(filepath.Join(dir, p))
		if v != want || (want == "") != (err != nil) {
			t.Errorf("%s: %q %v, want %q", p, v, err, want)
		}
	}
	if k, err := newestKernel(dir); err != nil || filepath.Base(k) != "vmlinuz-6.1.0-56-amd64" {
		t.Errorf("newest: %s %v", k, err)
	}
	if _, err := newestKernel(t.TempDir()); err == nil {
		t.Error("a kernel in an empty directory")
	}
}

func TestCompareVersions(t *testing.T) {
	in := []string{"vmlinuz-6.10.1", "vmlinuz-6.1.0-56-amd64", "vmlinuz-5.19", "vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-56-cloud-amd64"}
	slices.SortFunc(in, compareVersions)
	want := []string{"vmlinuz-5.19", "vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-56-amd64", "vmlinuz-6.1.0-56-cloud-amd64", "vmlinuz-6.10.1"}
	if !slices.Equal(in, want) {
		t.Fatalf("%v, want %v", in, want)
	}
}

func TestBootFilesChecksBusybox(t *testing.T) {
	k, err := newestKernel("/boot")
	if err != nil {
		testenv.Missing(t, "no kernel: %v", err)
	}
	v, _ := kernelVersion(k)
	if _, err := os.Stat(filepath.Join("/lib/modules", v)); err != nil {
		testenv.Missing(t, "no modules: %v", err)
	}
	self, _ := os.Executable()
	if err := checkELF(self, true); err == nil {
		t.Skip("this test binary is static")
	}
	s := &Store{Dir: t.TempDir()}
	_, err = s.BootFiles(context.Background(), BootOptions{Kernel: k, Busybox: self, Agent: self})
	if err == nil || !strings.Contains(err.Error(), "static busybox") {
		t.Fatalf("a dynamic busybox: %v", err)
	}
}

// TestCPIO checks the newc writer against the cpio program.
func TestCPIO(t *testing.T) {
	cpio := testenv.LookPath(t, "cpio")
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.Dir("bin", 0o755)
	w.File("bin/hello", 0o755, 5, strings.NewReader("hello"))
	w.File("odd", 0o640, 3, strings.NewReader("abc"))
	w.Symlink("sbin", "bin")
	w.Dir("tmp", 0o1777)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive of %d bytes, not 4-aligned", buf.Len())
	}
	cmd := exec.Command(cpio, "-itv", "--quiet")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -it: %v\n%s", err, out)
	}
	for _, want := range []string{"drwxr-xr-x", "-rwxr-xr-x", "bin/hello", "-rw-r-----", "odd", "sbin -> bin", "drwxrwxrwt"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio -itv lacks %q:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	cmd = exec.Command(cpio, "-id", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -id: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "bin/hello")); string(b) != "hello" {
		t.Errorf("bin/hello is %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "odd")); string(b) != "abc" {
		t.Errorf("odd is %q", b)
	}
}

func grepLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
