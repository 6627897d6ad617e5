// Package local runs a pipeline on this machine: an embedded coordinator
// (SQLite in a temporary directory, served on loopback) and an embedded
// runner manager, wired together over the real Runner API. It is what
// `berth run` does — and what `gitlab-runner exec` was, with the full
// semantics of a pipeline (needs, artifacts, cache, rules, matrix).
package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/token"
)

// Options configure Run.
type Options struct {
	// Dir holds the .gitlab-ci.yml and the files committed to the project.
	Dir string
	// Jobs, if set, limits the pipeline to these jobs and what they need.
	Jobs []string
	// Variables are pipeline variables (highest precedence).
	Variables []pipelines.PipelineVariable
	// Executor runs the jobs: "" (auto: a job with image: runs in it with
	// docker when a Docker engine is reachable, every other job in the
	// shell), "shell" (every job in the shell, images ignored) or
	// "docker" (every job in a container; a job without image: gets
	// DockerImage).
	Executor string
	// DockerImage is the image of jobs without image: under
	// Executor "docker".
	DockerImage string
	// MicroVM, if set, runs the jobs that ask for isolation microvm (or
	// vm, when it offers that level) under Executor "" with a Docker
	// engine (images become VM images through it). It stays the
	// caller's: Run does not shut it down.
	MicroVM executor.Provider
	// MicroVMUnavailable says why there is no MicroVM, for a job that
	// asks for one.
	MicroVMUnavailable string
	// Provider, if set, runs every job instead of the executors Executor
	// picks (embedding: another executor, such as ssh or custom), under
	// the runner executor name ProviderName.
	Provider     executor.Provider
	ProviderName string
	// ConfigureRunner, if set, completes the embedded runner's
	// [[runners]] entry (the section of ProviderName's executor).
	ConfigureRunner func(*config.Runner)
	// ListenHost is where the embedded coordinator listens with Provider
	// (default 127.0.0.1; an address containers reach for a driver that
	// runs jobs in them).
	ListenHost string
	// Warnings receives what the user should know once (nil: Logs).
	Warnings io.Writer
	// Concurrency bounds jobs running at once (default: number of CPUs).
	Concurrency int
	// Ref is the branch the directory is committed to (default main).
	Ref string
	// Source is the pipeline's CI_PIPELINE_SOURCE (default push), for
	// rules that test it: "schedule" runs what a scheduled pipeline
	// would.
	Source string
	// Logs receives every job's log, each line prefixed by the job name.
	Logs io.Writer
	// Progress, if set, receives a live status line (redrawn in place when
	// TTY is set, else one line per change).
	Progress io.Writer
	// TTY keeps colours in job logs and redraws the progress line.
	TTY bool
	// Logger receives the embedded components' logs (nil: discarded).
	Logger *slog.Logger
	// Version is the runner version reported in job logs.
	Version string
	// Timings, if set, records where the run's time went in
	// Result.Timings (berth run --timings).
	Timings bool
	// KeepDir, if set, keeps the shell executor's build directories
	// between runs (see KeepDir); "" starts from none and removes them.
	KeepDir string
	// UI, if set, serves the coordinator's web UI on loopback while the
	// run lasts (berth run --ui).
	UI *UIOptions
	// SnapshotDir, if set, receives the VM snapshots failed jobs left
	// (BERTH_SNAPSHOT=on_failure, docs/snapshots.md) before the embedded
	// coordinator goes, as job-<id>.tar.zst; JobResult.Snapshot names
	// each. At most keptSnapshots stay there, the newest.
	SnapshotDir string
}

// UIOptions serve the web UI of a local run.
type UIOptions struct {
	// Listen is the loopback address to serve it on (default
	// 127.0.0.1:0, a free port).
	Listen string
	// Ready receives, once the pipeline exists, a one-time URL that signs
	// the browser in and leads to the pipeline (valid 15 minutes).
	Ready func(url string)
	// Hold, if set, is called with the result when the pipeline is done;
	// the UI stays up until it returns (berth run waits for Ctrl-C).
	Hold func(ctx context.Context, res *Result)
}

