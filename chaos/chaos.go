// Package chaos drives a real Berth deployment — a coordinator and runner
// managers, each its own process, talking over loopback through a
// fault-injecting proxy — through a mixed pipeline workload while it kills
// (SIGKILL) and pauses (SIGSTOP) the components and breaks the network
// between them, then checks the invariants a CI system owes its users:
//
//   - no job lost: every pipeline and job the workload created exists and
//     reached a final state;
//   - no job stuck: all of that within the drain deadline once the faults
//     stop;
//   - no job ran twice: at most one start per job id (a retry is a new job);
//   - no trace lost or reordered: a successful job's log has each of its
//     numbered lines once, in order; any other job's log a prefix of them;
//   - no artifact lost: every successful build's artifact downloads with
//     its content, and no job found its dependency's artifact wrong;
//   - nothing orphaned: no process of a job outlives the runners;
//   - pipelines consistent with their jobs.
//
// The workload and the fault schedule are drawn from one seed, so a seed
// that fails can be run again; the processes' timing is the machine's, so
// a rerun hits the same faults at the same points of the schedule, not
// necessarily at the same instant of a job.
package chaos

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/token"
)

// Component faults.
const (
	FaultKillCoordinator  = "kill-coordinator"
	FaultPauseCoordinator = "pause-coordinator"
	FaultKillRunner       = "kill-runner"
	FaultPauseRunner      = "pause-runner"
	// FaultKillPlugin kills a runner manager's fleeting plugin process
	// (executor "instance" only): the manager starts it again.
	FaultKillPlugin = "kill-plugin"
)

// AllFaults are the faults a run injects unless told otherwise.
var AllFaults = []string{FaultKillCoordinator, FaultPauseCoordinator, FaultKillRunner, FaultPauseRunner, FaultKillPlugin,
	FaultDrop, FaultDelay, FaultReset, FaultTruncate}

// Options configure a run.
type Options struct {
	// Binary is the berth binary the components run as.
	Binary string
	// Dir holds everything of the run (data, configs, logs); it is
	// created if missing.
	Dir string
	// Jobs is about how many jobs the workload creates (rounded up to
	// whole pipelines; retries add more).
	Jobs int
	Seed uint64
	// Runners is the number of runner managers (default 2), each running
	// Concurrent jobs at once (default 4).
	Runners, Concurrent int
	// Executor of the runners: "shell" (default); "docker", whose jobs
	// run in Image (a local image with bash and git) and whose leftover
	// containers and networks count as orphans; or "instance", whose
	// jobs run on instances of the local fleeting plugin that each
	// runner manager autoscales, and whose leftover instances count as
	// orphans.
	Executor, Image string
	// DockerHost is this machine's address on Docker's bridge, where
	// containers reach the proxy (required with Executor "docker").
	DockerHost string
	// Faults to inject (default AllFaults); FaultEvery is the mean time
	// between two (default 2 s).
	Faults     []string
	FaultEvery time.Duration
	// StuckTimeout is the coordinator's --stuck-timeout: how soon a job
	// whose runner died fails and is retried (default 15 s).
	StuckTimeout time.Duration
	// Drain bounds the wait for every pipeline to finish after the last
	// fault (default 3 min + 4 × StuckTimeout).
	Drain time.Duration
	// Progress receives one line per event worth seeing (nil: none).
	Progress io.Writer
	Logger   *slog.Logger
}

