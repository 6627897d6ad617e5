//go:build linux

package slotcgroup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
)

// The tests here run the scripts as root against this machine's real
// cgroups: every test makes its own parent cgroup berth-test-<pid>-<random>
// (template <parent>/slot-${slot}) and removes it, killing what is left in
// it, when it ends.

const sysRoot = "/sys/fs/cgroup"

func TestRealV1(t *testing.T) {
	testenv.Root(t)
	if Detect(sysRoot) == V2 {
		t.Skip("this host is cgroup v2 only: TestRealV2 runs the same checks on it")
	}
	for _, c := range []string{"memory", "pids", "freezer", "cpu"} {
		if fi, err := os.Stat(filepath.Join(sysRoot, c)); err != nil || !fi.IsDir() {
			testenv.Missing(t, "cgroup v1 hierarchy %s/%s is not mounted", sysRoot, c)
		}
	}
	if v := Detect(sysRoot); v != V1 {
		testenv.Missing(t, "%s is cgroup %v, not v1", sysRoot, v)
	}
	realSuite(t, host{root: sysRoot, v: V1})
}

func TestRealV2(t *testing.T) {
	testenv.Root(t)
	var seen []string
	for _, root := range []string{sysRoot, filepath.Join(sysRoot, "unified")} {
		b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err != nil {
			continue
		}
		ctrls := strings.Fields(string(b))
		seen = append(seen, fmt.Sprintf("%s offers %q", root, ctrls))
		if slices.Contains(ctrls, "memory") && slices.Contains(ctrls, "pids") {
			h := host{root: root, v: V2, cpu: slices.Contains(ctrls, "cpu")}
			if root != sysRoot {
				h.env = root
			}
			realSuite(t, h)
			return
		}
	}
	if len(seen) == 0 {
		t.Skip("no cgroup v2 mount on this host")
	}
	t.Skipf("cgroup v2 has no memory/pids controllers on this host: they are bound to the v1 hierarchy (%s)", strings.Join(seen, "; "))
}

// TestRealV2Kill runs the kill test on whatever cgroup v2 mount this host
// has, also one without controllers (a hybrid host's unified hierarchy):
// creating, entering, cgroup.kill and removing need none.
func TestRealV2Kill(t *testing.T) {
	testenv.Root(t)
	for _, root := range []string{sysRoot, filepath.Join(sysRoot, "unified")} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
			continue
		}
		h := host{root: root, v: V2}
		if root != sysRoot {
			h.env = root
		}
		h.testKill(t)
		return
	}
	t.Skip("no cgroup v2 mount on this host")
}

// host is a real cgroup tree.
type host struct {
	root string  // where the hierarchy is mounted
	v    Version // V1 or V2
	env  string  // BERTH_CGROUP_ROOT for the scripts ("": unset, the default)
	cpu  bool    // v2: the cpu controller is offered
}

func realSuite(t *testing.T, h host) {
	t.Run("memory", h.testMemory)
	t.Run("pids", h.testPids)
	t.Run("cpu", h.testCPU)
	t.Run("kill", h.testKill)
	t.Run("reset", h.testReset)
}

var binSh = shell{name: "sh", argv: []string{"/bin/sh", "-c"}}

// must runs script with /bin/sh and fails unless it succeeds quietly.
func (h host) must(t *testing.T, script string) string {
	t.Helper()
	return mustRun(t, binSh, h.env, script)
}

// slots makes this test's parent cgroup and returns the paths of slots 0
// and 1 in it.
func (h host) slots(t *testing.T) (string, string) {
	t.Helper()
	parent := fmt.Sprintf("berth-test-%d-%08x", os.Getpid(), rand.Uint32())
	t.Cleanup(func() {
		kill := run(t, binSh, h.env, KillScript(parent))
		remove := run(t, binSh, h.env, RemoveScript(parent))
		if kill.code != 0 || remove.code != 0 {
			t.Errorf("cleanup: KillScript: %+v; RemoveScript: %+v", kill, remove)
			h.scrub(t, parent) // the scripts are broken: leave no trace anyway
		}
		for _, d := range h.dirs(parent) {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cleanup: %s left behind (%v)", d, err)
			}
		}
	})
	template := parent + "/slot-${slot}"
	p0, err := Expand(template, 0)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := Expand(template, 1)
	if err != nil {
		t.Fatal(err)
	}
	return p0, p1
}

