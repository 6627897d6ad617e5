package qemu

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestVMDirOf(t *testing.T) {
	const vms = "/var/lib/berth/nesting/vms"
	own := func(path string) []string {
		return []string{"qemu-system-x86_64", "-M", "microvm", "-chardev", "socket,id=agent,path=" + path + ",server=on,wait=off", "-no-reboot"}
	}
	for _, c := range []struct {
		name string
		args []string
		dir  string
	}{
		{"a VM's QEMU", own(vms + "/nesting-abc12345/port.sock"), vms + "/nesting-abc12345"},
		{"the KVM probe's QEMU", own(vms + "/probe-abc12345/port.sock"), vms + "/probe-abc12345"},
		{"the chardev without options", []string{"qemu", "-chardev", "socket,id=agent,path=" + vms + "/x/port.sock"}, vms + "/x"},
		{"another state directory", own("/srv/other/vms/nesting-abc12345/port.sock"), ""},
		{"deeper than a VM directory", own(vms + "/nesting-abc12345/sub/port.sock"), ""},
		{"the vms directory itself", own(vms + "/port.sock"), ""},
		{"another socket", own(vms + "/nesting-abc12345/monitor.sock"), ""},
		{"a path that climbs out", own(vms + "/../vms/nesting-abc12345/port.sock"), ""},
		{"a relative path", own("vms/nesting-abc12345/port.sock"), ""},
		{"another chardev id", []string{"qemu", "-chardev", "socket,id=mon,path=" + vms + "/nesting-abc12345/port.sock"}, ""},
		{"a tail of the console", []string{"tail", "-f", vms + "/nesting-abc12345/console.log"}, ""},
		{"the path as a plain argument", []string{"cat", "socket,id=agent,path=" + vms + "/nesting-abc12345/port.sock"}, ""},
		{"-chardev last", []string{"qemu", "-chardev"}, ""},
		{"nothing", nil, ""},
	} {
		dir, ok := vmDirOf(c.args, vms)
		if dir != c.dir || ok != (c.dir != "") {
			t.Errorf("%s: vmDirOf(%q) = %q %v, want %q", c.name, c.args, dir, ok, c.dir)
		}
	}
}

func TestFindLeftovers(t *testing.T) {
	proc := t.TempDir()
	vms := "/state/vms"
	write := func(pid string, args ...string) {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		b := []byte(strings.Join(args, "\x00"))
		if len(args) > 0 {
			b = append(b, 0)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cmdline"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vm := func(id string) []string {
		return argv(vmSpec{id: id, dir: vms + "/" + id, machine: MachineMicroVM, accel: AccelTCG, cpus: 1, memoryMB: 256,
			network: NetworkUser, kernel: "/k", initrd: "/i", disk: vms + "/" + id + "/overlay.qcow2"})
	}
	write("1001", append([]string{"/usr/bin/qemu-system-x86_64"}, vm("nesting-aaaaaaaa")...)...)
	write("1002", "tail", "-f", vms+"/nesting-aaaaaaaa/console.log")
	write("1003") // a kernel thread: empty command line
	write("99", append([]string{"qemu-system-x86_64"}, vm("nesting-bbbbbbbb")...)...)
	write("1004", append([]string{"qemu-system-x86_64"}, argv(vmSpec{id: "nesting-cccccccc", dir: "/other/vms/nesting-cccccccc",
		machine: MachineQ35, accel: AccelKVM, cpus: 1, memoryMB: 256, network: NetworkNone, kernel: "/k", initrd: "/i"})...)...)
	write("self", "x")
	write("2000", append([]string{"qemu-system-x86_64"}, vm("nesting-dddddddd")...)...)
	os.MkdirAll(filepath.Join(proc, "1005"), 0o755) // no cmdline (gone meanwhile)
	got, err := findLeftovers(proc, vms, 2000)
	if err != nil {
		t.Fatal(err)
	}
	want := []leftover{{pid: 99, dir: vms + "/nesting-bbbbbbbb"}, {pid: 1001, dir: vms + "/nesting-aaaaaaaa"}}
	if !slices.Equal(got, want) {
		t.Errorf("findLeftovers = %+v, want %+v (pid 2000 is this process)", got, want)
	}
	if _, err := findLeftovers(filepath.Join(proc, "missing"), vms, 0); err == nil {
		t.Error("findLeftovers of a missing proc directory: no error")
	}
}

// sleeper starts the test binary as a stand-in leftover with args; it
// returns once the process runs.
func sleeper(t *testing.T, mode string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), sleeperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("sleeper: %q %v", line, err)
	}
	return cmd
}

// alive reports whether cmd's process still runs (not exited; a zombie
// counts as exited).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// TestCleanLeftovers runs cleanup against real processes that stand in
// for an earlier daemon's QEMUs (test binaries whose command lines name VM
// directories): those of this state directory are stopped, also one that
// ignores SIGTERM, and their directories removed; a process of another
// state directory and one that merely names a VM's file survive.
func TestCleanLeftovers(t *testing.T) {
	state := stateDir(t)
	other := stateDir(t)
	vms := filepath.Join(state, "vms")
	dirA, dirB, dirC := filepath.Join(vms, "nesting-aaaaaaaa"), filepath.Join(vms, "nesting-bbbbbbbb"), filepath.Join(vms, "probe-cccccccc")
	for _, d := range []string{dirA, dirB, dirC} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, consoleFile), []byte("boot\n"), 0o600)
	}
	leftA := sleeper(t, "plain", "-chardev", agentChardev(dirA))
	leftB := sleeper(t, "stubborn", "-serial", "file:"+dirB+"/console.log", "-chardev", agentChardev(dirB))
	unrelated := sleeper(t, "plain", "-chardev", agentChardev(filepath.Join(other, "vms", "nesting-aaaaaaaa")))
	bystander := sleeper(t, "plain", "tail", "-f", filepath.Join(dirA, consoleFile))

	h := New(testLogger(t))
	if err := h.cleanLeftovers(vms); err != nil {
		t.Fatalf("cleanLeftovers: %v", err)
	}
	for name, cmd := range map[string]*exec.Cmd{"leftover": leftA, "leftover ignoring SIGTERM": leftB} {
		if alive(cmd.Process.Pid) {
			t.Errorf("the %s (pid %d) still runs", name, cmd.Process.Pid)
		}
	}
	for name, cmd := range map[string]*exec.Cmd{"process of another state directory": unrelated, "process naming a VM's console": bystander} {
		if !alive(cmd.Process.Pid) {
			t.Errorf("the %s (pid %d) was stopped", name, cmd.Process.Pid)
		}
	}
	if err := leftA.Wait(); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Errorf("leftover: %v, want it ended by SIGTERM", err)
	}
	if err := leftB.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("leftover ignoring SIGTERM: %v, want it ended by SIGKILL", err)
	}
	if ents, _ := os.ReadDir(vms); len(ents) != 0 {
		t.Errorf("%s still holds %v", vms, ents)
	}
	// A pid that no longer is (or is another process now) is left alone.
	if err := terminate("/proc", vms, leftover{pid: leftA.Process.Pid, dir: dirA}, deleteGrace); err != nil {
		t.Errorf("terminating a reaped process: %v", err)
	}
	if err := terminate("/proc", vms, leftover{pid: bystander.Process.Pid, dir: dirA}, deleteGrace); err != nil || !alive(bystander.Process.Pid) {
		t.Errorf("terminate of a pid whose command line is not a VM's: %v, alive %v", err, alive(bystander.Process.Pid))
	}
}
