package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/nestingtest"
	"github.com/berthci/berth/vmimage"
)

// TestConformance runs the hypervisor conformance suite against real
// QEMU VMs (TCG, microvm, user networking) of the busybox test image.
func TestConformance(t *testing.T) {
	imageDir := needBoot(t)
	state := stateDir(t)
	nestingtest.Run(t, func(t *testing.T) nesting.Hypervisor {
		return newTestHypervisor(t)
	}, testImage, nestingtest.WithConfig(bootConfig(state, imageDir)))
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
		t.Errorf("after the suite, %s/vms holds %v", state, ents)
	}
}

// initHV initializes a new hypervisor with config and shuts it down at
// the end of the test.
func initHV(t *testing.T, config []byte) *Hypervisor {
	t.Helper()
	h := newTestHypervisor(t)
	if err := h.Init(context.Background(), config); err != nil {
		t.Fatalf("Init(%s): %v", config, err)
	}
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return h
}

// agent connects to a VM's agent through its Addr.
func agent(t *testing.T, vm nesting.VirtualMachine) *guest.Client {
	t.Helper()
	sock, ok := strings.CutPrefix(vm.Addr, "unix://")
	if !ok || !filepath.IsAbs(sock) {
		t.Fatalf("Addr %q: want unix:// and an absolute path", vm.Addr)
	}
	c, err := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// run runs a shell command in the VM and returns its output.
func run(t *testing.T, c *guest.Client, script string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := c.Run(ctx, guest.RunOptions{Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/bin:/usr/bin"}, Output: &out, Detached: true})
	return out.String(), err
}

// qemuPID reads a VM's qemu.pid.
func qemuPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// ownsQEMU reports whether pid is a running QEMU of VM directory dir.
func ownsQEMU(pid int, dir string) bool {
	args, err := readCmdline("/proc", pid)
	if err != nil || !alive(pid) {
		return false
	}
	d, ok := vmDirOf(args, filepath.Dir(dir))
	return ok && d == dir
}

// TestNetwork boots a VM with user networking and one without a NIC and
// looks from inside: the first has eth0 at 10.0.2.15 and reaches a server
// on the host's loopback through 10.0.2.2; the second has no eth0. The
// first one is then deleted: its QEMU and its directory are gone.
func TestNetwork(t *testing.T) {
	imageDir := needBoot(t)
	ctx := context.Background()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(io.LimitReader(c, 100))
		got <- string(b)
	}()
	port := l.Addr().(*net.TCPAddr).Port

	state := stateDir(t)
	h := initHV(t, bootConfig(state, imageDir, `"network": "user"`))
	vm, err := h.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	dir := vmDir(state, vm.ID)
	for _, f := range []string{overlayFile, socketFile, portFile, consoleFile, pidFile, qemuLogFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the VM's %s: %v", f, err)
		}
	}
	c := agent(t, vm)
	out, err := run(t, c, fmt.Sprintf("hostname; ls /sys/class/net; ip -4 addr show dev eth0; echo hello-from-the-guest | nc 10.0.2.2 %d", port))
	if err != nil {
		t.Fatalf("in the guest: %v\n%s", err, out)
	}
	t.Logf("guest with user networking:\n%s", out)
	for _, want := range []string{vm.ID + "\n", "eth0", "10.0.2.15/24"} {
		if !strings.Contains(out, want) {
			t.Errorf("user networking: the guest's output lacks %q", want)
		}
	}
	select {
	case s := <-got:
		if s != "hello-from-the-guest\n" {
			t.Errorf("the host's server got %q from the guest", s)
		}
	case <-time.After(time.Minute):
		t.Error("the guest's connection to 10.0.2.2 never reached the host's loopback")
	}

	none := initHV(t, bootConfig(stateDir(t), imageDir, `"network": "none"`))
	vm2, err := none.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	out, err = run(t, agent(t, vm2), "ls /sys/class/net")
	if err != nil {
		t.Fatalf("in the guest: %v\n%s", err, out)
	}
	t.Logf("guest without network: /sys/class/net: %s", strings.Fields(out))
	if strings.Contains(out, "eth0") {
		t.Errorf("network none: the guest has eth0: %s", out)
	}

	// Delete removes the QEMU process and every file.
	pid := qemuPID(t, dir)
	if !ownsQEMU(pid, dir) {
		t.Fatalf("pid %d of qemu.pid is not the VM's QEMU", pid)
	}
	c.Close()
	if err := h.Delete(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	if ownsQEMU(pid, dir) {
		t.Errorf("the VM's QEMU (pid %d) still runs after Delete", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM's directory after Delete: %v", err)
	}
}

// TestQ35 boots the q35 machine: firmware, virtio-pci devices.
func TestQ35(t *testing.T) {
	imageDir := needBoot(t)
	h := initHV(t, bootConfig(stateDir(t), imageDir, `"machine": "q35"`, `"network": "none"`))
	start := time.Now()
	vm, err := h.Create(context.Background(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("q35 VM up in %v", time.Since(start).Round(time.Millisecond))
	out, err := run(t, agent(t, vm), "ls /sys/bus/pci/drivers/virtio-pci; grep -c ' /mnt/root \\| / ' /proc/mounts; ls /sys/block")
	if err != nil {
		t.Fatalf("in the guest: %v\n%s", err, out)
	}
	if !strings.Contains(out, "vda") {
		t.Errorf("q35: the guest has no vda:\n%s", out)
	}
	if !strings.Contains(out, "0000:00:") {
		t.Errorf("q35: no device bound to virtio-pci:\n%s", out)
	}
}

// TestRestartCleansUp leaves a VM of a hypervisor behind as a crashed
// daemon would (no Shutdown; the state directory's lock released, as the
// kernel does for a dead process): the next hypervisor's Init on the same
// state directory stops that QEMU and removes its directory.
func TestRestartCleansUp(t *testing.T) {
	imageDir := needBoot(t)
	state := stateDir(t)
	config := bootConfig(state, imageDir)
	first := newTestHypervisor(t)
	if err := first.Init(context.Background(), config); err != nil {
		t.Fatal(err)
	}
	vm, err := first.Create(context.Background(), testImage)
	if err != nil {
		t.Fatal(err)
	}
	dir := vmDir(state, vm.ID)
	pid := qemuPID(t, dir)

	// A second daemon on the same state directory is refused while the
	// first one lives.
	second := newTestHypervisor(t)
	if err := second.Init(context.Background(), config); err == nil || !strings.Contains(err.Error(), "is in use by another nesting daemon (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("Init on a state directory in use: %v", err)
	}

	first.abandon()
	if !ownsQEMU(pid, dir) {
		t.Fatalf("the abandoned VM's QEMU (pid %d) does not run", pid)
	}
	if err := second.Init(context.Background(), config); err != nil {
		t.Fatal(err)
	}
	defer second.Shutdown(context.Background())
	if ownsQEMU(pid, dir) {
		t.Errorf("the earlier daemon's QEMU (pid %d) still runs after Init", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the earlier daemon's VM directory after Init: %v", err)
	}
	if vms, _ := second.List(context.Background()); len(vms) != 0 {
		t.Errorf("List = %v, want nothing", vms)
	}
}

// abandon forgets every VM and releases the state directory without
// stopping anything: what a daemon that dies leaves behind.
func (h *Hypervisor) abandon() {
	h.mu.Lock()
	s := h.setup
	h.setup = nil
	for _, v := range h.vms {
		v.deleting.Store(true) // its end is the next daemon's doing
	}
	h.vms = map[string]*vm{}
	h.mu.Unlock()
	s.lock.Close()
}

// TestCreateEndsEarly stops Creates while QEMU boots: by ctx, and by
// Shutdown. Each Create returns an error with the cause and leaves no
// QEMU and no directory.
func TestCreateEndsEarly(t *testing.T) {
	imageDir := needBoot(t)
	for _, how := range []string{"ctx", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			state := stateDir(t)
			h := initHV(t, bootConfig(state, imageDir))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				vm  nesting.VirtualMachine
				err error
			}
			done := make(chan result, 1)
			go func() {
				vm, err := h.Create(ctx, testImage)
				done <- result{vm, err}
			}()
			// Wait until QEMU runs, then end the Create.
			dir, pid := waitForQEMU(t, filepath.Join(state, "vms"), done)
			var want error = context.Canceled
			if how == "ctx" {
				cancel()
			} else {
				want = errShutdown
				if err := h.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
				// Shutdown waited for the Create: nothing is left now.
				if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
					t.Errorf("after Shutdown returned, vms holds %v", ents)
				}
			}
			r := <-done
			if !errors.Is(r.err, want) {
				t.Errorf("Create = %+v, %v; want an error wrapping %v", r.vm, r.err, want)
			}
			t.Logf("Create: %v", r.err)
			if ownsQEMU(pid, dir) {
				t.Errorf("QEMU (pid %d) still runs", pid)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the VM's directory: %v", err)
			}
		})
	}
}

// waitForQEMU waits until a VM directory under vms has a qemu.pid naming a
// running QEMU. It fails the test if the Create ends first.
func waitForQEMU[T any](t *testing.T, vms string, done chan T) (dir string, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(vms)
		for _, e := range ents {
			d := filepath.Join(vms, e.Name())
			if b, err := os.ReadFile(filepath.Join(d, pidFile)); err == nil {
				if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && ownsQEMU(p, d) {
					return d, p
				}
			}
		}
		select {
		case r := <-done:
			t.Fatalf("Create ended before QEMU ran: %+v", r)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("QEMU never ran")
	return "", 0
}

// TestBootFailures: a QEMU that exits and one whose guest never answers.
// Create's error says what happened, with QEMU's output and the console,
// and nothing is left. A stand-in script plays QEMU.
func TestBootFailures(t *testing.T) {
	imageDir := needBoot(t)
	bin := t.TempDir()
	exits := filepath.Join(bin, "qemu-exits")
	os.WriteFile(exits, []byte("#!/bin/sh\necho 'qemu-exits: cannot do it' >&2\nexit 3\n"), 0o755)
	hangs := filepath.Join(bin, "qemu-hangs")
	os.WriteFile(hangs, []byte("#!/bin/sh\necho 'qemu-hangs: started'\nexec sleep 600\n"), 0o755)
	for _, c := range []struct {
		qemu, timeout string
		want          []string
		cause         any
	}{
		{exits, "5m", []string{"QEMU exited (exit status 3) before the guest agent answered", "qemu-exits: cannot do it", "the guest's console is empty"}, &errQEMUExited{}},
		{hangs, "2s", []string{"the guest agent did not answer within 2s (boot_timeout)", "qemu-hangs: started"}, &errBootTimeout{}},
	} {
		t.Run(filepath.Base(c.qemu), func(t *testing.T) {
			state := stateDir(t)
			h := initHV(t, bootConfig(state, imageDir, fmt.Sprintf(`"qemu": %q, "boot_timeout": %q`, c.qemu, c.timeout)))
			vm, err := h.Create(context.Background(), testImage)
			if err == nil {
				t.Fatalf("Create = %+v, want an error", vm)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q:\n%v", w, err)
				}
			}
			var be *bootError
			if !errors.As(err, &be) {
				t.Errorf("%v: not a *bootError", err)
			}
			switch c.cause.(type) {
			case *errQEMUExited:
				var e errQEMUExited
				if !errors.As(err, &e) {
					t.Errorf("%v: does not wrap errQEMUExited", err)
				}
			case *errBootTimeout:
				var e errBootTimeout
				if !errors.As(err, &e) {
					t.Errorf("%v: does not wrap errBootTimeout", err)
				}
			}
			if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
				t.Errorf("after a failed Create, vms holds %v", ents)
			}
			if vms, _ := h.List(context.Background()); len(vms) != 0 {
				t.Errorf("List = %v", vms)
			}
		})
	}
}

// TestInitErrors: what Init refuses, with errors naming the culprit.
func TestInitErrors(t *testing.T) {
	h := New(testLogger(t))
	ctx := context.Background()
	state := stateDir(t)
	for _, c := range []struct{ config, want string }{
		{`{"bogus": 1}`, `unknown key "bogus"`},
		{fmt.Sprintf(`{"state_dir": %q, "qemu": "no-such-qemu-x"}`, state), `qemu: exec: "no-such-qemu-x": executable file not found in $PATH (Debian: apt-get install qemu-system-x86)`},
		{fmt.Sprintf(`{"state_dir": %q, "qemu": "/bin/true", "qemu_img": "/nonexistent/qemu-img"}`, state), "qemu_img: exec: \"/nonexistent/qemu-img\""},
	} {
		if err := h.Init(ctx, []byte(c.config)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Init(%s) = %v, want an error with %q", c.config, err, c.want)
		}
	}
	// A refused config leaves it uninitialized.
	if _, err := h.Create(ctx, testImage); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("Create after refused Inits: %v, want ErrNotInitialized", err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestBuildMissingFalse: with build_missing false an image that is not in
// the store is an error that says how to build it; a built one boots
// (TestConformance built the test image in the shared store, or this
// builds it).
func TestBuildMissingFalse(t *testing.T) {
	imageDir := needBoot(t)
	h := initHV(t, bootConfig(stateDir(t), imageDir, `"build_missing": false`, `"qemu": "/bin/false"`))
	_, err := h.Create(context.Background(), "berth-test/never-built:1")
	if err == nil || !strings.Contains(err.Error(), "run `berth image build berth-test/never-built:1` on this host first") {
		t.Errorf("Create of an image not built: %v", err)
	}
	if _, err := storeFor(imageDir).Build(context.Background(), testImage, vmimage.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	// The image is found: Create gets as far as QEMU (here /bin/false).
	_, err = h.Create(context.Background(), testImage)
	var e errQEMUExited
	if !errors.As(err, &e) {
		t.Errorf("Create of a built image with QEMU /bin/false: %v, want it to get to starting QEMU", err)
	}
}