// Result is the outcome of a run.
type Result struct {
	PipelineID int64       `json:"pipeline_id"`
	Status     string      `json:"status"`
	Duration   float64     `json:"duration_seconds"`
	Jobs       []JobResult `json:"jobs"`
	// Timings is set when Options.Timings asked for it.
	Timings *Timings `json:"timings,omitempty"`
	// Tests is the pipeline's test report, when its jobs uploaded JUnit
	// reports (artifacts:reports:junit).
	Tests *TestsResult `json:"tests,omitempty"`
}

// TestsResult is a pipeline's test report in short.
type TestsResult struct {
	Total   int     `json:"total"`
	Passed  int     `json:"passed"`
	Failed  int     `json:"failed"`
	Errors  int     `json:"errors"`
	Skipped int     `json:"skipped"`
	Seconds float64 `json:"seconds"`
	// Failures are the failed and erroring tests; SuiteErrors the
	// reports that could not be read.
	Failures    []TestFailure `json:"failures,omitempty"`
	SuiteErrors []string      `json:"suite_errors,omitempty"`
}

// TestFailure is a failed or erroring test: its suite (the job), class
// and name.
type TestFailure struct {
	Status    string `json:"status"`
	Suite     string `json:"suite"`
	Classname string `json:"classname,omitempty"`
	Name      string `json:"name"`
}

// testsResult shortens a test report; nil when it has no suite.
func testsResult(rep *restapi.TestReportJSON) *TestsResult {
	if rep == nil || len(rep.TestSuites) == 0 {
		return nil
	}
	out := &TestsResult{Total: rep.TotalCount, Passed: rep.SuccessCount, Failed: rep.FailedCount, Errors: rep.ErrorCount,
		Skipped: rep.SkippedCount, Seconds: rep.TotalTime}
	for _, s := range rep.TestSuites {
		if s.SuiteError != nil {
			out.SuiteErrors = append(out.SuiteErrors, s.Name+": "+*s.SuiteError)
		}
		for _, c := range s.TestCases {
			if c.Status == "failed" || c.Status == "error" {
				out.Failures = append(out.Failures, TestFailure{Status: c.Status, Suite: s.Name, Classname: c.Classname, Name: c.Name})
			}
		}
	}
	return out
}

// JobResult is one job of the run.
type JobResult struct {
	ID            int64   `json:"id"`
	Name          string  `json:"name"`
	Stage         string  `json:"stage"`
	Status        string  `json:"status"`
	AllowFailure  bool    `json:"allow_failure"`
	Duration      float64 `json:"duration_seconds"`
	FailureReason string  `json:"failure_reason,omitempty"`
	ExitCode      int     `json:"exit_code,omitempty"`
	// Snapshot is the file of the VM snapshot the job left when it
	// failed (Options.SnapshotDir): `berth debug --bundle` restores it.
	Snapshot string `json:"snapshot,omitempty"`
	// Downstream is the pipeline a trigger job created (its jobs ran
	// in this run too).
	Downstream *Result `json:"downstream,omitempty"`
}

// Succeeded reports whether the pipeline succeeded.
func (r *Result) Succeeded() bool { return r.Status == string(store.StatusSuccess) }

// ErrNoConfig is returned when the directory has no .gitlab-ci.yml.
var ErrNoConfig = errors.New("no .gitlab-ci.yml")

// ConfigError is returned when the pipeline configuration is invalid; it
// lists every error as file:line:col: message.
type ConfigError struct{ Errors string }

func (e *ConfigError) Error() string { return "invalid pipeline configuration:\n" + e.Errors }