// scrub removes the cgroup path from every hierarchy without the scripts:
// it thaws every freezer cgroup in it, kills every process and removes the
// directories, deepest first.
func (h host) scrub(t *testing.T, path string) {
	var dirs []string // parents before children
	for _, top := range h.dirs(path) {
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED\n"), 0)
	}
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, _ := strconv.Atoi(f); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		for i := 0; i < 50 && os.Remove(d) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// dirs returns the directories of path in every hierarchy.
func (h host) dirs(path string) []string {
	if h.v == V2 {
		return []string{filepath.Join(h.root, path)}
	}
	var dirs []string
	entries, _ := os.ReadDir(h.root)
	for _, e := range entries {
		dirs = append(dirs, filepath.Join(h.root, e.Name(), path))
	}
	return dirs
}

// file returns the path of a controller's file of the cgroup path.
func (h host) file(controller, path, name string) string {
	if h.v == V2 {
		return filepath.Join(h.root, path, name)
	}
	if controller == "cpu" {
		if _, err := os.Stat(filepath.Join(h.root, "cpu")); err != nil {
			controller = "cpu,cpuacct"
		}
	}
	return filepath.Join(h.root, controller, path, name)
}

// oomKills runs OOMKillsScript.
func (h host) oomKills(t *testing.T, path string) int {
	t.Helper()
	out := h.must(t, OOMKillsScript(path))
	n, err := strconv.Atoi(strings.TrimSuffix(out, "\n"))
	if err != nil || !strings.HasSuffix(out, "\n") {
		t.Fatalf("OOMKillsScript printed %q", out)
	}
	return n
}

// inCgroup reports whether pid is in the cgroup path (of the memory
// hierarchy on v1).
func (h host) inCgroup(pid int, path string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[2] != "/"+path {
			continue
		}
		if h.v == V2 && parts[0] == "0" && parts[1] == "" {
			return true
		}
		if h.v == V1 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return true
		}
	}
	return false
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// proc is a shell the test started in the background.
type proc struct {
	pid  int
	done chan struct{} // closed when it has ended and been reaped
	err  error         // its end, once done is closed
}

// start starts /bin/sh -c script in the background; it is killed when the
// test ends.
func (h host) start(t *testing.T, script string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = environ(h.env, env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second): // frozen, say: do not hang the run
			t.Errorf("cleanup: process %d does not end", p.pid)
		}
	})
	return p
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

func killedBy(err error) syscall.Signal {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}

// testMemory: a process of slot 0 that needs more than the slot's memory
// is OOM-killed and counted, while slot 1's process lives on.
func (h host) testMemory(t *testing.T) {
	p0, p1 := h.slots(t)
	h.must(t, SetupScript(p0, Limits{Memory: "64m"}))
	h.must(t, SetupScript(p1, Limits{}))

	neighbour := h.start(t, EnterScript(p1)+"exec sleep 300\n")
	eventually(t, "the neighbour in slot 1", func() bool { return h.inCgroup(neighbour.pid, p1) })
	before := h.oomKills(t, p0)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	hog := exec.CommandContext(ctx, "/bin/sh", "-c", EnterScript(p0)+"exec "+shq(exe)+"\n")
	hog.Env = environ(h.env, roleEnv+"=hog")
	out, err := hog.Output()
	if sig := killedBy(err); sig != syscall.SIGKILL || strings.Contains(string(out), "survived") {
		t.Fatalf("a %d MiB process in a 64m slot: %v (signal %v), output %q; want it killed by SIGKILL", hogBytes>>20, err, sig, out)
	}
	if after := h.oomKills(t, p0); after < before+1 {
		t.Errorf("OOM kills of slot 0: %d before, %d after; want one more", before, after)
	}

	select {
	case <-neighbour.done:
		t.Fatalf("the neighbour in slot 1 ended: %v", neighbour.err)
	default:
	}
	if !alive(neighbour.pid) || !h.inCgroup(neighbour.pid, p1) {
		t.Error("the neighbour in slot 1 is gone or moved")
	}
	if n := h.oomKills(t, p1); n != 0 {
		t.Errorf("slot 1 counts %d OOM kills", n)
	}
}

