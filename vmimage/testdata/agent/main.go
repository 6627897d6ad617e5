// Command agent stands in for `berth guest --init` in vmimage's boot
// tests: run as the VM's init by the initramfs, it prints what it finds —
// its arguments, the kernel, the disks and virtio-serial ports, whether
// each disk mounts (ext4 or erofs) and an overlay over it — and powers
// the VM off. Built with CGO_ENABLED=0.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	fmt.Println("AGENT UP")
	fmt.Println("ARGS", strings.Join(os.Args[1:], " "), "PID", os.Getpid())
	var u syscall.Utsname
	if err := syscall.Uname(&u); err == nil {
		fmt.Println("KERNEL", str(u.Release[:]))
	}
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		fmt.Println("UPTIME", strings.Fields(string(b))[0])
	}
	var disks, ports []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		disks, _ = filepath.Glob("/dev/vd*")
		ports, _ = filepath.Glob("/dev/vport*")
		if len(disks) > 0 && len(ports) > 0 {
			break
		}
	}
	fmt.Println("DISKS", strings.Join(disks, " "))
	fmt.Println("PORTS", strings.Join(ports, " "))
	for _, p := range ports {
		name, _ := os.ReadFile("/sys/class/virtio-ports/" + filepath.Base(p) + "/name")
		fmt.Printf("PORT %s name=%s\n", p, strings.TrimSpace(string(name)))
	}
	for _, d := range disks {
		mnt := "/mnt/" + filepath.Base(d)
		os.MkdirAll(mnt, 0o755)
		for _, try := range []struct {
			fs    string
			flags uintptr
		}{{"ext4", 0}, {"ext4", syscall.MS_RDONLY}, {"erofs", syscall.MS_RDONLY}} {
			fs := try.fs
			if err := syscall.Mount(d, mnt, fs, try.flags, ""); err != nil {
				continue
			}
			if try.flags == 0 {
				var st syscall.Statfs_t
				syscall.Statfs(mnt, &st)
				err := os.WriteFile(mnt+"/builds/written", make([]byte, 16<<20), 0o644)
				syscall.Sync()
				fmt.Printf("WRITABLE %s free=%d write=%v\n", d, int64(st.Bavail)*st.Bsize, err)
			}
			resolv, _ := os.ReadFile(mnt + "/etc/resolv.conf")
			var st syscall.Stat_t
			mode := "?"
			if err := syscall.Stat(mnt+"/tmp", &st); err == nil {
				mode = fmt.Sprintf("%o", st.Mode&0o7777)
			}
			_, berr := os.Stat(mnt + "/bin/busybox")
			fmt.Printf("MOUNT %s %s busybox=%v tmp=%s resolv=%q\n", d, fs, berr == nil, mode, strings.TrimSpace(string(resolv)))
			if fs == "erofs" {
				overlay(mnt)
			}
			break
		}
	}
	if b, err := os.ReadFile("/proc/modules"); err == nil {
		var mods []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			mods = append(mods, strings.Fields(l)[0])
		}
		fmt.Println("MODULES", strings.Join(mods, " "))
	}
	fmt.Println("AGENT POWEROFF")
	syscall.Sync()
	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Println("reboot:", err)
	}
	select {}
}

// overlay writes through an overlay of a tmpfs over the read-only lower.
func overlay(lower string) {
	base := "/run/ovl"
	os.MkdirAll(base, 0o755)
	if err := syscall.Mount("tmpfs", base, "tmpfs", 0, ""); err != nil {
		fmt.Println("OVERLAY tmpfs:", err)
		return
	}
	for _, d := range []string{"upper", "work", "merged"} {
		os.MkdirAll(base+"/"+d, 0o755)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + base + "/upper,workdir=" + base + "/work"
	if err := syscall.Mount("overlay", base+"/merged", "overlay", 0, opts); err != nil {
		fmt.Println("OVERLAY mount:", err)
		return
	}
	err := os.WriteFile(base+"/merged/tmp/written", []byte("x"), 0o644)
	fmt.Println("OVERLAY write:", err == nil, err)
}

func str(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
