package shell

import (
	"context"
	"os"
	"os/exec"
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
	start := func(systemID, short string) *exec.Cmd {
		c := exec.Command("setsid", "sleep", "1000")
		c.Env = append(os.Environ(), reap.Env(reap.NewScopedMarker(markerScope(systemID, short))))
		if err := c.Start(); err != nil {
			t.Skip("cannot start setsid sleep: ", err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	left := start("s_0123456789ab", "runner01")
	other := start("s_0123456789ab", "runner02")
	exited := make(chan struct{})
	go func() { left.Wait(); close(exited) }()

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
