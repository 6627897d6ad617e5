package microvm

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
	localrun "github.com/berthci/berth/local"
	"github.com/berthci/berth/nesting"
	rconfig "github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/taskscaler"
)

// startNestingDaemon runs `berth nesting serve` on a socket of its own, as
// an instance image would, and returns the socket's path; the daemon is
// stopped (SIGTERM: it deletes its VMs) at the end of the test.
func startNestingDaemon(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bn")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nesting.sock")
	cmd := exec.Command(testenv.Berth(t), "nesting", "serve", "--socket", sock, "--log-level", "info")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-waited:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-waited
			t.Error("the nesting daemon did not stop within a minute of SIGINT")
		}
		t.Logf("nesting daemon:\n%s", logs.String())
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nesting daemon did not listen on %s:\n%s", sock, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var usingVMRE = regexp.MustCompile(`Running in microVM (nesting-\S+)`)

// TestVMIsolationOnInstances: an instance executor with GitLab's
// [runners.autoscaler.vm_isolation] runs each job in a VM of the nesting
// daemon on its instance (here the local fleeting plugin's instances, on
// this machine, with a `berth nesting serve` as the instance image
// would run it), reached through the instance's connector (SSH, the
// daemon's socket forwarded). A VM a previous manager left on the daemon
// is deleted at ready-up; the job reaches the coordinator through the
// agent; afterwards no VM is left.
func TestVMIsolationOnInstances(t *testing.T) {
	needVMs(t)
	testenv.LookPath(t, "git")
	sock := startNestingDaemon(t)
	images.once.Do(func() { images.dir, _ = os.MkdirTemp("", "microvm-test-images-") })
	state, err := os.MkdirTemp("", "bv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	nestingConfig := map[string]any{"accel": "tcg", "memory_mb": 256, "state_dir": state, "image_dir": images.dir}
	// A VM a previous runner manager left on the instance's daemon: the
	// ready-up must delete it.
	nc, err := nesting.Dial(context.Background(), "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfgJSON, _ := json.Marshal(nestingConfig)
	stale, _, err := nc.CreateInitialized(context.Background(), cfgJSON, testImage, nil)
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewInstances(InstancesOptions{Logger: log, Config: config.VMIsolation{
		Enabled: true, NestingHost: "unix://" + sock, Image: testImage, NestingConfig: nestingConfig,
	}})
	if err != nil {
		t.Fatal(err)
	}
	g := local.New(local.Config{StateDir: filepath.Join(dir, "fleeting"), Name: "vms", MaxInstances: 2})
	p, err := autoscaler.New(context.Background(), autoscaler.Options{Group: g, Instances: x, Name: "vms", Logger: log,
		Config: taskscaler.Config{Plugin: "local", CapacityPerInstance: 2, MaxInstances: 1, DeleteInstancesOnShutdown: true,
			ShutdownDeletionInterval: 200 * time.Millisecond, ShutdownDeletionRetries: 50,
			StateStorage: taskscaler.StateStorage{Enabled: true, Dir: filepath.Join(dir, "state")},
			Policies:     []taskscaler.Policy{{IdleTime: time.Minute}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("autoscaler shutdown: %v", err)
		}
	}()
	project := filepath.Join(dir, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
variables: {GIT_STRATEGY: none}
vm:
  parallel: 2
  isolation: microvm
  script:
    - echo "in $(hostname) kernel args $(cat /proc/cmdline)"
    - (wget -q -O /dev/null "$CI_API_V4_URL/projects" 2>&1 || true) | grep -q "401 Unauthorized" && echo reached-the-coordinator
`), 0o644)
	var logs bytes.Buffer
	res, err := localrun.Run(context.Background(), localrun.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: "instance",
		Concurrency: 2, ConfigureRunner: func(rc *rconfig.Runner) {
			rc.BuildsDir, rc.CacheDir = "", ""
			rc.Autoscaler = &taskscaler.Config{Plugin: "local"}
		}})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	out := logs.String()
	t.Logf("pipeline:\n%s", out)
	if !res.Succeeded() || len(res.Jobs) != 2 {
		t.Fatalf("pipeline %s with %d jobs", res.Status, len(res.Jobs))
	}
	vms := map[string]bool{}
	for _, m := range usingVMRE.FindAllStringSubmatch(out, -1) {
		vms[m[1]] = true
	}
	if len(vms) != 2 || strings.Count(out, "│ reached-the-coordinator\n") != 2 || strings.Count(out, "kernel args console=ttyS0") != 2 {
		t.Errorf("want 2 jobs in 2 VMs of their own, each reaching the coordinator; VMs %v", vms)
	}
	if strings.Contains(out, stale.ID) {
		t.Errorf("a job ran in the stale VM %s", stale.ID)
	}
	// The stale VM went at ready-up, each job's VM after its job.
	if vms, err := nc.List(context.Background()); err != nil || len(vms) != 0 {
		t.Errorf("VMs left on the instance's daemon: %v %v", vms, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
		t.Errorf("VM directories left on the instance: %v", ents)
	}
}
