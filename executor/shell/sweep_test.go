package shell

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
)

// TestSweepKillsLeftoversOfACrashedManager: a runner manager killed with
// SIGKILL cannot stop its stages; the next one's Sweep does, and leaves
// other runners' processes alone.
func TestSweepKillsLeftoversOfACrashedManager(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc: ", err)
	}
	start := func(systemID, short string) (*exec.Cmd, chan struct{}) {
		c := exec.Command("setsid", "sleep", "1000")
		c.Env = append(os.Environ(), reap.Env(reap.NewScopedMarker(markerScope(systemID, short))))
		if err := c.Start(); err != nil {
			t.Skip("cannot start setsid sleep: ", err)
		}
		exited := make(chan struct{})
		go func() { c.Wait(); close(exited) }()
		t.Cleanup(func() { c.Process.Kill(); <-exited })
		waitExec(t, c.Process.Pid, "sleep")
		return c, exited
	}
	_, exited := start("s_0123456789ab", "runner01")
	other, _ := start("s_0123456789ab", "runner02")

	p := New(Config{})
	if err := p.Sweep(context.Background(), executor.SweepOptions{SystemID: "s_0123456789ab", ShortToken: "runner01"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the crashed runner's process survived Sweep")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("another runner's process was killed: %v", err)
	}
}

// waitExec waits until process pid runs the program name. Between execve
// closing the parent's pipe and the new image setting up its stack, the
// kernel shows an empty /proc/PID/environ (and setsid execs once more), so
// a scan right after Start could miss the marker.
func waitExec(t *testing.T, pid int, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if strings.TrimSpace(string(comm)) == name && strings.Contains(string(env), reap.Variable+"=") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %d never ran %s", pid, name)
}
