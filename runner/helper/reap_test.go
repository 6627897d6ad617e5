package helper

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/internal/testenv"
)

// reapChildEnv makes the test binary act as "berth helper reap" with the
// arguments in the variable (space-separated), so a test can exec it from
// inside a marked process group, as the ssh executor's stage wrapper does.
const reapChildEnv = "BERTH_TEST_REAP_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(reapChildEnv); ok {
		os.Exit(reapMain(strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in    string
		state byte
		pgid  int
		ok    bool
	}{
		{"42 (sleep) S 1 42 42 0 -1", 'S', 42, true},
		{"42 (a b) c)) Z 7 99 99 0", 'Z', 99, true},
		{"42 (x) R 1", 0, 0, false},
		{"garbage", 0, 0, false},
		{"42 (x) RR 1 2 3", 0, 0, false},
		{"42 (x) S 1 notanumber 3", 0, 0, false},
	} {
		st, pg, ok := parseStat([]byte(tc.in))
		if st != tc.state || pg != tc.pgid || ok != tc.ok {
			t.Errorf("parseStat(%q) = %c %d %v, want %c %d %v", tc.in, st, pg, ok, tc.state, tc.pgid, tc.ok)
		}
	}
}

func TestReapOptionsRefused(t *testing.T) {
	for name, o := range map[string]ReapOptions{
		"nothing":      {Signal: syscall.SIGKILL},
		"both":         {Marker: strings.Repeat("m", 32), Scope: "scope-long", Signal: syscall.SIGKILL},
		"short marker": {Marker: "short", Signal: syscall.SIGKILL},
		"short scope":  {Scope: "abc", Signal: syscall.SIGKILL},
	} {
		if _, err := Reap(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	var out, errb bytes.Buffer
	if code := reapMain([]string{"--marker", strings.Repeat("m", 32), "--signal", "HUP"}, &out, &errb); code != 2 {
		t.Errorf("--signal HUP: exit %d, want 2", code)
	}
}

func needProc(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc: ", err)
	}
}

// startGroup starts script with sh as the leader of a new process group,
// with env added to the environment, and returns the pids it prints (one
// per line) and the command.
func startGroup(t *testing.T, script string, n int, env ...string) (*exec.Cmd, []int) {
	t.Helper()
	c := exec.Command("sh", "-c", script)
	c.Env = append(os.Environ(), env...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Skip("cannot start sh: ", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		c.Wait()
	})
	var pids []int
	sc := bufio.NewScanner(out)
	for len(pids) < n && sc.Scan() {
		p, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
		if err != nil {
			t.Fatalf("script printed %q", sc.Text())
		}
		pids = append(pids, p)
	}
	if len(pids) < n {
		t.Fatalf("script printed %d pids, want %d", len(pids), n)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return c, pids
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	st, _, ok := parseStat(b)
	return ok && st != 'Z' && st != 'X'
}

func waitDead(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range pids {
		for alive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d survived", p)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestReapKillsMarkedAndTheirGroups: a marked process, an unmarked one in
// its group (env -i) and a marked one that left with setsid all go; a
// process of another stage stays.
func TestReapKillsMarkedAndTheirGroups(t *testing.T) {
	needProc(t)
	testenv.LookPath(t, "setsid")
	m := reap.NewMarker()
	script := `sleep 1000 & echo $!
env -i sleep 1000 & echo $!
setsid sleep 1000 & echo $!
wait`
	_, pids := startGroup(t, script, 3, reap.Env(m))
	_, other := startGroup(t, "sleep 1000 & echo $!; wait", 1, reap.Env(reap.NewMarker()))

	n, err := Reap(ReapOptions{Marker: m, Signal: syscall.SIGKILL})
	if err != nil {
		t.Fatal(err)
	}
	// The group's sh leader, its two sleeps and the escaped sleep.
	if n < 4 {
		t.Errorf("Reap signalled %d processes, want at least 4", n)
	}
	waitDead(t, pids...)
	if !alive(other[0]) {
		t.Fatal("a process of another stage was killed")
	}
}

// TestReapSparesItselfInAMarkedGroup: a stage wrapper execs the helper
// as its last step; the helper then is a marked member of the marked
// group and must kill the rest of the group, not itself.
func TestReapSparesItselfInAMarkedGroup(t *testing.T) {
	needProc(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := reap.NewMarker()
	c := exec.Command("sh", "-c", `sleep 1000 & echo $!
env -i sleep 1000 & echo $!
exec "$0"`, self)
	c.Env = append(os.Environ(), reap.Env(m), reapChildEnv+"=--marker "+m+" --signal KILL")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	done := make(chan error, 1)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-c.Process.Pid, syscall.SIGKILL) })
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the helper did not exit 0: %v\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("helper did not finish")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || lines[2] != "signalled 2 processes" {
		t.Fatalf("output %q, want two pids and \"signalled 2 processes\"", out.String())
	}
	for _, l := range lines[:2] {
		p, _ := strconv.Atoi(l)
		waitDead(t, p)
	}
}

func TestReapScope(t *testing.T) {
	needProc(t)
	scope := "s_0123456789ab.runnertok"
	_, a := startGroup(t, "sleep 1000 & echo $!; wait", 1, reap.Env(reap.NewScopedMarker(scope)))
	_, b := startGroup(t, "sleep 1000 & echo $!; wait", 1, reap.Env(reap.NewScopedMarker(scope+".job1")))
	_, other := startGroup(t, "sleep 1000 & echo $!; wait", 1, reap.Env(reap.NewScopedMarker(scope+"x")))
	var out, errb bytes.Buffer
	if code := reapMain([]string{"--scope", scope, "--signal", "KILL"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	waitDead(t, a[0], b[0])
	if !alive(other[0]) {
		t.Fatal("a process of another scope was killed")
	}
}