// testPids: with pids 20, a stage cannot start 50 processes.
func (h host) testPids(t *testing.T) {
	p0, _ := h.slots(t)
	h.must(t, SetupScript(p0, Limits{Pids: 20}))
	if got := read(t, h.file("pids", p0, "pids.max")); got != "20\n" {
		t.Fatalf("pids.max = %q", got)
	}
	pidfile := filepath.Join(t.TempDir(), "pids")
	r := run(t, shell{name: "sh", argv: binSh.argv, env: []string{"PIDFILE=" + pidfile}}, h.env, EnterScript(p0)+`i=0
while [ $i -lt 50 ]; do
	sleep 300 >/dev/null 2>&1 &
	echo $! >> "$PIDFILE"
	i=$((i + 1))
done
echo all started
`)
	started := strings.Fields(read(t, pidfile))
	t.Logf("started %d sleeps; exit %d; stderr %q", len(started), r.code, r.stderr)
	if len(started) == 0 || len(started) > 19 {
		t.Errorf("started %d processes besides the shell, want 1…19", len(started))
	}
	if strings.Contains(r.stdout, "all started") || !strings.Contains(strings.ToLower(r.stderr), "fork") {
		t.Errorf("the stage did not fail to fork: %+v", r)
	}
	procs := strings.Fields(read(t, h.file("pids", p0, "cgroup.procs")))
	if len(procs) != len(started) {
		t.Errorf("the slot holds %d processes, want the %d sleeps", len(procs), len(started))
	}
}

// testCPU: cpus 0.5 is a quota of 50 ms per 100 ms, and it throttles.
func (h host) testCPU(t *testing.T) {
	if h.v == V2 && !h.cpu {
		t.Skip("cgroup v2 offers no cpu controller here")
	}
	p0, _ := h.slots(t)
	h.must(t, SetupScript(p0, Limits{CPUs: "0.5"}))
	if h.v == V2 {
		if got := read(t, h.file("cpu", p0, "cpu.max")); got != "50000 100000\n" {
			t.Errorf("cpu.max = %q", got)
		}
	} else {
		if got := read(t, h.file("cpu", p0, "cpu.cfs_quota_us")); got != "50000\n" {
			t.Errorf("cpu.cfs_quota_us = %q", got)
		}
		if got := read(t, h.file("cpu", p0, "cpu.cfs_period_us")); got != "100000\n" {
			t.Errorf("cpu.cfs_period_us = %q", got)
		}
	}
	// A busy loop for about a second (not timeout(1): busybox's
	// differs from coreutils' in status and messages).
	h.must(t, EnterScript(p0)+"(sh -c 'while :; do :; done' & pid=$!; sleep 1; kill -9 $pid; wait $pid) 2>/dev/null\ntrue\n")
	var throttled int
	for line := range strings.SplitSeq(read(t, h.file("cpu", p0, "cpu.stat")), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			throttled, _ = strconv.Atoi(v)
		}
	}
	if throttled == 0 {
		t.Errorf("a busy loop of 1 s was never throttled at 0.5 CPUs: cpu.stat %q", read(t, h.file("cpu", p0, "cpu.stat")))
	}
}