// Report is what a run found.
type Report struct {
	Seed         uint64         `json:"seed"`
	Pipelines    int            `json:"pipelines"`
	Jobs         int            `json:"jobs"`
	JobsByStatus map[string]int `json:"jobs_by_status"`
	// FailureReasons counts the failed jobs by failure reason (the flaky
	// job's first attempts are script failures by design).
	FailureReasons map[string]int `json:"failure_reasons"`
	// FailureSamples show, for up to 10 failed jobs other than the flaky
	// job's first attempts, the end of their logs: what the faults did.
	FailureSamples []string       `json:"failure_samples,omitempty"`
	Faults         map[string]int `json:"faults"`
	DurationSec    float64        `json:"duration_seconds"`
	Lost           int            `json:"lost"`
	Stuck          int            `json:"stuck"`
	Duplicated     int            `json:"duplicated"`
	TraceErrors    int            `json:"trace_errors"`
	ArtifactsLost  int            `json:"artifacts_lost"`
	Orphaned       int            `json:"orphaned"`
	Inconsistent   int            `json:"inconsistent_pipelines"`
	Violations     []string       `json:"violations,omitempty"`
}

// OK reports whether no invariant was violated.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) violate(counter *int, format string, args ...any) {
	*counter++
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// run is one chaos run.
type run struct {
	o      Options
	rng    *mrand.Rand
	rngMu  sync.Mutex
	admin  string
	direct *client.Client // to the coordinator, around the proxy
	coord  *process
	runs   []*process
	proxy  *Proxy
	logs   *os.File
	rep    *Report

	// shorts are the runners' short tokens (their marker scopes).
	shorts []string

	mu        sync.Mutex
	pipelines []*submitted
}

// submitted is a pipeline the workload created.
type submitted struct {
	id, project int64
	lines       int
}

func (o *Options) defaults() error {
	if o.Binary == "" {
		return errors.New("chaos: no berth binary")
	}
	if o.Dir == "" {
		return errors.New("chaos: no directory")
	}
	if o.Jobs <= 0 {
		o.Jobs = 100
	}
	if o.Runners <= 0 {
		o.Runners = 2
	}
	if o.Concurrent <= 0 {
		o.Concurrent = 4
	}
	switch o.Executor {
	case "":
		o.Executor = "shell"
	case "shell":
	case "docker":
		if o.Image == "" || o.DockerHost == "" {
			return errors.New("chaos: the docker executor needs an image and the Docker bridge's address")
		}
	case "instance":
	default:
		return fmt.Errorf("chaos: executor %q is not shell, docker or instance", o.Executor)
	}
	if len(o.Faults) == 0 {
		for _, f := range AllFaults {
			if f != FaultKillPlugin || o.Executor == "instance" {
				o.Faults = append(o.Faults, f)
			}
		}
	}
	if containsString(o.Faults, FaultKillPlugin) && o.Executor != "instance" {
		return fmt.Errorf("chaos: fault %s needs the instance executor (only it has a fleeting plugin)", FaultKillPlugin)
	}
	for _, f := range o.Faults {
		if !containsString(AllFaults, f) {
			return fmt.Errorf("chaos: unknown fault %q (known: %s)", f, strings.Join(AllFaults, ", "))
		}
	}
	if o.FaultEvery <= 0 {
		o.FaultEvery = 2 * time.Second
	}
	if o.StuckTimeout <= 0 {
		o.StuckTimeout = 15 * time.Second
	}
	if o.Drain <= 0 {
		o.Drain = 3*time.Minute + 4*o.StuckTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Run runs the workload with faults and returns what the checks found.
// An error means the run itself could not be carried out.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	o.Dir = abs
	r := &run{o: o, rng: mrand.New(mrand.NewPCG(o.Seed, 0xc4a05)),
		rep: &Report{Seed: o.Seed, Faults: map[string]int{}, JobsByStatus: map[string]int{}, FailureReasons: map[string]int{}}}
	start := time.Now()
	defer r.shutdown()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	faultsDone := make(chan struct{})
	stopFaults := make(chan struct{})
	go func() { defer close(faultsDone); r.faultLoop(ctx, stopFaults) }()
	werr := r.workload(ctx)
	close(stopFaults)
	<-faultsDone
	if werr != nil {
		return nil, werr
	}
	if err := r.heal(ctx); err != nil {
		return nil, err
	}
	r.progress("faults stopped; draining")
	r.drain(ctx)
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	r.stopComponents()
	r.checkOrphans()
	r.rep.DurationSec = math.Round(time.Since(start).Seconds()*10) / 10
	return r.rep, nil
}

func (r *run) progress(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "chaos: "+format+"\n", args...)
}

