package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel command line parameters the hypervisor sets.
const (
	// ParamHostname is the VM's host name (its nesting VM id).
	ParamHostname = "berth.hostname"
	// ParamNetwork is "user" (a NIC on QEMU's user network) or "none".
	ParamNetwork = "berth.network"
)

// Guest network addresses with QEMU's user networking.
const (
	guestAddr  = "10.0.2.15/24"
	guestRoute = "10.0.2.2"
)

// InitOptions configure Init.
type InitOptions struct {
	// Agent is the argv that starts the agent (`berth guest --serve`);
	// Init appends --root.
	Agent []string
	// Console receives init's messages (the VM's console).
	Console io.Writer
}

// Init is the VM's init, run as PID 1 by the initramfs's /init once it
// mounted /proc, /sys, /dev and loaded the modules. It mounts the job's
// root filesystem from the first disk at RootDir (ext4 read-write on the
// hypervisor's copy-on-write overlay; erofs read-only under a tmpfs
// overlay), mounts /proc, /sys, /dev, /dev/pts, /dev/shm, /run and /tmp's
// parents inside it, binds the berth bundle (/berth) read-only at
// /usr/local/berth in it, brings the network up, starts the agent and
// restarts it if it dies, and reaps every orphan. It returns only on a
// failure the VM cannot run jobs after; the caller powers off then.
//
// A VM without a disk (a hypervisor's probe) runs the agent on the
// initramfs itself.
func Init(o InitOptions) error {
	if o.Console == nil {
		o.Console = os.Stderr
	}
	say := func(format string, args ...any) { fmt.Fprintf(o.Console, "berth init: "+format+"\n", args...) }
	params := cmdline()
	if h := params[ParamHostname]; h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			say("setting the host name: %v", err)
		}
	}
	root := RootDir
	if _, err := os.Stat("/dev/vda"); err != nil {
		say("no disk: the agent runs on the initramfs")
		root = "/"
	} else if err := mountRoot("/dev/vda", RootDir); err != nil {
		return fmt.Errorf("mounting the root filesystem: %w", err)
	}
	if err := networkUp(params[ParamNetwork]); err != nil {
		// Jobs that need no network still run; the job sees the error
		// in its own failures.
		say("network: %v", err)
	}
	if root != "/" {
		if err := os.WriteFile(filepath.Join(root, "etc/hostname"), []byte(params[ParamHostname]+"\n"), 0o644); err != nil && params[ParamHostname] != "" {
			say("writing /etc/hostname: %v", err)
		}
	}
	agent := append(append([]string(nil), o.Agent...), "--root", root)
	return superviseAgent(agent, say)
}

// cmdline parses /proc/cmdline's key=value words.
func cmdline() map[string]string {
	b, _ := os.ReadFile("/proc/cmdline")
	m := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Filesystem magic numbers, and where they are on the device.
const (
	ext4Magic     = 0xEF53     // le16 at 1024+0x38
	erofsMagic    = 0xE0F5E1E2 // le32 at 1024
	ext4MagicOff  = 1024 + 0x38
	erofsMagicOff = 1024
)

// fsType reads which filesystem dev holds.
func fsType(dev string) (string, error) {
	f, err := os.Open(dev)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 2048)
	if _, err := io.ReadFull(f, buf); err != nil {
		return "", fmt.Errorf("reading %s: %w", dev, err)
	}
	le16 := func(o int) uint32 { return uint32(buf[o]) | uint32(buf[o+1])<<8 }
	le32 := func(o int) uint32 { return le16(o) | le16(o+2)<<16 }
	switch {
	case le32(erofsMagicOff) == erofsMagic:
		return "erofs", nil
	case le16(ext4MagicOff) == ext4Magic:
		return "ext4", nil
	}
	return "", fmt.Errorf("%s holds neither ext4 nor erofs", dev)
}