// Run commits opts.Dir to a project of an embedded coordinator, runs its
// pipeline with an embedded runner, streams the jobs' logs and returns the
// result. Canceling ctx cancels the pipeline (running jobs run their
// after_script) and returns ctx's error with the result so far.
func Run(ctx context.Context, opts Options) (*Result, error) {
	var tm *timer
	if opts.Timings {
		tm = newTimer()
	}
	res, err := run(ctx, opts, tm)
	if res != nil && tm != nil {
		// What run's deferred calls did after the last phase: stopping
		// the runner and the coordinator, removing the directory.
		tm.mark("shutdown")
		res.Timings = tm.result()
	}
	return res, err
}

func run(ctx context.Context, opts Options, tm *timer) (*Result, error) {
	switch opts.Executor {
	case "", "shell", "docker":
	default:
		return nil, fmt.Errorf("executor %q is not available in berth run (shell or docker)", opts.Executor)
	}
	if opts.Warnings == nil {
		opts.Warnings = opts.Logs
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = runtime.NumCPU()
	}
	if opts.Ref == "" {
		opts.Ref = "main"
	}
	if opts.Logs == nil {
		opts.Logs = io.Discard
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(filepath.Join(dir, ".gitlab-ci.yml")); err != nil || st.IsDir() {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoConfig)
	}

	tmp, err := os.MkdirTemp("", "berth-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	// The executors (finding a Docker engine takes tens of milliseconds)
	// are made while the coordinator opens its store; the coordinator
	// listens where they say once they are ready.
	type made struct {
		exec *executors
		err  error
	}
	ready := make(chan made, 1)
	if opts.Provider != nil {
		host := opts.ListenHost
		if host == "" {
			host = "127.0.0.1"
		}
		ready <- made{exec: &executors{provider: opts.Provider, name: opts.ProviderName, listenHost: host, close: func(executor.SweepOptions) {}}}
	} else {
		go func() {
			e, err := newExecutors(ctx, opts, log)
			ready <- made{e, err}
		}()
	}
	var exec *executors
	await := func() error {
		if exec == nil {
			m := <-ready
			if m.err != nil {
				return m.err
			}
			exec = m.exec
		}
		return nil
	}
	// The run's one-off runner: its identity names what it leaves.
	systemID := config.NewSystemID("")
	var runnerIdentity executor.SweepOptions
	defer func() {
		if await() == nil {
			exec.close(runnerIdentity)
		}
	}()
	// The run's data goes with the run: nothing is made durable.
	srv, err := embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(tmp, "coordinator"), Ephemeral: true,
		// Jobs in containers reach the coordinator at an address of this
		// host on Docker's bridge, not on loopback.
		Listen: func() (net.Listener, error) {
			if err := await(); err != nil {
				return nil, err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(exec.listenHost, "0"))
			if err != nil {
				return nil, fmt.Errorf("listening on %s: %w", exec.listenHost, err)
			}
			return ln, nil
		},
		Logger: log.With("component", "coordinator"),
		Config: coordinator.Config{TraceUpdateInterval: time.Second, LongPollTimeout: 10 * time.Second}})
	if err != nil {
		return nil, err
	}
	if err := await(); err != nil { // Open may have failed before listening
		return nil, err
	}
	defer srv.Shutdown(context.Background())
	base := srv.URL
	tm.mark("start")

	// The runner, registered through the admin API like any other.
	adminTok, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		return nil, err
	}
	runnerTok, err := createRunner(ctx, base, adminTok)
	if err != nil {
		return nil, fmt.Errorf("creating the embedded runner: %w", err)
	}
	runnerIdentity = executor.SweepOptions{SystemID: systemID, ShortToken: token.Short(runnerTok)}
	var author gitrepo.Author
	if opts.KeepDir != "" {
		// This runner's build directories are those earlier runs kept;
		// they go back once the runner has stopped (this defer runs
		// after the runner's).
		builds := filepath.Join(tmp, "builds", token.Short(runnerTok))
		if k, ok := borrowKept(opts.KeepDir, builds); ok {
			defer k.giveBack(builds)
			author.DateFor = k.commitDate
		}
	}
	rcfg := &config.Config{Concurrent: opts.Concurrency, Runners: []*config.Runner{{
		Name: "berth-run", URL: base, Token: runnerTok, Executor: exec.name,
		BuildsDir: filepath.Join(tmp, "builds"), CacheDir: filepath.Join(tmp, "cache"),
	}}}
	if opts.ConfigureRunner != nil {
		opts.ConfigureRunner(rcfg.Runners[0])
	}
	mgr, err := runner.New(rcfg, runner.Options{
		Logger:            log.With("component", "runner"),
		NewProvider:       func(*config.Runner) (executor.Provider, error) { return exec.provider, nil },
		Version:           opts.Version,
		SystemID:          systemID,
		PollInterval:      100 * time.Millisecond,
		TraceInterval:     time.Second,
		ForceSendInterval: time.Second,
		OnJobTiming: func(t runner.JobTiming) {
			if tm != nil {
				tm.job(t)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("starting the embedded runner: %w", err)
	}
	runCtx, stopRunner := context.WithCancel(context.WithoutCancel(ctx))
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- mgr.Run(runCtx) }()
	defer func() {
		// Stop asking for jobs and let the runner return; abort what is
		// left only if it does not.
		mgr.Stop()
		select {
		case <-runnerDone:
		case <-time.After(10 * time.Second):
			stopRunner()
			<-runnerDone
		}
		stopRunner()
	}()

	tm.mark("runner")

	// The project, the commit and the pipeline.
	project, err := srv.Pipelines().CreateProject(ctx, pipelines.ProjectSpec{Path: projectPath(dir)})
	if err != nil {
		return nil, fmt.Errorf("creating the project: %w", err)
	}
	sha, err := srv.Pipelines().CommitDirAs(ctx, project.ID, opts.Ref, dir, "berth run", author)
	if err != nil {
		return nil, fmt.Errorf("committing %s: %w", dir, err)
	}
	tm.mark("commit")
	pl, err := srv.Pipelines().CreatePipeline(ctx, pipelines.PipelineRequest{
		ProjectID: project.ID, Ref: opts.Ref, Sha: sha, Source: cmp.Or(opts.Source, pipelines.SourcePush), Variables: opts.Variables, Jobs: opts.Jobs,
		StoreConfigErrors: true,
	})
	if err != nil {
		return nil, err
	}
	if pl.YAMLErrors != "" {
		return nil, &ConfigError{Errors: pl.YAMLErrors}
	}
	tm.mark("pipeline")

	if opts.UI != nil {
		stopUI, err := serveUI(ctx, srv, adminTok, pl.ID, opts.UI)
		if err != nil {
			return nil, err
		}
		defer stopUI()
	}
	w := newWatcher(srv.Logs(), opts)
	start := time.Now()
	last, werr := follow(ctx, srv.Server, pl.ID, w)
	var unservable *UnservableError
	if errors.As(werr, &unservable) || (werr != nil && ctx.Err() != nil) {
		// Interrupted, or a job nobody here can take: cancel the pipeline (running jobs run their
		// after_script) and follow it to its end.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if _, err := srv.Pipelines().CancelPipeline(cctx, pl.ID); err == nil {
			if ps, err := follow(cctx, srv.Server, pl.ID, w); err == nil {
				last = ps
			}
		}
		cancel()
	} else if werr != nil {
		return nil, werr
	}
	w.finish(context.WithoutCancel(ctx), last)
	tm.mark("jobs")
	res := result(last, time.Since(start))
	api := client.New(base, adminTok)
	if res.PipelineID != 0 {
		rep, err := api.TestReport(context.WithoutCancel(ctx), project.ID, res.PipelineID)
		if err != nil {
			fmt.Fprintf(opts.Warnings, "berth run: reading the test report: %v\n", err)
		}
		res.Tests = testsResult(rep)
	}
	if opts.SnapshotDir != "" {
		saveSnapshots(context.WithoutCancel(ctx), api, project.ID, opts.SnapshotDir, res, opts.Warnings)
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if opts.UI != nil && opts.UI.Hold != nil {
		opts.UI.Hold(ctx, res)
	}
	if unservable != nil {
		switch unservable.Level {
		case executor.IsolationCgroups, executor.IsolationContainer:
			unservable.hint = "a job asking for containers needs Docker: berth run --executor docker"
		case executor.IsolationMicroVM:
			unservable.hint = "microVM jobs need root, QEMU, a kernel in /boot and a Docker engine"
			if opts.MicroVMUnavailable != "" {
				unservable.hint += ": " + opts.MicroVMUnavailable
			}
		case executor.IsolationVM:
			unservable.hint = "berth run offers microVMs, not full VMs"
		case executor.IsolationInstance:
			unservable.hint = "an instance of its own is for an autoscaled runner, not a local run"
		}
		return res, unservable
	}
	return res, nil
}

func createRunner(ctx context.Context, base, adminTok string) (string, error) {
	c := client.New(base, adminTok)
	resp, err := c.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: "berth run"})
	if err != nil {
		return "", err
	}
	return resp.Token, nil
}

