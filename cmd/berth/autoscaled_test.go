package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// asBerthEnv makes the test binary run as the berth command (TestMain),
// for tests that need berth processes to kill.
const asBerthEnv = "BERTH_TEST_AS_BERTH"

// berthProcess is a berth command run as a process of its own.
type berthProcess struct {
	cmd *exec.Cmd
	out *testenv.SyncBuffer
}

func startBerth(t *testing.T, args ...string) *berthProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &berthProcess{cmd: exec.Command(exe, args...), out: &testenv.SyncBuffer{}}
	p.cmd.Env = append(os.Environ(), asBerthEnv+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	return p
}

// TestAutoscaledManagerKilledAndRestarted: an instance-executor runner
// manager on the local plugin is killed with SIGKILL in the middle of a
// pipeline and started again. The new manager adopts the instances its
// ledger lists (removing those that held the dead manager's jobs), the
// jobs the dead manager held fail as stuck and are retried, the pipeline
// succeeds, and once the manager stops no instance and no process of one
// is left.
func TestAutoscaledManagerKilledAndRestarted(t *testing.T) {
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	ctx := context.Background()
	dir := t.TempDir()
	srv, created := coordinatorWithRunner(t, dir, coordinator.Config{LongPollTimeout: 5 * time.Second, StuckTimeout: 8 * time.Second,
		ReapInterval: time.Second, TraceUpdateInterval: time.Second})
	fleetDir := filepath.Join(dir, "fleeting")
	cfgPath := filepath.Join(dir, "config.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
concurrent = 6
check_interval = 1
[[runners]]
  name = "autoscaled"
  url = %q
  token = %q
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 3
    delete_instances_on_shutdown = true
    update_interval = "1s"
    update_interval_when_expecting = "200ms"
    [runners.autoscaler.plugin_config]
      state_dir = %q
      name = "killtest"
      max_instances = 4
    [runners.autoscaler.state_storage]
      enabled = true
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
`, srv.URL, created.Token, fleetDir)), 0o600)

	_, pl := startPipeline(t, srv, dir, "kill/test", `
work:
  parallel: 6
  retry:
    max: 2
    when: always
  script:
    - echo "on $(hostname) in $CI_BUILDS_DIR"
    - for i in 1 2 3 4 5 6; do echo "tick $i"; sleep 1; done
`)

	first := startBerth(t, "runner", "run", "-c", cfgPath)
	running := func() int {
		jobs, _ := srv.Store.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
		n := 0
		for _, j := range jobs {
			if j.Status == store.StatusRunning {
				n++
			}
		}
		return n
	}
	// Killed once jobs run their scripts on ready instances.
	waitFor(t, 2*time.Minute, "jobs running on instances", func() bool {
		return running() >= 2 && strings.Count(first.out.String(), "uploaded the helper") >= 2
	})
	time.Sleep(time.Second)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()

	second := startBerth(t, "runner", "run", "-c", cfgPath)
	waitFor(t, 3*time.Minute, "the pipeline to finish", func() bool {
		got, err := srv.Store.GetPipeline(ctx, pl.ID)
		return err == nil && got.Status.Finished()
	})
	got, _ := srv.Store.GetPipeline(ctx, pl.ID)
	if got.Status != store.StatusSuccess {
		t.Fatalf("pipeline %s\nfirst manager:\n%s\nsecond manager:\n%s", got.Status, first.out.String(), second.out.String())
	}
	log := second.out.String()
	if !strings.Contains(log, "state storage opened") || !strings.Contains(log, "adopted from the ledger") {
		t.Errorf("the restarted manager did not adopt its instances from the ledger:\n%s", log)
	}
	// Stopping deletes every instance (delete_instances_on_shutdown).
	second.cmd.Process.Signal(syscall.SIGQUIT)
	done := make(chan error, 1)
	go func() { done <- second.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the manager did not stop:\n%s", second.out.String())
	}
	if dirs, _ := filepath.Glob(filepath.Join(fleetDir, "instances", "*")); len(dirs) > 0 {
		t.Errorf("instances left after the manager stopped: %v\n%s", dirs, second.out.String())
	}
	if left := instanceProcesses(fleetDir); len(left) > 0 {
		t.Errorf("processes of instances left: %v", left)
	}
}

// coordinatorWithRunner starts an embedded coordinator with cfg (data in
// dir/coordinator, stopped with the test) and creates an instance runner.
func coordinatorWithRunner(t *testing.T, dir string, cfg coordinator.Config) (*embedded.Coordinator, *runnerapi.RunnerTokenResponse) {
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(dir, "coordinator"), Listener: ln,
		Logger: slog.New(slog.DiscardHandler), Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	adminTok, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	created, err := client.New(srv.URL, adminTok).CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	return srv, created
}

// instanceProcesses lists processes of local instances under dir.
// startPipeline commits the .gitlab-ci.yml ci to a new project at path
// (made, with vars, by the coordinator) and starts its pipeline.
func startPipeline(t *testing.T, srv *embedded.Coordinator, dir, path, ci string, vars ...*store.Variable) (*store.Project, *store.Pipeline) {
	t.Helper()
	ctx := context.Background()
	project := filepath.Join(dir, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(ci), 0o644)
	p, err := srv.Pipelines().CreateProject(ctx, pipelines.ProjectSpec{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		v.ProjectID = p.ID
		if err := srv.Store.CreateVariable(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	sha, err := srv.Pipelines().CommitDir(ctx, p.ID, "main", project, "test")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := srv.Pipelines().CreatePipeline(ctx, pipelines.PipelineRequest{ProjectID: p.ID, Ref: "main", Sha: sha})
	if err != nil {
		t.Fatal(err)
	}
	return p, pl
}

func instanceProcesses(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(b, []byte(local.InstanceMarkVariable+"="+dir)) {
			out = append(out, e.Name())
		}
	}
	return out
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUp: berth up on a fresh data directory starts a coordinator, a
// runner and its autoscaler on the local plugin; a pipeline pushed with
// berth pipelines create runs on instances it starts; once it is done the
// fleet goes back to zero after idle_time while the runner keeps asking
// for jobs; SIGTERM stops it all and deletes the instances. A second start
// reuses the runner.
func TestUp(t *testing.T) {
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	data := t.TempDir()
	start := func() (*berthProcess, upSummary) {
		p := startBerth(t, "up", "--data", data, "--listen", "127.0.0.1:0", "--json", "--max-instances", "2", "--capacity", "2", "--idle-time", "2s", "--log-level", "info")
		var s upSummary
		waitFor(t, time.Minute, "berth up's summary", func() bool {
			for _, line := range strings.Split(p.out.String(), "\n") {
				if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &s) == nil && s.URL != "" {
					return true
				}
			}
			return false
		})
		return p, s
	}
	stop := func(p *berthProcess) {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("berth up exited with %v:\n%s", err, p.out.String())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("berth up did not stop:\n%s", p.out.String())
		}
	}
	up, s := start()
	if s.Executor != "instance" || s.Plugin != "local" || s.MaxInstances != 2 || s.Capacity != 2 {
		t.Fatalf("summary %+v", s)
	}
	tok, err := os.ReadFile(s.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_ADMIN_TOKEN", strings.TrimSpace(string(tok)))
	project := t.TempDir()
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte("a:\n  parallel: 3\n  script:\n    - echo \"on $CI_BUILDS_DIR\"\n"), 0o644)
	out, err := runCLI(t, "pipelines", "create", "--server", s.URL, "--project", "demo", project)
	if err != nil {
		t.Fatalf("pipelines create: %v", err)
	}
	id := strings.TrimSpace(out)
	if _, err := runCLI(t, "pipelines", "wait", "--server", s.URL, id); err != nil {
		t.Fatalf("pipeline %s: %v\n%s", id, err, up.out.String())
	}
	fleetDir := filepath.Join(data, "fleeting-local")
	// The runner long-polls now, holding a reservation through each poll:
	// that is not demand, so the instances go after idle_time (2s), not
	// when a poll ends (50s).
	waitFor(t, 30*time.Second, "the fleet back to zero while the runner polls", func() bool {
		dirs, _ := filepath.Glob(filepath.Join(fleetDir, "instances", "*"))
		return len(dirs) == 0
	})
	if !strings.Contains(up.out.String(), "autoscaler started") {
		t.Errorf("no autoscaler in berth up's log:\n%s", up.out.String())
	}
	stop(up)
	if dirs, _ := filepath.Glob(filepath.Join(fleetDir, "instances", "*")); len(dirs) > 0 {
		t.Errorf("instances left after berth up stopped: %v", dirs)
	}
	if left := instanceProcesses(fleetDir); len(left) > 0 {
		t.Errorf("processes of instances left: %v", left)
	}
	up2, s2 := start()
	defer stop(up2)
	if s2.Runner != s.Runner || s2.URL == "" {
		t.Errorf("second start: runner %s, want the first one's %s", s2.Runner, s.Runner)
	}
}

// TestQuitWhileStarting: a runner manager told to quit (SIGQUIT) while it
// is still starting — here its fleeting plugin is slow to answer the
// handshake, after a predecessor was killed and left an instance behind —
// finishes starting, then stops in order: exit status 0, no goroutine
// dump, and the instances it adopted are deleted
// (delete_instances_on_shutdown). SIGTERM while starting aborts the start.
func TestQuitWhileStarting(t *testing.T) {
	dir := t.TempDir()
	srv, created := coordinatorWithRunner(t, dir, coordinator.Config{LongPollTimeout: 2 * time.Second})
	fleetDir := filepath.Join(dir, "fleeting")
	cfgPath := filepath.Join(dir, "config.toml")
	writeConfig := func(plugin string) {
		t.Helper()
		err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
concurrent = 2
check_interval = 1
[[runners]]
  name = "quitter"
  url = %q
  token = %q
  executor = "instance"
  [runners.autoscaler]
    plugin = %q
    capacity_per_instance = 1
    max_instances = 2
    delete_instances_on_shutdown = true
    update_interval = "200ms"
    [runners.autoscaler.plugin_config]
      state_dir = %q
      name = "quittest"
    [runners.autoscaler.state_storage]
      enabled = true
    [[runners.autoscaler.policy]]
      idle_count = 1
      idle_time = "10m"
`, srv.URL, created.Token, plugin, fleetDir)), 0o600)
		if err != nil {
			t.Fatal(err)
		}
	}
	instances := func() []string {
		dirs, _ := filepath.Glob(filepath.Join(fleetDir, "instances", "*"))
		return dirs
	}
	writeConfig("local")
	first := startBerth(t, "runner", "run", "-c", cfgPath)
	recorded := func() bool {
		for _, d := range instances() {
			if _, err := os.Stat(filepath.Join(d, "instance.json")); err == nil {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(2 * time.Minute); !recorded() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if !recorded() {
		t.Fatalf("no idle instance: %v\n%s", instances(), first.out.String())
	}
	first.cmd.Process.Signal(syscall.SIGKILL)
	first.cmd.Wait()

	// The same plugin, slow to start: the handshake waits for a file.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	began, goOn := filepath.Join(dir, "plugin-began"), filepath.Join(dir, "plugin-go-on")
	slow := filepath.Join(dir, "fleeting-plugin-slow")
	os.WriteFile(slow, []byte(fmt.Sprintf("#!/bin/sh\ntouch %s\nwhile [ ! -e %s ]; do sleep 0.05; done\nexec %s fleeting-plugin local\n", began, goOn, exe)), 0o755)
	writeConfig(slow)
	second := startBerth(t, "runner", "run", "-c", cfgPath)
	waitFor(t, time.Minute, "the plugin to start", func() bool { _, err := os.Stat(began); return err == nil })
	if err := second.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the signal lands while the handshake waits
	os.WriteFile(goOn, nil, 0o600)
	done := make(chan error, 1)
	go func() { done <- second.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the manager quit with %v:\n%s", err, second.out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the manager did not stop:\n%s", second.out.String())
	}
	if out := second.out.String(); strings.Contains(out, "goroutine ") || !strings.Contains(out, "SIGQUIT") {
		t.Errorf("the manager did not take SIGQUIT as quit:\n%s", out)
	}
	if left := instances(); len(left) > 0 {
		t.Errorf("instances left after the manager quit: %v\n%s", left, second.out.String())
	}
	if left := instanceProcesses(fleetDir); len(left) > 0 {
		t.Errorf("processes of instances left: %v", left)
	}

	// SIGTERM while starting aborts the start: the handshake is not waited
	// for (the plugin never answers here).
	os.Remove(began)
	os.Remove(goOn)
	third := startBerth(t, "runner", "run", "-c", cfgPath)
	waitFor(t, time.Minute, "the plugin to start again", func() bool { _, err := os.Stat(began); return err == nil })
	third.cmd.Process.Signal(syscall.SIGTERM)
	go func() { done <- third.cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(third.out.String(), "starting fleeting plugin fleeting-plugin-slow: terminated signal received") {
			t.Errorf("SIGTERM while starting: %v, want the start canceled:\n%s", err, third.out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the manager did not stop on SIGTERM:\n%s", third.out.String())
	}
}
