package microvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// testsInVM builds the tests of package pkg (static), boots a VM of
// image, mounts a pure cgroup2 hierarchy in it (whatever the host has: a
// v1 or hybrid host cannot give v2 the memory and pids controllers),
// copies the test binary in through the agent and runs the tests matching
// run there as root with dependencies required. It returns their output
// and fails the test if they fail.
func testsInVM(t *testing.T, job *runnerapi.JobResponse, memoryMB int, pkg, run string) string {
	p := newTestProvider(t, config.MicroVM{NestingConfig: map[string]any{"memory_mb": memoryMB}}, Options{})
	bin := filepath.Join(t.TempDir(), "pkg.test")
	build := exec.Command("go", "test", "-c", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests of %s: %v\n%s", pkg, err, out)
	}
	code, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	e, _, _ := prepared(t, p, executor.PrepareOptions{Job: job})
	sh := func(script string, stdin []byte, timeout time.Duration) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var out testenv.SyncBuffer
		err := e.agent.Run(ctx, guest.RunOptions{Argv: []string{"/bin/sh", "-c", script}, Stdin: stdin,
			Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", testenv.RequireEnv + "=1"}, Output: &out})
		return out.String(), err
	}
	if out, err := sh(`grep -q cgroup2 /proc/filesystems && mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && cat /sys/fs/cgroup/cgroup.controllers`, nil, time.Minute); err != nil {
		t.Fatalf("mounting cgroup2 in the VM: %v\n%s", err, out)
	} else {
		t.Logf("the VM's cgroup2 controllers: %s", strings.TrimSpace(out))
	}
	if out, err := sh(`mkdir -p /root/t && cat > /root/t/pkg.test && chmod 755 /root/t/pkg.test`, code, 2*time.Minute); err != nil {
		t.Fatalf("copying the test binary into the VM: %v\n%s", err, out)
	}
	out, err := sh(`cd /root/t && exec ./pkg.test -test.run '`+run+`' -test.v -test.count=1`, nil, 10*time.Minute)
	t.Logf("in the VM:\n%s", out)
	if err != nil {
		t.Fatalf("the tests of %s in the VM: %v", pkg, err)
	}
	if strings.Contains(out, "--- SKIP") {
		t.Error("a test skipped in the VM")
	}
	return out
}

// TestSlotCgroupsV2InAVM: the slot cgroup package's tests against real
// cgroup v2 (memory, pids, cpu, kill, reset).
func TestSlotCgroupsV2InAVM(t *testing.T) {
	out := testsInVM(t, busyboxJob(), 512, "github.com/berthci/berth/executor/slotcgroup", "^TestRealV2$|^TestRealV2Kill$")
	for _, want := range []string{"--- PASS: TestRealV2 ", "--- PASS: TestRealV2/memory", "--- PASS: TestRealV2/pids", "--- PASS: TestRealV2/cpu", "--- PASS: TestRealV2/kill", "--- PASS: TestRealV2/reset", "--- PASS: TestRealV2Kill "} {
		if !strings.Contains(out, want) {
			t.Errorf("in the VM: no %q", want)
		}
	}
}

// TestInstanceSlotCgroupsV2InAVM: the instance executor's slot cgroup
// tests (jobs limited, a canceled job's slot emptied, the fleet deleted
// at shutdown) on a cgroup v2 machine, when this host is not one: the autoscaler, the local fleeting
// plugin's instances and the jobs all run in the VM (Debian: git, bash).
func TestInstanceSlotCgroupsV2InAVM(t *testing.T) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil &&
		strings.Contains(string(b), "memory") && strings.Contains(string(b), "pids") {
		// Minutes under emulation, for what the package's own tests
		// already check on this host.
		t.Skip("this host has cgroup v2 with memory and pids: executor/instance's tests run on it directly")
	}
	debian := &runnerapi.JobResponse{Image: &runnerapi.Image{Name: "berth-test/debian:bookworm"}}
	out := testsInVM(t, debian, 1024, "github.com/berthci/berth/executor/instance", "^TestSlotCgroupsLimitJobs$|^TestCanceledJobLeavesNothingInItsSlot$")
	for _, want := range []string{"--- PASS: TestSlotCgroupsLimitJobs ", "--- PASS: TestCanceledJobLeavesNothingInItsSlot "} {
		if !strings.Contains(out, want) {
			t.Errorf("in the VM: no %q", want)
		}
	}
}
