package reap

import (
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

func TestSignalFindsEscapedProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc: ", err)
	}
	m := NewMarker()
	other := exec.Command("sleep", "1000")
	other.Env = append(os.Environ(), Env(NewMarker()))
	marked := exec.Command("setsid", "sleep", "1000")
	marked.Env = append(os.Environ(), Env(m))
	for _, c := range []*exec.Cmd{other, marked} {
		if err := c.Start(); err != nil {
			t.Skip("cannot start sleep/setsid: ", err)
		}
		defer c.Process.Kill()
	}
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
	var mine []*exec.Cmd
	for range 2 {
		c := exec.Command("setsid", "sleep", "1000")
		c.Env = append(os.Environ(), Env(NewScopedMarker(scope)))
		mine = append(mine, c)
	}
	other := exec.Command("sleep", "1000")
	other.Env = append(os.Environ(), Env(NewScopedMarker(scope+"x")))
	for _, c := range append(mine, other) {
		if err := c.Start(); err != nil {
			t.Skip("cannot start sleep/setsid: ", err)
		}
		defer c.Process.Kill()
		go c.Wait()
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