// projectPath names the project after the directory ("local/<dir>").
func projectPath(dir string) string {
	name := strings.ToLower(filepath.Base(dir))
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	n := strings.Trim(b.String(), "-.")
	if n == "" {
		n = "project"
	}
	return "local/" + n
}

func result(t *tree, d time.Duration) *Result {
	res := &Result{Duration: d.Seconds(), Jobs: []JobResult{}}
	if t == nil {
		return res
	}
	ps := t.PipelineState
	if ps.Pipeline != nil {
		res.PipelineID, res.Status = ps.Pipeline.ID, string(ps.Pipeline.Status)
		if !ps.Pipeline.StartedAt.IsZero() && !ps.Pipeline.FinishedAt.IsZero() && t.depth > 0 {
			res.Duration = ps.Pipeline.FinishedAt.Sub(ps.Pipeline.StartedAt).Seconds()
		}
	}
	for _, j := range latestJobs(ps.Jobs) {
		jr := JobResult{ID: j.ID, Name: j.Name, Stage: j.Stage, Status: string(j.Status), AllowFailure: graph.AllowedToFail(j),
			FailureReason: j.FailureReason}
		if j.Status == store.StatusFailed {
			jr.ExitCode = j.ExitCode
		}
		if !j.StartedAt.IsZero() && !j.FinishedAt.IsZero() {
			jr.Duration = j.FinishedAt.Sub(j.StartedAt).Seconds()
		}
		if sub := t.downstream[j.ID]; sub != nil {
			jr.Downstream = result(sub, 0)
		}
		res.Jobs = append(res.Jobs, jr)
	}
	return res
}

