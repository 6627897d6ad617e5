package chaos

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/internal/testenv"
)

// berthBinary builds the berth binary the components run as.
func berthBinary(t *testing.T) string {
	t.Helper()
	goBin := testenv.LookPath(t, "go")
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	bin := filepath.Join(t.TempDir(), "berth")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/berthci/berth/cmd/berth")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building berth: %v\n%s", err, out)
	}
	return bin
}

// TestShortChaosRun is the CI-sized chaos run: a few pipelines under every
// fault, and every invariant must hold.
func TestShortChaosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	bin := berthBinary(t)
	dir := t.TempDir()
	var progress strings.Builder
	rep, err := Run(context.Background(), Options{
		Binary: bin, Dir: dir, Jobs: 36, Seed: 7, Runners: 2, Concurrent: 3,
		FaultEvery: 500 * time.Millisecond, StuckTimeout: 8 * time.Second, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	t.Logf("seed %d: %d pipelines, %d jobs %v, failed %v, faults %v, %.0f s", rep.Seed, rep.Pipelines, rep.Jobs, rep.JobsByStatus, rep.FailureReasons, rep.Faults, rep.DurationSec)
	if !rep.OK() {
		logs, _ := os.ReadFile(filepath.Join(dir, "components.log"))
		if len(logs) > 20000 {
			logs = logs[len(logs)-20000:]
		}
		t.Fatalf("seed %d violated invariants:\n%s\ncomponents' log (end):\n%s", rep.Seed, strings.Join(rep.Violations, "\n"), logs)
	}
	if rep.Pipelines != 6 || rep.Jobs < 36 {
		t.Errorf("%d pipelines with %d jobs, want 6 with at least 36", rep.Pipelines, rep.Jobs)
	}
	total := 0
	for _, n := range rep.Faults {
		total += n
	}
	if total == 0 {
		t.Error("no fault was injected")
	}
}

func TestOptionsRejectUnknownFault(t *testing.T) {
	_, err := Run(context.Background(), Options{Binary: "x", Dir: t.TempDir(), Faults: []string{"meteor"}})
	if err == nil || !strings.Contains(err.Error(), "meteor") {
		t.Fatalf("unknown fault: %v", err)
	}
	_, err = Run(context.Background(), Options{Binary: "x", Dir: t.TempDir(), Faults: []string{FaultKillPlugin}})
	if err == nil || !strings.Contains(err.Error(), "instance executor") {
		t.Fatalf("kill-plugin with the shell executor: %v", err)
	}
}

// TestProxyModes checks each network fault against an echo server.
func TestProxyModes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := strings.Repeat("0123456789", 2000) // 20 kB, over every cut
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, payload)
			}()
		}
	}()
	p, err := NewProxy("127.0.0.1", ln.Addr().String(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fetch := func() (string, error) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if got, err := fetch(); err != nil || got != payload {
		t.Fatalf("faithful: %d bytes, %v", len(got), err)
	}
	p.SetMode(FaultDrop)
	if got, _ := fetch(); got != "" {
		t.Errorf("drop: got %d bytes", len(got))
	}
	for _, mode := range []string{FaultTruncate, FaultReset} {
		p.SetMode(mode)
		cut := false
		for range 20 {
			got, _ := fetch()
			if !strings.HasPrefix(payload, got) {
				t.Fatalf("%s: the bytes that arrived are not a prefix", mode)
			}
			cut = cut || len(got) < len(payload)
		}
		if !cut {
			t.Errorf("%s: no connection was cut in 20", mode)
		}
	}
	p.SetMode(FaultDelay)
	start := time.Now()
	if got, err := fetch(); err != nil || got != payload {
		t.Fatalf("delay: %d bytes, %v", len(got), err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("delay: answered in %v", time.Since(start))
	}
}

// TestShortChaosRunDocker is the same with the docker executor: runner
// managers killed under container jobs must leave no container or
// network once their successors swept.
func TestShortChaosRunDocker(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	const image = "berth-test/debian:bookworm"
	if err := exec.Command("docker", "image", "inspect", image).Run(); err != nil {
		testenv.Missing(t, "Docker or the image %s is missing (run .ci/images): %v", image, err)
	}
	p, err := docker.New(context.Background(), docker.Options{})
	if err != nil {
		testenv.Missing(t, "no Docker engine: %v", err)
	}
	host, err := p.HostAddress(context.Background())
	p.Shutdown(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bin := berthBinary(t)
	dir := t.TempDir()
	var progress strings.Builder
	rep, err := Run(context.Background(), Options{
		Binary: bin, Dir: dir, Jobs: 30, Seed: 9, Runners: 2, Concurrent: 3, Executor: "docker", Image: image, DockerHost: host,
		Faults: []string{FaultKillRunner, FaultPauseRunner, FaultKillCoordinator, FaultReset}, FaultEvery: 700 * time.Millisecond,
		StuckTimeout: 8 * time.Second, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	t.Logf("seed %d: %d pipelines, %d jobs %v, failed %v, faults %v, %.0f s", rep.Seed, rep.Pipelines, rep.Jobs, rep.JobsByStatus, rep.FailureReasons, rep.Faults, rep.DurationSec)
	if !rep.OK() {
		t.Fatalf("seed %d violated invariants:\n%s", rep.Seed, strings.Join(rep.Violations, "\n"))
	}
}

// TestShortChaosRunInstance is the CI-sized chaos run with autoscaled
// runners: jobs on instances of the local fleeting plugin, and the
// plugin process killed among the other faults.
func TestShortChaosRunInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	bin := berthBinary(t)
	dir := t.TempDir()
	var progress strings.Builder
	rep, err := Run(context.Background(), Options{
		Binary: bin, Dir: dir, Jobs: 36, Seed: 11, Runners: 2, Concurrent: 3, Executor: "instance",
		Faults:     []string{FaultKillPlugin, FaultKillRunner, FaultPauseRunner, FaultKillCoordinator, FaultReset},
		FaultEvery: 500 * time.Millisecond, StuckTimeout: 8 * time.Second, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	t.Logf("seed %d: %d pipelines, %d jobs %v, failed %v, faults %v, %.0f s", rep.Seed, rep.Pipelines, rep.Jobs, rep.JobsByStatus, rep.FailureReasons, rep.Faults, rep.DurationSec)
	if !rep.OK() {
		logs, _ := os.ReadFile(filepath.Join(dir, "components.log"))
		if len(logs) > 20000 {
			logs = logs[len(logs)-20000:]
		}
		t.Fatalf("seed %d violated invariants:\n%s\ncomponents' log (end):\n%s", rep.Seed, strings.Join(rep.Violations, "\n"), logs)
	}
	if rep.Faults[FaultKillPlugin] == 0 && rep.Faults[FaultKillRunner] == 0 {
		t.Errorf("no plugin or runner was killed: %v", rep.Faults)
	}
}