// testKill: processes that left the stage's process group and session
// (setsid, a double-forked daemon, one ignoring signals) all die, and the
// cgroup is empty afterwards.
func (h host) testKill(t *testing.T) {
	p0, _ := h.slots(t)
	h.must(t, SetupScript(p0, Limits{}))
	dir := t.TempDir()
	stage := h.start(t, EnterScript(p0)+`
setsid sh -c 'echo $$ > "$D/setsid.tmp" && mv "$D/setsid.tmp" "$D/setsid"; exec sleep 1000' &
( setsid sh -c 'sleep 1000 & echo $! > "$D/daemon.tmp" && mv "$D/daemon.tmp" "$D/daemon"' & )
( trap '' HUP INT TERM; exec sleep 1000 ) &
echo $! > "$D/bg.tmp" && mv "$D/bg.tmp" "$D/bg"
sleep 1000
`, "D="+dir)
	pids := map[string]int{"stage": stage.pid}
	for _, name := range []string{"setsid", "daemon", "bg"} {
		eventually(t, "the stage's "+name+" process", func() bool {
			b, err := os.ReadFile(filepath.Join(dir, name))
			pids[name], _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil
		})
	}
	for name, pid := range pids {
		if !alive(pid) || !h.inCgroup(pid, p0) {
			t.Fatalf("before the kill: %s process %d is not running in the slot", name, pid)
		}
	}

	h.must(t, KillScript(p0))
	select {
	case <-stage.done:
		if sig := killedBy(stage.err); sig != syscall.SIGKILL {
			t.Errorf("the stage ended with %v, want SIGKILL", stage.err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the stage's shell is still running")
	}
	for name, pid := range pids {
		if alive(pid) {
			t.Errorf("after the kill: %s process %d is alive", name, pid)
		}
	}
	for _, d := range h.dirs(p0) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err == nil && len(b) > 0 {
			t.Errorf("%s/cgroup.procs after the kill: %q", d, b)
		}
	}
	// Killing again finds nothing to do.
	h.must(t, KillScript(p0))
}

// testReset: setting up a slot again changes its limits, up and down,
// and zero limits lift them.
func (h host) testReset(t *testing.T) {
	p0, _ := h.slots(t)
	memFile, memswFile := "memory.max", ""
	unlimitedMem := "max\n"
	if h.v == V1 {
		memFile = "memory.limit_in_bytes"
		unlimitedMem = read(t, filepath.Join(h.root, "memory", "memory.limit_in_bytes"))
		if _, err := os.Stat(filepath.Join(h.root, "memory", "memory.memsw.limit_in_bytes")); err == nil {
			memswFile = "memory.memsw.limit_in_bytes"
		}
	}
	wantMem := func(want string) {
		t.Helper()
		if got := read(t, h.file("memory", p0, memFile)); got != want {
			t.Errorf("%s = %q, want %q", memFile, got, want)
		}
		if memswFile != "" {
			if got := read(t, h.file("memory", p0, memswFile)); got != want {
				t.Errorf("%s = %q, want %q", memswFile, got, want)
			}
		}
	}
	limits := Limits{Memory: "64m", Pids: 20}
	if h.v == V1 || h.cpu {
		limits.CPUs = "0.5"
	}
	h.must(t, SetupScript(p0, limits))
	wantMem("67108864\n")
	h.must(t, SetupScript(p0, Limits{Memory: "256m"}))
	wantMem("268435456\n")
	h.must(t, SetupScript(p0, Limits{Memory: "32m"}))
	wantMem("33554432\n")
	h.must(t, SetupScript(p0, Limits{}))
	wantMem(unlimitedMem)
	if got := read(t, h.file("pids", p0, "pids.max")); got != "max\n" {
		t.Errorf("pids.max = %q", got)
	}
	switch {
	case h.v == V1:
		if got := read(t, h.file("cpu", p0, "cpu.cfs_quota_us")); got != "-1\n" {
			t.Errorf("cpu.cfs_quota_us = %q", got)
		}
	case h.cpu:
		if got := read(t, h.file("cpu", p0, "cpu.max")); got != "max 100000\n" {
			t.Errorf("cpu.max = %q", got)
		}
	}
}
