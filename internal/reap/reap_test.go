package reap

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestHasEntry(t *testing.T) {
	want := []byte("BERTH_STAGE_MARKER=abc")
	for env, ok := range map[string]bool{
		"A=1\x00BERTH_STAGE_MARKER=abc\x00": true,
		"BERTH_STAGE_MARKER=abc":            true,
		"BERTH_STAGE_MARKER=abcd\x00":       false,
		"X_BERTH_STAGE_MARKER=abc\x00":      false,
		"":                                  false,
	} {
		if HasEntry([]byte(env), want, false) != ok {
			t.Errorf("HasEntry(%q) = %v", env, !ok)
		}
	}
	prefix := []byte("BERTH_STAGE_MARKER=scope.")
	for env, ok := range map[string]bool{
		"A=1\x00BERTH_STAGE_MARKER=scope.abc\x00": true,
		"BERTH_STAGE_MARKER=scope.":               true,
		"BERTH_STAGE_MARKER=scopex.abc":           false,
		"X_BERTH_STAGE_MARKER=scope.abc":          false,
		"":                                        false,
	} {
		if HasEntry([]byte(env), prefix, true) != ok {
			t.Errorf("HasEntry(%q, prefix) = %v", env, !ok)
		}
	}
}

// execed waits until c's process runs its own program: between fork and
// exec /proc shows the parent's environment, without the marker.
func execed(t *testing.T, c *exec.Cmd, marker string) {
	t.Helper()
	want := []byte(Env(marker))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", c.Process.Pid))
		if HasEntry(env, want, false) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never showed its marker", c.Process.Pid)
		}
	}
}

func TestSignalFindsEscapedProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc: ", err)
	}
	m, om := NewMarker(), NewMarker()
	other := exec.Command("sleep", "1000")
	other.Env = append(os.Environ(), Env(om))
	marked := exec.Command("setsid", "sleep", "1000")
	marked.Env = append(os.Environ(), Env(m))
	for _, c := range []*exec.Cmd{other, marked} {
		if err := c.Start(); err != nil {
			t.Skip("cannot start sleep/setsid: ", err)
		}
		defer c.Process.Kill()
	}
	execed(t, other, om)
	execed(t, marked, m)
	n, err := Signal(m, syscall.SIGKILL)
	if err != nil || n != 1 {
		t.Fatalf("Signal: %d %v, want 1 process", n, err)
	}
	done := make(chan error, 1)
	go func() { done <- marked.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the marked process survived")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process with another marker was signalled: %v", err)
	}
	if _, err := Signal("short", syscall.SIGKILL); err == nil {
		t.Error("a short marker was accepted")
	}
}

func TestSignalScope(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc: ", err)
	}
	scope := "s_0123456789ab.runnertok"
	var cmds []*exec.Cmd
	var markers []string
	for _, sc := range []string{scope, scope, scope + "x"} {
		m := NewScopedMarker(sc)
		c := exec.Command("setsid", "sleep", "1000")
		c.Env = append(os.Environ(), Env(m))
		cmds, markers = append(cmds, c), append(markers, m)
	}
	other := cmds[2]
	for i, c := range cmds {
		if err := c.Start(); err != nil {
			t.Skip("cannot start sleep/setsid: ", err)
		}
		defer c.Process.Kill()
		go c.Wait()
		execed(t, c, markers[i])
	}
	if n, err := SignalScope(scope, syscall.SIGKILL); err != nil || n != 2 {
		t.Fatalf("SignalScope: %d %v, want the 2 processes of the scope", n, err)
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process of another scope was signalled: %v", err)
	}
	if _, err := SignalScope("short", syscall.SIGKILL); err == nil {
		t.Error("a short scope was accepted")
	}
}

// TestEnvironmentMidExec: a process whose environment reads empty for a
// moment (as during an execve) is still found once it shows again; kernel
// threads and zombies, whose environment stays empty, are not waited for;
// a block larger than the first buffer is read whole.
func TestEnvironmentMidExec(t *testing.T) {
	c := exec.Command("sleep", "1000")
	if err := c.Start(); err != nil {
		t.Skip("cannot start sleep: ", err)
	}
	defer c.Process.Kill()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()

	proc := t.TempDir()
	dir := fmt.Sprintf("%s/%d", proc, c.Process.Pid)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(dir+"/"+name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const marker = "0123456789abcdef0123"
	write("stat", fmt.Sprintf("%d (odd ) name) R 1 1 1 0 -1 4194560 0 0", c.Process.Pid))
	write("environ", "")
	go func() {
		time.Sleep(2 * time.Millisecond)
		// Written in place of the empty file as the kernel fills it in.
		tmp := dir + "/environ.tmp"
		big := strings.Repeat("B", 100<<10) // past the first buffer
		_ = os.WriteFile(tmp, []byte("A="+big+"\x00"+Env(marker)+"\x00"), 0o644)
		_ = os.Rename(tmp, dir+"/environ")
	}()
	n, err := signal(proc, []byte(Env(marker)), syscall.SIGKILL, false)
	if err != nil || n != 1 {
		t.Fatalf("signal: %d %v, want the process whose environment showed late", n, err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process survived")
	}

	for stat, want := range map[string]bool{
		"7 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0": false, // PF_KTHREAD
		"7 (sh) Z 1 7 7 0 -1 4194560 0 0":           false,
		"7 (sh) R 1 7 7 0 -1 4194560 0 0":           true,
		"7 (sh) R 1":                                false,
	} {
		write("stat", stat)
		if got := mayBeExecing(dir); got != want {
			t.Errorf("mayBeExecing(%q) = %v, want %v", stat, got, want)
		}
	}
}