func (r *run) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

func (r *run) perm(n int) []int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.Perm(n)
}

// jitter is d ±50 %.
func (r *run) jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(r.intn(int(d)+1))
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (r *run) setup(ctx context.Context) error {
	for _, d := range []string{"ran", "flaky", "cache"} {
		if err := os.MkdirAll(filepath.Join(r.o.Dir, d), 0o755); err != nil {
			return err
		}
	}
	logs, err := os.OpenFile(filepath.Join(r.o.Dir, "components.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	r.logs = logs
	var b [16]byte
	_, _ = rand.Read(b[:])
	r.admin = "glpat-chaos" + hex.EncodeToString(b[:])
	port, err := freePort()
	if err != nil {
		return err
	}
	target := "127.0.0.1:" + strconv.Itoa(port)
	proxyHost := "127.0.0.1"
	if r.o.Executor == "docker" {
		proxyHost = r.o.DockerHost
	}
	if r.proxy, err = NewProxy(proxyHost, target, r.o.Seed); err != nil {
		return err
	}
	directURL := "http://" + target
	proxyURL := "http://" + r.proxy.Addr()
	r.direct = client.New(directURL, r.admin)
	r.coord = &process{name: "coordinator", bin: r.o.Binary, log: r.logs, args: []string{"server",
		"--listen", target, "--data", filepath.Join(r.o.Dir, "coordinator"), "--admin-token", r.admin,
		"--external-url", proxyURL, "--stuck-timeout", r.o.StuckTimeout.String(), "--ack-timeout", "10s",
		"--reap-interval", "1s", "--shutdown-timeout", "5s", "--log-format", "json", "--log-level", "warn"},
		ready: func(ctx context.Context) error {
			_, err := r.direct.Queue(ctx)
			return err
		}}
	if err := r.coord.start(ctx); err != nil {
		return err
	}
	r.progress("coordinator on %s, proxy on %s", target, r.proxy.Addr())
	untagged := true
	for i := range r.o.Runners {
		tok, err := r.direct.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type", RunUntagged: &untagged, Description: fmt.Sprintf("chaos-%d", i)})
		if err != nil {
			return fmt.Errorf("creating runner %d: %w", i, err)
		}
		r.shorts = append(r.shorts, token.Short(tok.Token))
		dir := filepath.Join(r.o.Dir, fmt.Sprintf("runner-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		cfg := fmt.Sprintf(`concurrent = %d
check_interval = 1
shutdown_timeout = 10
log_level = "warn"
log_format = "json"

[[runners]]
  name = "chaos-%d"
  url = %q
  token = %q
  executor = %q
  builds_dir = %q
  cache_dir = %q
  request_concurrency = 2
  unhealthy_interval = "5s"
  job_status_final_update_retry_limit = 40
  environment = [%q]
`, r.o.Concurrent, i, proxyURL, tok.Token, r.o.Executor, filepath.Join(dir, "builds"), filepath.Join(r.o.Dir, "cache"), "CHAOS_DIR="+r.o.Dir)
		if r.o.Executor == "instance" {
			// Instances are machines of their own: each builds under its
			// home. The cache and the run's directory are on this machine,
			// which the local plugin's instances share.
			cfg = strings.Replace(cfg, fmt.Sprintf("  builds_dir = %q\n", filepath.Join(dir, "builds")), "", 1)
			cfg += fmt.Sprintf(`  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = %d
    max_instances = 2
    delete_instances_on_shutdown = true
    shutdown_deletion_interval = "1s"
    update_interval = "1s"
    update_interval_when_expecting = "200ms"
    [runners.autoscaler.plugin_config]
      state_dir = %q
      name = "chaos%d"
      max_instances = 3
    [runners.autoscaler.state_storage]
      enabled = true
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "30s"
`, (r.o.Concurrent+1)/2, filepath.Join(dir, "fleeting"), i)
		}
		if r.o.Executor == "docker" {
			// Jobs record their starts in the run's directory: it is
			// mounted at the same path in every job container.
			cfg = strings.Replace(cfg, fmt.Sprintf("  builds_dir = %q\n  cache_dir = %q\n", filepath.Join(dir, "builds"), filepath.Join(r.o.Dir, "cache")), "", 1)
			cfg += fmt.Sprintf("  [runners.docker]\n    image = %q\n    pull_policy = \"if-not-present\"\n    volumes = [%q]\n", r.o.Image, r.o.Dir+":"+r.o.Dir)
		}
		path := filepath.Join(dir, "config.toml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return err
		}
		p := &process{name: fmt.Sprintf("runner-%d", i), bin: r.o.Binary, log: r.logs, args: []string{"runner", "run", "-c", path}}
		if err := p.start(ctx); err != nil {
			return err
		}
		r.runs = append(r.runs, p)
	}
	r.progress("%d runner managers × %d jobs", r.o.Runners, r.o.Concurrent)
	return nil
}

// workload creates the pipelines, a bounded number at a time, cancels
// some and plays manual jobs in others.
func (r *run) workload(ctx context.Context) error {
	proj, err := r.direct.CreateProject(ctx, restapi.CreateProjectRequest{Path: "chaos/app"})
	if err != nil {
		return fmt.Errorf("creating the project: %w", err)
	}
	src := filepath.Join(r.o.Dir, "src")
	os.MkdirAll(src, 0o755)
	if err := os.WriteFile(filepath.Join(src, ".gitlab-ci.yml"), []byte(ciConfig), 0o644); err != nil {
		return err
	}
	tmp := filepath.Join(r.o.Dir, "push")
	repo, err := gitrepo.Init(ctx, tmp, "main")
	if err != nil {
		return err
	}
	if _, _, err := gitrepo.CommitDir(ctx, repo.Dir, src, "main", "chaos workload", gitrepo.Author{}); err != nil {
		return err
	}
	remote := gitrepo.Remote{URL: r.direct.BaseURL + "/chaos/app.git", User: "chaos", Password: r.admin}
	if err := gitrepo.Push(ctx, repo.Dir, remote, "main", "ci.skip"); err != nil {
		return fmt.Errorf("pushing the workload: %w", err)
	}
	n := (r.o.Jobs + jobsPerPipeline - 1) / jobsPerPipeline
	inflight := max(2, r.o.Runners*r.o.Concurrent)
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		lines := 5 + r.intn(40)
		sleep := fmt.Sprintf("%.1f", float64(r.intn(20))/10)
		cancel := r.intn(20) == 0
		play := r.intn(2) == 0
		var pl *restapi.PipelineJSON
		err := retry(ctx, func() error {
			var err error
			pl, err = r.direct.CreatePipeline(ctx, proj.ID, restapi.CreatePipelineRequest{Ref: "main", Variables: []restapi.PipelineVariable{
				{Key: "LINES", Value: strconv.Itoa(lines)}, {Key: "SLEEP", Value: sleep}}})
			return err
		})
		if err != nil {
			return fmt.Errorf("creating pipeline %d: %w", i+1, err)
		}
		r.mu.Lock()
		r.pipelines = append(r.pipelines, &submitted{id: pl.ID, project: proj.ID, lines: lines})
		r.mu.Unlock()
		if (i+1)%max(1, n/10) == 0 {
			r.progress("%d/%d pipelines created", i+1, n)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r.follow(ctx, proj.ID, pl.ID, cancel, play)
		}()
	}
	wg.Wait()
	return nil
}

// retry retries fn while the coordinator is down (killed or paused by a
// fault), up to a minute.
func retry(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Status < 500 {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// follow waits for a pipeline to finish (or until it gives up), canceling
// it or playing its manual job on the way.
func (r *run) follow(ctx context.Context, project, id int64, cancel, play bool) {
	if cancel {
		time.Sleep(r.jitter(time.Second))
		_ = retry(ctx, func() error { _, err := r.direct.CancelPipeline(ctx, project, id); return err })
	}
	played := !play
	deadline := time.Now().Add(r.o.Drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		pl, err := r.direct.Pipeline(ctx, id)
		if err == nil && finished(pl.Status) {
			return
		}
		if !played {
			if jobs, err := r.direct.PipelineJobs(ctx, project, id); err == nil {
				for _, j := range jobs {
					if j.Name == "manual" && j.Status == "manual" && !j.Retried {
						if _, err := r.direct.PlayJob(ctx, project, j.ID); err == nil {
							played = true
						}
					}
				}
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func finished(status string) bool {
	switch status {
	case "success", "failed", "canceled", "skipped":
		return true
	}
	return false
}

// firstPassTries bounds how often one fault of the first pass is tried
// when it cannot be injected yet (a plugin not started, say).
const firstPassTries = 20

// faultLoop injects faults until stop is closed: first every fault once,
// in a seeded order (whatever the run's length, each kind is exercised;
// stop waits for this pass), then faults drawn at random.
func (r *run) faultLoop(ctx context.Context, stop <-chan struct{}) {
	var first []string
	for _, i := range r.perm(len(r.o.Faults)) {
		first = append(first, r.o.Faults[i])
	}
	tries := map[string]int{}
	for {
		stopping := stop
		if len(first) > 0 {
			stopping = nil // the first pass finishes before stop counts
		}
		select {
		case <-stopping:
			return
		case <-ctx.Done():
			return
		case <-time.After(r.jitter(r.o.FaultEvery)):
		}
		var f string
		if len(first) > 0 {
			f, first = first[0], first[1:]
		} else {
			f = r.o.Faults[r.intn(len(r.o.Faults))]
		}
		if err := r.inject(ctx, f); err != nil {
			r.progress("fault %s: %v", f, err)
			if tries[f]++; tries[f] < firstPassTries && r.rep.Faults[f] == 0 {
				first = append(first, f) // not injected yet: again later
			}
			continue
		}
		r.mu.Lock()
		r.rep.Faults[f]++
		r.mu.Unlock()
	}
}

// inject applies one fault and undoes it (restart, SIGCONT, proxy back
// to faithful) before it returns.
func (r *run) inject(ctx context.Context, f string) error {
	down := r.jitter(1500 * time.Millisecond)
	switch f {
	case FaultKillCoordinator:
		r.coord.kill()
		time.Sleep(down)
		return r.coord.start(ctx)
	case FaultPauseCoordinator:
		if err := r.coord.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(2 * down)
		return r.coord.signal(syscall.SIGCONT)
	case FaultKillRunner:
		p := r.runs[r.intn(len(r.runs))]
		p.kill()
		time.Sleep(down)
		return p.start(ctx)
	case FaultPauseRunner:
		p := r.runs[r.intn(len(r.runs))]
		if err := p.signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(2 * down)
		return p.signal(syscall.SIGCONT)
	case FaultKillPlugin:
		p := r.runs[r.intn(len(r.runs))]
		pid := pluginOf(p.pid())
		if pid == 0 {
			return fmt.Errorf("%s has no fleeting plugin process now", p.name)
		}
		return syscall.Kill(pid, syscall.SIGKILL)
	default:
		r.proxy.SetMode(f)
		time.Sleep(2 * down)
		r.proxy.SetMode(FaultNone)
	}
	return nil
}

// pluginOf is the fleeting plugin process a runner manager started
// ("berth fleeting-plugin local"), 0 if none.
func pluginOf(manager int) int {
	if manager == 0 {
		return 0
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(manager) {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(cmd), "fleeting-plugin\x00local") && !strings.Contains(string(cmd), local.ServerCommand) {
			return pid
		}
	}
	return 0
}

// heal makes sure every component runs and nothing is paused.
func (r *run) heal(ctx context.Context) error {
	r.proxy.SetMode(FaultNone)
	for _, p := range append([]*process{r.coord}, r.runs...) {
		if p.pid() == 0 {
			if err := p.start(ctx); err != nil {
				return err
			}
			continue
		}
		_ = p.signal(syscall.SIGCONT)
	}
	return nil
}

// drain waits until every pipeline finished or the drain deadline.
func (r *run) drain(ctx context.Context) {
	deadline := time.Now().Add(r.o.Drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		open := 0
		for _, s := range r.pipelines {
			pl, err := r.direct.Pipeline(ctx, s.id)
			if err != nil || !finished(pl.Status) {
				open++
			}
		}
		if open == 0 {
			return
		}
		time.Sleep(time.Second)
	}
}

// check verifies the invariants on the coordinator's final state.
func (r *run) check(ctx context.Context) error {
	rep := r.rep
	rep.Pipelines = len(r.pipelines)
	ran, err := r.runRecords()
	if err != nil {
		return err
	}
	for _, s := range r.pipelines {
		pl, err := r.direct.Pipeline(ctx, s.id)
		if err != nil {
			rep.violate(&rep.Lost, "pipeline %d: %v", s.id, err)
			continue
		}
		jobs, err := r.direct.PipelineJobs(ctx, s.project, s.id)
		if err != nil {
			return fmt.Errorf("listing jobs of pipeline %d: %w", s.id, err)
		}
		if !finished(pl.Status) {
			rep.violate(&rep.Stuck, "pipeline %d still %s after the drain", s.id, pl.Status)
		}
		r.checkPipeline(ctx, s, pl, jobs, ran)
	}
	return nil
}

func (r *run) checkPipeline(ctx context.Context, s *submitted, pl *restapi.PipelineJSON, jobs []restapi.JobJSON, ran map[int64]int) {
	rep := r.rep
	latest := map[string]restapi.JobJSON{}
	for _, j := range jobs {
		rep.Jobs++
		rep.JobsByStatus[j.Status]++
		if j.Status == "failed" {
			rep.FailureReasons[j.FailureReason]++
		}
		if !j.Retried {
			latest[j.Name] = j
		}
		switch j.Status {
		case "success", "failed", "canceled", "skipped", "manual":
		default:
			rep.violate(&rep.Stuck, "job %d (%s) of pipeline %d still %s", j.ID, j.Name, s.id, j.Status)
		}
		if n := ran[j.ID]; n > 1 {
			rep.violate(&rep.Duplicated, "job %d (%s) of pipeline %d started %d times", j.ID, j.Name, s.id, n)
		}
		if j.Status == "success" && ran[j.ID] == 0 {
			rep.violate(&rep.Lost, "job %d (%s) succeeded but its script never ran", j.ID, j.Name)
		}
		if j.FailureReason == "script_failure" && j.ExitCode != nil && *j.ExitCode == artifactLostExit {
			rep.violate(&rep.ArtifactsLost, "job %d (%s) of pipeline %d found its dependency's artifact missing or wrong", j.ID, j.Name, s.id)
		}
		if j.Status == "success" || j.Status == "failed" {
			log := r.checkTrace(ctx, s, j)
			if j.Status == "failed" && j.Name != "flaky" && len(rep.FailureSamples) < 10 {
				rep.FailureSamples = append(rep.FailureSamples, fmt.Sprintf("job %d (%s, %s): …%s", j.ID, j.Name, j.FailureReason, tail(log, 300)))
			}
		}
		if j.Name == "build" && j.Status == "success" {
			r.checkArtifact(ctx, s, j)
		}
	}
	for _, want := range []string{"build", "test 1/2", "test 2/2", "flaky", "manual", "deploy"} {
		if _, ok := latest[want]; !ok {
			rep.violate(&rep.Lost, "pipeline %d has no job %q", s.id, want)
		}
	}
	if !finished(pl.Status) {
		return
	}
	failedHard, canceled := false, false
	for _, j := range latest {
		if j.Status == "failed" && !j.AllowFailure {
			failedHard = true
		}
		if j.Status == "canceled" {
			canceled = true
		}
	}
	switch {
	case pl.Status == "success" && (failedHard || canceled):
		rep.violate(&rep.Inconsistent, "pipeline %d succeeded with a failed or canceled job", s.id)
	case pl.Status == "failed" && !failedHard:
		rep.violate(&rep.Inconsistent, "pipeline %d failed without a failed job", s.id)
	case pl.Status == "canceled" && !canceled:
		rep.violate(&rep.Inconsistent, "pipeline %d canceled without a canceled job", s.id)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}

// checkTrace verifies the numbered lines of a job's log: all of them in
// order for a successful job, an ordered prefix for a failed one. It
// returns the log.
func (r *run) checkTrace(ctx context.Context, s *submitted, j restapi.JobJSON) string {
	var b strings.Builder
	if err := r.direct.Trace(ctx, s.project, j.ID, &b); err != nil {
		r.rep.violate(&r.rep.TraceErrors, "job %d: reading its log: %v", j.ID, err)
		return ""
	}
	prefix := "chaos-line " + strconv.FormatInt(j.ID, 10) + " "
	next := 1
	for _, line := range strings.Split(b.String(), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), prefix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(rest))
		if err != nil || n != next {
			r.rep.violate(&r.rep.TraceErrors, "job %d (%s): log line %q where line %d was due", j.ID, j.Name, line, next)
			return b.String()
		}
		next++
	}
	if j.Status == "success" && next-1 != s.lines {
		r.rep.violate(&r.rep.TraceErrors, "job %d (%s) succeeded with %d of its %d log lines", j.ID, j.Name, next-1, s.lines)
	}
	return b.String()
}

// checkArtifact downloads a successful build's artifact and checks it.
func (r *run) checkArtifact(ctx context.Context, s *submitted, j restapi.JobJSON) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/v4/jobs/%d/artifacts", r.direct.BaseURL, j.ID), nil)
	if err != nil {
		return
	}
	req.Header.Set("PRIVATE-TOKEN", r.admin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.rep.violate(&r.rep.ArtifactsLost, "job %d: downloading its artifact: %v", j.ID, err)
		return
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		r.rep.violate(&r.rep.ArtifactsLost, "job %d: artifact download answered %d", j.ID, res.StatusCode)
		return
	}
	content, err := zipFile(body, "out/a.txt")
	if want := fmt.Sprintf("built-%d\n", s.id); err != nil || content != want {
		r.rep.violate(&r.rep.ArtifactsLost, "job %d: artifact out/a.txt is %q (%v), want %q", j.ID, content, err, want)
	}
}

// zipFile returns the content of name in a zip archive.
func zipFile(archive []byte, name string) (string, error) {
	zr, err := zip.NewReader(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		return "", err
	}
	f, err := zr.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b), err
}

// runRecords counts the starts of every job ($CHAOS_DIR/ran/ID.*).
func (r *run) runRecords() (map[int64]int, error) {
	entries, err := os.ReadDir(filepath.Join(r.o.Dir, "ran"))
	if err != nil {
		return nil, err
	}
	out := map[int64]int{}
	for _, e := range entries {
		id, _, _ := strings.Cut(e.Name(), ".")
		if n, err := strconv.ParseInt(id, 10, 64); err == nil {
			out[n]++
		}
	}
	return out, nil
}

// stopComponents stops the runner managers (they finish no job: none is
// left) and the coordinator.
func (r *run) stopComponents() {
	for _, p := range r.runs {
		p.stop(syscall.SIGQUIT, 30*time.Second)
	}
	r.coord.stop(syscall.SIGTERM, 15*time.Second)
}

// checkOrphans looks for what jobs left after the runners stopped:
// processes carrying a stage marker of one of the run's runners (scope:
// system id and short token, as the shell executor makes it), and
// containers and networks labelled with one of their short tokens.
func (r *run) checkOrphans() {
	if r.o.Executor == "docker" {
		for _, short := range r.shorts {
			filter := "label=com.berth.runner.short_token=" + short
			for _, kind := range []struct {
				what string
				args []string
			}{
				{"container", []string{"ps", "-a", "--filter", filter, "--format", "{{.Names}}"}},
				{"network", []string{"network", "ls", "--filter", filter, "--format", "{{.Name}}"}},
			} {
				out, err := exec.Command("docker", kind.args...).Output()
				if err != nil {
					r.rep.violate(&r.rep.Orphaned, "listing the %ss runner %s left: %v", kind.what, short, err)
					continue
				}
				for _, name := range strings.Fields(string(out)) {
					r.rep.violate(&r.rep.Orphaned, "%s %s of runner %s outlived the runners", kind.what, name, short)
				}
			}
			// Build and cache volumes are kept for the next job by design;
			// the run's runners are gone for good, so are their volumes.
			if out, err := exec.Command("docker", "volume", "ls", "-q", "--filter", "label=com.berth.runner.short_token="+short).Output(); err == nil {
				if vols := strings.Fields(string(out)); len(vols) > 0 {
					exec.Command("docker", append([]string{"volume", "rm"}, vols...)...).Run()
				}
			}
		}
	}
	var scopes []string
	for i := range r.runs {
		b, err := os.ReadFile(filepath.Join(r.o.Dir, fmt.Sprintf("runner-%d", i), ".runner_system_id"))
		if err == nil {
			scopes = append(scopes, strings.TrimSpace(string(b))+"."+r.shorts[i])
		}
	}
	procs, _ := os.ReadDir("/proc")
	var orphans []string
	var envs reap.EnvironReader
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := envs.Read("/proc/" + e.Name())
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			v, ok := strings.CutPrefix(kv, reap.Variable+"=")
			if !ok {
				continue
			}
			for _, s := range scopes {
				if strings.HasPrefix(v, s+".") {
					cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
					orphans = append(orphans, e.Name()+" "+strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
					break
				}
			}
		}
	}
	if r.o.Executor == "instance" {
		// Instances the runners started and every process on them: the
		// runners delete them when they stop.
		for _, e := range procs {
			env, err := envs.Read("/proc/" + e.Name())
			if err != nil {
				continue
			}
			if strings.Contains(string(env), local.InstanceMarkVariable+"="+r.o.Dir+"/") {
				cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
				orphans = append(orphans, e.Name()+" "+strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))+" (on an instance)")
			}
		}
		for i := range r.runs {
			dirs, _ := filepath.Glob(filepath.Join(r.o.Dir, fmt.Sprintf("runner-%d", i), "fleeting", "instances", "*"))
			for _, d := range dirs {
				r.rep.violate(&r.rep.Orphaned, "instance %s outlived its runner", filepath.Base(d))
			}
		}
	}
	sort.Strings(orphans)
	for _, o := range orphans {
		r.rep.violate(&r.rep.Orphaned, "process %s outlived the runners", o)
	}
}

// shutdown releases everything, whatever happened.
func (r *run) shutdown() {
	if r.proxy != nil {
		r.proxy.Close()
	}
	for _, p := range r.runs {
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
	if r.coord != nil {
		r.coord.stop(syscall.SIGTERM, 10*time.Second)
	}
	if r.logs != nil {
		r.logs.Close()
	}
}
