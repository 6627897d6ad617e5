package instance_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/instance"
	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
	localrun "github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/helper"
	"github.com/berthci/berth/taskscaler"
)

// The test binary is also the local plugin's instance server and, once
// uploaded to an instance, the berth helper of its jobs.
func TestMain(m *testing.M) {
	local.RunServerIfAsked()
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	if len(os.Args) > 1 && os.Args[1] == "--version" { // the upload's check that the helper runs
		fmt.Println("berth test")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fleet is an autoscaled instance executor on the local plugin, in
// process.
type fleet struct {
	t      *testing.T
	dir    string
	group  *local.Group
	p      *autoscaler.Provider
	mu     sync.Mutex
	peak   int
	stopPk chan struct{}
}

func newFleet(t *testing.T, cfg taskscaler.Config, sc slotcgroup.Config) *fleet {
	t.Helper()
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	dir := t.TempDir()
	g := local.New(local.Config{StateDir: filepath.Join(dir, "fleeting"), Name: "e2e", MaxInstances: 8})
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	x, err := instance.New(instance.Options{Logger: log, KillGrace: time.Second, SlotCgroups: sc})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Plugin = "local"
	cfg.DeleteInstancesOnShutdown = true // nothing of a test outlives it
	// An instance server stops within a few seconds of SIGTERM (the local
	// plugin kills it after 5 s); give shutdown that long on a busy
	// machine instead of the 3 × 200 ms that are enough on an idle one.
	cfg.ShutdownDeletionInterval = 200 * time.Millisecond
	cfg.ShutdownDeletionRetries = 50
	cfg.StateStorage = taskscaler.StateStorage{Enabled: true, Dir: filepath.Join(dir, "state")}
	cfg.UpdateInterval = time.Second
	cfg.UpdateIntervalWhenExpecting = 100 * time.Millisecond
	p, err := autoscaler.New(context.Background(), autoscaler.Options{Config: cfg, Group: g, Instances: x, Name: "e2e", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, dir: dir, group: g, p: p, stopPk: make(chan struct{})}
	go f.watchPeak()
	t.Cleanup(func() {
		close(f.stopPk)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("autoscaler shutdown: %v", err)
		}
	})
	return f
}

func (f *fleet) live() int {
	st := f.p.Scaler().Stats()
	return st.Instances[taskscaler.PhaseCreating] + st.Instances[taskscaler.PhaseBooted] + st.Instances[taskscaler.PhaseReady] + st.Requested
}

func (f *fleet) watchPeak() {
	for {
		select {
		case <-f.stopPk:
			return
		case <-time.After(20 * time.Millisecond):
		}
		n := f.live()
		f.mu.Lock()
		f.peak = max(f.peak, n)
		f.mu.Unlock()
	}
}

// instanceDirs are the local plugin's instances on disk.
func (f *fleet) instanceDirs() []string {
	ds, _ := filepath.Glob(filepath.Join(f.dir, "fleeting", "instances", "*"))
	return ds
}

func (f *fleet) run(ci string, concurrency int) (*localrun.Result, string) {
	f.t.Helper()
	project := filepath.Join(f.dir, "project")
	os.MkdirAll(project, 0o755)
	if err := os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(ci), 0o644); err != nil {
		f.t.Fatal(err)
	}
	var logs bytes.Buffer
	res, err := localrun.Run(f.t.Context(), localrun.Options{Dir: project, Logs: &logs, Provider: f.p, ProviderName: instance.Name,
		Concurrency: concurrency, ConfigureRunner: func(rc *config.Runner) {
			// Each instance builds under its own home (the default), as
			// on machines of their own.
			rc.BuildsDir, rc.CacheDir = "", ""
			rc.Autoscaler = &taskscaler.Config{Plugin: "local"}
		}})
	if err != nil {
		f.t.Fatalf("%v\n%s", err, logs.String())
	}
	return res, logs.String()
}

var usingRE = regexp.MustCompile(`Using instance (\S+), slot (\d+), job (\d+) on it`)

// TestFanOutScalesFromZeroAndBack: a pipeline of 12 parallel jobs makes
// the local plugin go from no instance to the ones needed (capacity 2
// each), every job runs in a slot nobody else holds at the time, and once
// idle_time has passed the fleet is back to zero with nothing left on the
// machine.
func TestFanOutScalesFromZeroAndBack(t *testing.T) {
	f := newFleet(t, taskscaler.Config{CapacityPerInstance: 2, MaxInstances: 6,
		Policies: []taskscaler.Policy{{IdleTime: 2 * time.Second}}}, slotcgroup.Config{})
	if n := f.live(); n != 0 {
		t.Fatalf("%d instances before any job", n)
	}
	res, logs := f.run(`
fan:
  parallel: 12
  script:
    - mkdir "$CI_BUILDS_DIR/.busy"
    - echo "host=$(hostname) builds=$CI_BUILDS_DIR"
    - sleep 3
    - rmdir "$CI_BUILDS_DIR/.busy"
`, 12)
	if !res.Succeeded() || len(res.Jobs) != 12 {
		t.Fatalf("pipeline %s with %d jobs:\n%s", res.Status, len(res.Jobs), logs)
	}
	used := map[string]int{}
	instances := map[string]bool{}
	for _, m := range usingRE.FindAllStringSubmatch(logs, -1) {
		used[m[1]+"/"+m[2]]++
		instances[m[1]] = true
	}
	if total := sumOf(used); total != 12 {
		t.Fatalf("%d jobs said which instance slot they used, want 12:\n%s", total, logs)
	}
	f.mu.Lock()
	peak := f.peak
	f.mu.Unlock()
	t.Logf("peak %d instances, %d used, slots %v", peak, len(instances), used)
	if peak < 2 || peak > 6 || len(instances) < 2 {
		t.Errorf("peak %d instances and %d used for 12 jobs of 3 s at capacity 2: want the fleet to grow (at most max_instances 6)", peak, len(instances))
	}
	deadline := time.Now().Add(time.Minute)
	for f.live() > 0 || len(f.instanceDirs()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after idle_time: %d instances, %d on disk (stats %+v)", f.live(), len(f.instanceDirs()), f.p.Scaler().Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left := markedProcesses(f.dir); len(left) > 0 {
		t.Fatalf("processes of deleted instances still run: %v", left)
	}
}

func sumOf(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// markedProcesses lists processes that belong to an instance under dir.
func markedProcesses(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte(local.InstanceMarkVariable+"="+dir)) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, fmt.Sprintf("%s %q", e.Name(), strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	return out
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSlotCgroupsLimitJobs: with use_slot_cgroups each job runs in its
// slot's cgroup on the instance (here cgroup v1 on this machine): a job
// that exceeds the slot's memory limit is killed and told so in its log
// while its neighbour in the other slot of the same instance finishes, and
// a canceled job's processes are gone even when they left its process
// group and cleared their environment.
func TestSlotCgroupsLimitJobs(t *testing.T) {
	testenv.Root(t)
	if v := slotcgroup.Detect(""); v == slotcgroup.Unsupported {
		testenv.Missing(t, "no cgroup hierarchy at /sys/fs/cgroup")
	}
	parent := fmt.Sprintf("berth-e2e-%d", os.Getpid())
	sc := slotcgroup.Config{Enabled: true, Template: parent + "/slot-${slot}", Limits: slotcgroup.Limits{Memory: "64m", Pids: 200}}
	t.Cleanup(func() { removeCgroups(t, parent) })
	f := newFleet(t, taskscaler.Config{CapacityPerInstance: 2, MaxInstances: 1,
		Policies: []taskscaler.Policy{{IdleTime: time.Minute}}}, sc)
	res, logs := f.run(`
hog:
  script:
    - echo "in $GITLAB_RUNNER_SLOT_CGROUP"
    - x=$(head -c 300000000 /dev/zero | tr '\0' a); echo "held ${#x} bytes"
neighbour:
  script:
    - sleep 4
    - echo neighbour-alive
`, 2)
	hog, neighbour := jobOf(res, "hog"), jobOf(res, "neighbour")
	if hog.Status != "failed" || !strings.Contains(logs, "exceeded the memory limit of its slot cgroup "+parent) {
		t.Errorf("hog: %s; want it killed with a message naming the slot cgroup\n%s", hog.Status, logs)
	}
	if neighbour.Status != "success" || !strings.Contains(logs, "neighbour-alive") {
		t.Errorf("neighbour: %s; want it untouched\n%s", neighbour.Status, logs)
	}
	if !strings.Contains(logs, "in "+parent+"/slot-") {
		t.Errorf("GITLAB_RUNNER_SLOT_CGROUP not set:\n%s", logs)
	}
}

// TestCanceledJobLeavesNothingInItsSlot: a canceled job whose process
// escaped its process group and cleared its environment is gone with the
// job: the slot cgroup is emptied.
func TestCanceledJobLeavesNothingInItsSlot(t *testing.T) {
	testenv.Root(t)
	if v := slotcgroup.Detect(""); v == slotcgroup.Unsupported {
		testenv.Missing(t, "no cgroup hierarchy at /sys/fs/cgroup")
	}
	parent := fmt.Sprintf("berth-e2e-cancel-%d", os.Getpid())
	t.Cleanup(func() { removeCgroups(t, parent) })
	f := newFleet(t, taskscaler.Config{CapacityPerInstance: 1, MaxInstances: 1,
		Policies: []taskscaler.Policy{{IdleTime: time.Minute}}}, slotcgroup.Config{Enabled: true, Template: parent + "/slot-${slot}"})
	pidFile := filepath.Join(f.dir, "escaped.pid")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var logs bytes.Buffer
	project := filepath.Join(f.dir, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
escape:
  script:
    - env -i setsid /bin/sh -c 'echo $$ > `+pidFile+`; exec sleep 1000' </dev/null >/dev/null 2>&1 &
    - sleep 1000
`), 0o644)
	var runErr error
	go func() {
		defer close(done)
		_, runErr = localrun.Run(ctx, localrun.Options{Dir: project, Logs: &syncWriter{w: &logs}, Provider: f.p, ProviderName: instance.Name,
			ConfigureRunner: func(rc *config.Runner) {
				rc.BuildsDir, rc.CacheDir = "", ""
				rc.Autoscaler = &taskscaler.Config{Plugin: "local"}
			}})
	}()
	var pid int
	deadline := time.Now().Add(2 * time.Minute)
	for pid == 0 {
		select {
		case <-done:
			t.Fatalf("the run ended before the job started its escaped process: %v", runErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not start its escaped process")
		}
		if b, err := os.ReadFile(pidFile); err == nil {
			fmt.Sscanf(string(b), "%d", &pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Fatalf("the canceled job's escaped process %d still runs", pid)
	}
}

func jobOf(res *localrun.Result, name string) localrun.JobResult {
	for _, j := range res.Jobs {
		if j.Name == name {
			return j
		}
	}
	return localrun.JobResult{}
}

// removeCgroups removes the slot cgroups under parent in every hierarchy.
func removeCgroups(t *testing.T, parent string) {
	for _, pattern := range []string{"/sys/fs/cgroup/*/" + parent, "/sys/fs/cgroup/" + parent, "/sys/fs/cgroup/unified/" + parent} {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			slots, _ := filepath.Glob(filepath.Join(d, "slot-*"))
			for _, s := range slots {
				if err := os.Remove(s); err != nil {
					t.Logf("removing %s: %v", s, err)
				}
			}
			os.Remove(d)
		}
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