// latestJobs drops jobs a retry replaced and orders by id.
func latestJobs(jobs []*store.Job) []*store.Job {
	out := make([]*store.Job, 0, len(jobs))
	for _, j := range jobs {
		if !j.Retried {
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// unservableGrace is how long a job may stay pending for an isolation
// level nobody offers before berth run gives up on it.
const unservableGrace = 3 * time.Second

// UnservableError is a job of the run that no runner of the run can take
// (it asks for an isolation level they do not offer).
type UnservableError struct {
	Job    string
	Level  executor.Isolation // what the job asks for
	Reason string             // the coordinator's pending reason
	hint   string             // what it takes
}

func (e *UnservableError) Error() string {
	if e.hint == "" {
		return fmt.Sprintf("job %s cannot run here: %s", e.Job, e.Reason)
	}
	return fmt.Sprintf("job %s cannot run here: %s (%s)", e.Job, e.Reason, e.hint)
}

// recheckInterval is how often a run whose jobs wait for an isolation
// level looks again whether the runner offers it (nothing signals that).
const recheckInterval = 200 * time.Millisecond

// tree is a pipeline with the downstream pipelines its trigger jobs
// created, by bridge job id.
type tree struct {
	pipelines.PipelineState
	downstream map[int64]*tree
	depth      int
	prefix     string // shown before job names: "bridge › "
}

// loadTree reads a pipeline and, recursively, its downstream pipelines.
func loadTree(ctx context.Context, srv *coordinator.Server, id int64, depth int, prefix string) (*tree, error) {
	ps, err := srv.Pipelines().PipelineState(ctx, id)
	if err != nil {
		return nil, err
	}
	t := &tree{PipelineState: ps, downstream: map[int64]*tree{}, depth: depth, prefix: prefix}
	ds, err := srv.Pipelines().DownstreamPipelines(ctx, id)
	if err != nil {
		return nil, err
	}
	names := map[int64]string{}
	for _, j := range ps.Jobs {
		names[j.ID] = j.Name
	}
	for _, d := range ds {
		sub, err := loadTree(ctx, srv, d.ID, depth+1, prefix+names[d.SourceJobID]+" › ")
		if err != nil {
			return nil, err
		}
		t.downstream[d.SourceJobID] = sub
	}
	return t, nil
}

// all returns the pipelines of the tree, the top first.
func (t *tree) all() []*tree {
	out := []*tree{t}
	for _, j := range t.Jobs {
		if sub := t.downstream[j.ID]; sub != nil {
			out = append(out, sub.all()...)
		}
	}
	return out
}

// done reports whether every pipeline of the tree is finished, or
// waits for a manual job nobody will play here (blocked: that is the end
// of a local run).
func (t *tree) done() bool {
	for _, p := range t.all() {
		if st := p.Pipeline.Status; !st.Finished() && st != store.StatusManual {
			return false
		}
	}
	return true
}

// follow feeds the watcher until the pipeline and its downstream
// pipelines are finished and returns their last state.
func follow(ctx context.Context, srv *coordinator.Server, id int64, w *watcher) (*tree, error) {
	var last *tree
	unservable := map[int64]time.Time{} // pending jobs no runner here can take, since
	ids := []int64{id}
	for {
		// Every pipeline of the tree wakes the run when it changes (a job's
		// status or log): taken before reading, so nothing is missed. A
		// new child pipeline shows as its trigger job changing.
		cases := make([]reflect.SelectCase, 0, len(ids)+2)
		for _, pid := range ids {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(srv.Pipelines().PipelineChanged(pid))})
		}
		t, err := loadTree(ctx, srv, id, 0, "")
		if err != nil {
			return last, err
		}
		last = t
		w.update(ctx, t)
		if t.done() {
			return last, nil
		}
		ids = ids[:0]
		for _, p := range t.all() {
			ids = append(ids, p.Pipeline.ID)
		}
		// A job asking for an isolation level this run's runner does not
		// offer would wait forever: once the coordinator says so for a
		// while (the runner has asked for jobs by then), the run ends.
		now := time.Now()
		var jobs []*store.Job
		for _, p := range t.all() {
			jobs = append(jobs, p.Jobs...)
		}
		levelWait := false
		for _, j := range jobs {
			wait := srv.Dispatch().IsolationWaitOf(j)
			levelWait = levelWait || wait != nil
			if wait == nil || len(wait.Offered) == 0 {
				// Not waiting for a level, or this run's runner has not
				// asked for jobs yet.
				delete(unservable, j.ID)
				continue
			}
			if _, ok := unservable[j.ID]; !ok {
				unservable[j.ID] = now
			} else if now.Sub(unservable[j.ID]) >= unservableGrace {
				return last, &UnservableError{Job: j.Name, Level: wait.Level, Reason: wait.Reason()}
			}
		}
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
		if levelWait {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(recheckInterval))})
		}
		reflect.Select(cases) // a change, a recheck, or the end
		if ctx.Err() != nil {
			return last, ctx.Err()
		}
	}
}
