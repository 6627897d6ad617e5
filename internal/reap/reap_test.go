package reap

import (
	"fmt"
	"os"
	"os/exec"
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
		if hasEntry([]byte(env), want, false) != ok {
			t.Errorf("hasEntry(%q) = %v", env, !ok)
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
		if hasEntry(env, want, false) {
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