// mountRoot mounts dev at dir with what a job needs inside.
func mountRoot(dev, dir string) error {
	typ, err := fsType(dev)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	switch typ {
	case "ext4":
		if err := unix.Mount(dev, dir, "ext4", 0, ""); err != nil {
			return fmt.Errorf("mount %s (ext4) on %s: %w", dev, dir, err)
		}
	case "erofs":
		// A read-only image: the job writes to a tmpfs on top.
		lower, rw := "/mnt/lower", "/mnt/rw"
		for _, d := range []string{lower, rw} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := unix.Mount(dev, lower, "erofs", unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mount %s (erofs) on %s: %w", dev, lower, err)
		}
		if err := unix.Mount("tmpfs", rw, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount a tmpfs on %s: %w", rw, err)
		}
		for _, d := range []string{"upper", "work"} {
			if err := os.Mkdir(filepath.Join(rw, d), 0o755); err != nil {
				return err
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, rw, rw)
		if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount the overlay on %s: %w", dir, err)
		}
	}
	type mnt struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}
	for _, m := range []mnt{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"devpts", "dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666"},
		{"tmpfs", "dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	} {
		target := filepath.Join(dir, m.target)
		if err := mkdirIn(dir, m.target); err != nil {
			return err
		}
		if err := unix.Mount(m.src, target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, target, err)
		}
	}
	// /dev/ptmx as the devpts instance's, as container runtimes do.
	ptmx := filepath.Join(dir, "dev/ptmx")
	_ = os.Remove(ptmx)
	_ = os.Symlink("pts/ptmx", ptmx)
	// The helper: the bundle the initramfs brought, read-only.
	if err := mkdirIn(dir, "usr/local/berth"); err != nil {
		return err
	}
	target := filepath.Join(dir, "usr/local/berth")
	if err := unix.Mount("/berth", target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind /berth on %s: %w", target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}

// mkdirIn makes rel under root, refusing a path that leaves root through
// a symbolic link of the image (an image's /run may be a link to
// /var/run: that is followed inside root).
func mkdirIn(root, rel string) error {
	p := root
	for _, part := range strings.Split(rel, "/") {
		next := filepath.Join(p, part)
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(next, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&os.ModeSymlink != 0:
			dest, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(strings.TrimPrefix(p, root), dest)
			}
			dest = filepath.Clean("/" + dest)
			if err := mkdirIn(root, strings.TrimPrefix(dest, "/")); err != nil {
				return err
			}
			next = filepath.Join(root, dest)
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", next)
		}
		p = next
	}
	return nil
}

// networkUp configures the loopback, and with QEMU's user networking the
// first NIC, with busybox's ip from the initramfs.
func networkUp(mode string) error {
	run := func(args ...string) error {
		out, err := exec.Command("/bin/ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	if err := run("link", "set", "lo", "up"); err != nil {
		return err
	}
	if mode == "none" {
		return nil
	}
	// The NIC appears when its driver probed; a moment after the modules.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat("/sys/class/net/eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			if mode == "user" {
				return errors.New("no eth0")
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := run("addr", "add", guestAddr, "dev", "eth0"); err != nil {
		return err
	}
	if err := run("link", "set", "eth0", "up"); err != nil {
		return err
	}
	return run("route", "add", "default", "via", guestRoute)
}

// superviseAgent runs the agent, starting it again when it dies, and
// reaps every process that ends up with init.
func superviseAgent(argv []string, say func(string, ...any)) error {
	start := func() (int, error) {
		attr := &os.ProcAttr{
			Env:   []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin", "HOME=/"},
			Files: []*os.File{nil, os.Stdout, os.Stderr},
		}
		p, err := os.StartProcess(argv[0], argv, attr)
		if err != nil {
			return 0, err
		}
		return p.Pid, nil
	}
	pid, err := start()
	if err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	restarts := 0
	lastStart := time.Now()
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			if err == unix.ECHILD {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return fmt.Errorf("wait: %w", err)
		}
		if wpid != pid {
			continue
		}
		say("the agent ended (%s); starting it again", waitString(ws))
		if time.Since(lastStart) > time.Minute {
			restarts = 0
		}
		restarts++
		if restarts > 5 {
			return errors.New("the agent keeps dying")
		}
		time.Sleep(time.Duration(restarts) * 200 * time.Millisecond)
		lastStart = time.Now()
		if pid, err = start(); err != nil {
			return fmt.Errorf("starting the agent again: %w", err)
		}
	}
}

func waitString(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// Poweroff powers the VM off (init's last resort).
func Poweroff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Only when that failed: PID 1 exiting panics the kernel, which
	// with panic=-1 reboots, and QEMU's -no-reboot stops.
	syscall.Exit(1)
}
