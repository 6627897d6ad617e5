// Package executortest is the conformance suite every executor passes: the
// lifecycle rules of package executor, streamed output, exit statuses,
// stopping the whole process tree, cleanup after a failed prepare, and
// isolation of concurrent executors.
//
//	func TestConformance(t *testing.T) {
//		executortest.Run(t, executortest.Config{NewProvider: …})
//	}
//
// Scripts the suite runs are POSIX sh and use only sleep, echo, cat, kill,
// test and setsid, so they run in any environment an executor prepares
// (a busybox image has them all).
package executortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// Config tells the suite how to make executors.
type Config struct {
	// NewProvider returns a provider whose builds_dir and cache_dir
	// defaults lie under dir.
	NewProvider func(t *testing.T, dir string) executor.Provider
	// ProcessAlive reports whether a process id printed by a script
	// still runs (nil: signal 0 on the host, right for host executors).
	ProcessAlive func(pid int) bool
	// FileExists reports whether a path inside the environment exists
	// (nil: os.Stat on the host).
	FileExists func(path string) bool
	// CreateFile creates a file inside the environment (nil: on the host).
	CreateFile func(path string) error
	// Job, if set, returns the job payload PrepareOptions carry (an
	// executor that needs an image gets one here).
	Job func() *runnerapi.JobResponse
	// Disposable is what the executor's environments say of themselves
	// (Environment.Disposable): set for executors whose every job has a
	// container or VM of its own.
	Disposable bool
}

// wait bounds every wait of the suite; it only stops a broken executor
// from hanging the test, it asserts nothing about speed.
const wait = 30 * time.Second

// Run runs the suite.
func Run(t *testing.T, cfg Config) {
	if cfg.ProcessAlive == nil {
		cfg.ProcessAlive = hostAlive
	}
	if cfg.FileExists == nil {
		cfg.FileExists = func(p string) bool { _, err := os.Stat(p); return err == nil }
	}
	if cfg.CreateFile == nil {
		cfg.CreateFile = func(p string) error { return os.WriteFile(p, nil, 0o644) }
	}
	s := &suite{cfg: cfg}
	if cfg.Job != nil {
		s.job = cfg.Job
	}
	t.Run("LifecycleMisuse", s.lifecycleMisuse)
	t.Run("StagesShareTheEnvironment", s.stagesShareEnvironment)
	t.Run("ExitStatus", s.exitStatus)
	t.Run("OutputIsStreamed", s.outputIsStreamed)
	t.Run("StdoutAndStderr", s.stdoutAndStderr)
	t.Run("CancelStopsProcessTree", s.cancelStopsTree)
	t.Run("RunAfterCanceledRun", s.runAfterCancel)
	t.Run("LeftoverProcessesDoNotHang", s.leftoversDoNotHang)
	t.Run("EscapedProcessesStopped", s.escapedStopped)
	t.Run("CancelStopsEscapedProcesses", s.cancelStopsEscaped)
	t.Run("CleanupAfterFailedPrepare", s.cleanupAfterFailedPrepare)
	t.Run("CleanupRemovesTmpDir", s.cleanupRemovesTmp)
	t.Run("ConcurrentExecutorsIsolated", s.concurrentIsolated)
	t.Run("OutputNeverWrittenConcurrently", s.noConcurrentWrites)
}

// systemID is this test process's: suites of several executors run at
// once (one process per package) and must not share a marker scope.
var systemID = fmt.Sprintf("s_suite%07d", os.Getpid()%10000000)

type suite struct {
	cfg Config
	job func() *runnerapi.JobResponse
}

func (s *suite) opts(id int) executor.PrepareOptions {
	o := executor.PrepareOptions{JobID: int64(100 + id), ProjectPath: "group/project", ShortToken: "abcdefghi", ConcurrencyID: id, SystemID: systemID}
	if s.job != nil {
		o.Job = s.job()
		o.Job.ID = o.JobID
	}
	return o
}

// prepared creates and prepares an executor; Cleanup is registered.
func (s *suite) prepared(t *testing.T, p executor.Provider, o executor.PrepareOptions) (executor.Executor, executor.Environment) {
	t.Helper()
	ctx := context.Background()
	e, err := p.Create(ctx)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	env, err := e.Prepare(ctx, o)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if env.BuildDir == "" || env.TmpDir == "" || env.Shell == "" || env.Helper == "" {
		t.Fatalf("Prepare returned an incomplete environment %+v", env)
	}
	if env.Disposable != s.cfg.Disposable {
		t.Errorf("Prepare returned Disposable %v, want %v", env.Disposable, s.cfg.Disposable)
	}
	return e, env
}

func run(ctx context.Context, e executor.Executor, stage, script string) (string, error) {
	var buf testenv.SyncBuffer
	err := e.Run(ctx, executor.Command{Stage: stage, Script: script, Output: &buf})
	return buf.String(), err
}

func (s *suite) lifecycleMisuse(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	ctx := context.Background()
	e, err := p.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, e, "step_script", "echo should-not-run"); !errors.Is(err, executor.ErrNotPrepared) {
		t.Fatalf("Run before Prepare: %v, want ErrNotPrepared", err)
	}
	if _, err := e.Prepare(ctx, s.opts(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Prepare(ctx, s.opts(0)); err == nil {
		t.Error("second Prepare accepted")
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatalf("second Cleanup: %v, want nil (idempotent)", err)
	}
	if _, err := run(ctx, e, "step_script", "echo should-not-run"); !errors.Is(err, executor.ErrNotPrepared) {
		t.Fatalf("Run after Cleanup: %v, want ErrNotPrepared", err)
	}
}

func (s *suite) stagesShareEnvironment(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, env := s.prepared(t, p, s.opts(0))
	ctx := context.Background()
	if !strings.Contains(filepath.ToSlash(env.BuildDir), "abcdefghi/0/group/project") {
		t.Errorf("build dir %q, want <builds_dir>/<short token>/<concurrency id>/<project path>", env.BuildDir)
	}
	if _, err := run(ctx, e, "get_sources", "echo one > file.txt"); err != nil {
		t.Fatal(err)
	}
	out, err := run(ctx, e, "step_script", `cat file.txt; pwd`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "one") || !strings.Contains(out, env.BuildDir) {
		t.Fatalf("second stage saw %q; want the file of the first stage, working directory %s", out, env.BuildDir)
	}
}

func (s *suite) exitStatus(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	ctx := context.Background()
	if _, err := run(ctx, e, "step_script", "true"); err != nil {
		t.Fatalf("exit 0: %v", err)
	}
	for _, code := range []int{1, 3, 42, 255} {
		_, err := run(ctx, e, "step_script", fmt.Sprintf("echo failing; exit %d", code))
		var ee *executor.ExitError
		if !errors.As(err, &ee) || ee.Code != code || ee.Stage != "step_script" {
			t.Errorf("exit %d: got %v", code, err)
		}
	}
}

func (s *suite) outputIsStreamed(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, env := s.prepared(t, p, s.opts(0))
	gate := filepath.Join(env.TmpDir, "gate")
	// The script prints, then waits for a file the test creates only
	// after it has seen the output: it can only finish if output arrives
	// while the script still runs.
	script := fmt.Sprintf("echo before-gate\nn=0\nwhile ! test -e %q; do sleep 0.05; n=$((n+1)); if [ $n -gt 600 ]; then echo gate-timeout; exit 9; fi; done\necho after-gate\n", gate)
	var buf testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(context.Background(), executor.Command{Stage: "step_script", Script: script, Output: &buf})
	}()
	deadline := time.Now().Add(wait)
	for !strings.Contains(buf.String(), "before-gate") {
		if time.Now().After(deadline) {
			t.Fatalf("no streamed output while the script runs (got %q)", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.cfg.CreateFile(gate); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || !strings.Contains(buf.String(), "after-gate") {
			t.Fatalf("run: %v, output %q", err, buf.String())
		}
	case <-time.After(wait):
		t.Fatal("script did not finish")
	}
}

func (s *suite) stdoutAndStderr(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	out, err := run(context.Background(), e, "step_script", "echo to-stdout; echo to-stderr >&2")
	if err != nil || !strings.Contains(out, "to-stdout") || !strings.Contains(out, "to-stderr") {
		t.Fatalf("%v %q", err, out)
	}
}

// pids reads the numbers a script printed as "pid:N".
func pids(out string) []int {
	var ps []int
	for _, f := range strings.Fields(out) {
		if n, ok := strings.CutPrefix(f, "pid:"); ok {
			if p, err := strconv.Atoi(n); err == nil {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

func (s *suite) waitGone(t *testing.T, ps []int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for _, p := range ps {
		for s.cfg.ProcessAlive(p) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still alive", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// treeScript starts a child, a grandchild and a process that ignores
// SIGTERM, prints their pids, then waits.
const treeScript = `sleep 1000 & echo "pid:$!"
sh -c 'sleep 1000 & echo "pid:$!"; wait' &
sh -c 'trap "" TERM; while :; do sleep 0.2; done' & echo "pid:$!"
echo "pid:$$"
echo started
wait
`

func (s *suite) cancelStopsTree(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	errWhy := errors.New("canceled by the suite")
	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancel := func() { cancelCause(errWhy) }
	var buf testenv.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, executor.Command{Stage: "step_script", Script: treeScript, Output: &buf}) }()
	deadline := time.Now().Add(wait)
	for len(pids(buf.String())) < 4 || !strings.Contains(buf.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatalf("script did not start its tree: %q", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, errWhy) {
			t.Fatalf("Run after cancel: %v, want an error wrapping context.Canceled and the cancel cause", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return after cancel")
	}
	s.waitGone(t, pids(buf.String()))
}

func (s *suite) runAfterCancel(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	if _, err := run(ctx, e, "step_script", "sleep 1000"); err == nil {
		t.Fatal("canceled run returned nil")
	}
	out, err := run(context.Background(), e, "after_script", "echo after")
	if err != nil || !strings.Contains(out, "after") {
		t.Fatalf("after_script after a canceled script: %v %q", err, out)
	}
}

func (s *suite) leftoversDoNotHang(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	done := make(chan struct{})
	var out string
	var err error
	go func() {
		defer close(done)
		out, err = run(context.Background(), e, "step_script", `sleep 1000 & echo "pid:$!"; echo main-done`)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("a background process holding the output hangs the stage")
	}
	if err != nil || !strings.Contains(out, "main-done") {
		t.Fatalf("%v %q", err, out)
	}
	s.waitGone(t, pids(out))
}

// escapeScript starts a process that leaves the stage's process group and
// session (setsid) and prints its pid once it runs.
const escapeScript = `setsid sh -c 'echo "pid:$$" > escaped.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 &
n=0; while ! test -s escaped.pid; do sleep 0.05; n=$((n+1)); if [ $n -gt 600 ]; then exit 9; fi; done
cat escaped.pid; rm -f escaped.pid
echo started
`

func (s *suite) escapedStopped(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	out, err := run(context.Background(), e, "step_script", escapeScript)
	if err != nil || len(pids(out)) != 1 {
		t.Fatalf("%v %q", err, out)
	}
	s.waitGone(t, pids(out))
}

func (s *suite) cancelStopsEscaped(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	ctx, cancel := context.WithCancel(context.Background())
	var buf testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, executor.Command{Stage: "step_script", Script: escapeScript + "sleep 1000\n", Output: &buf})
	}()
	deadline := time.Now().Add(wait)
	for !strings.Contains(buf.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatalf("script did not start: %q", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return after cancel")
	}
	s.waitGone(t, pids(buf.String()))
}

func (s *suite) cleanupAfterFailedPrepare(t *testing.T) {
	dir := t.TempDir()
	p := s.cfg.NewProvider(t, dir)
	ctx := context.Background()
	for name, o := range map[string]executor.PrepareOptions{
		"dotdot project": {ProjectPath: "../escape", ShortToken: "abcdefghi"},
		"absolute":       {ProjectPath: "/etc", ShortToken: "abcdefghi"},
		"no token":       {ProjectPath: "g/p"},
	} {
		if s.job != nil {
			o.Job = s.job()
		}
		e, err := p.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Prepare(ctx, o); err == nil {
			t.Errorf("%s: Prepare accepted %+v", name, o)
		}
		if _, err := run(ctx, e, "step_script", "echo x"); !errors.Is(err, executor.ErrNotPrepared) {
			t.Errorf("%s: Run after failed Prepare: %v", name, err)
		}
		if err := e.Cleanup(ctx); err != nil {
			t.Errorf("%s: Cleanup after failed Prepare: %v", name, err)
		}
	}
	// Canceled before it starts.
	e, _ := p.Create(ctx)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Prepare(cctx, s.opts(0)); !errors.Is(err, context.Canceled) {
		t.Errorf("Prepare with a done context: %v", err)
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup after canceled Prepare: %v", err)
	}
	// Cleanup without Prepare at all.
	e, _ = p.Create(ctx)
	if err := e.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup without Prepare: %v", err)
	}
}

func (s *suite) cleanupRemovesTmp(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	ctx := context.Background()
	e, err := p.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env, err := e.Prepare(ctx, s.opts(0))
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(env.TmpDir, "FILE_VAR")
	if _, err := run(ctx, e, "step_script", fmt.Sprintf("echo secret > %q", secret)); err != nil {
		t.Fatal(err)
	}
	if !s.cfg.FileExists(secret) {
		t.Fatal("file in TmpDir not created")
	}
	if err := e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if s.cfg.FileExists(env.TmpDir) {
		t.Fatalf("TmpDir %s survives Cleanup", env.TmpDir)
	}
}

func (s *suite) concurrentIsolated(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	const n = 3
	var wg sync.WaitGroup
	envs := make([]executor.Environment, n)
	outs := make([]string, n)
	errs := make([]error, n)
	exs := make([]executor.Executor, n)
	for i := range n {
		exs[i], envs[i] = s.prepared(t, p, s.opts(i))
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if _, errs[i] = run(ctx, exs[i], "get_sources", fmt.Sprintf("echo job-%d > owner.txt; sleep 0.2", i)); errs[i] != nil {
				return
			}
			outs[i], errs[i] = run(ctx, exs[i], "step_script", "cat owner.txt")
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("executor %d: %v", i, errs[i])
		}
		if strings.TrimSpace(outs[i]) != fmt.Sprintf("job-%d", i) {
			t.Errorf("executor %d read %q: build directories are shared", i, outs[i])
		}
		if seen[envs[i].BuildDir] || seen[envs[i].TmpDir] {
			t.Errorf("executor %d reuses directory %s", i, envs[i].BuildDir)
		}
		seen[envs[i].BuildDir], seen[envs[i].TmpDir] = true, true
	}
}

func (s *suite) noConcurrentWrites(t *testing.T) {
	p := s.cfg.NewProvider(t, t.TempDir())
	e, _ := s.prepared(t, p, s.opts(0))
	w := &exclusiveWriter{}
	script := "i=0; while [ $i -lt 200 ]; do echo out-$i; echo err-$i >&2; i=$((i+1)); done"
	if err := e.Run(context.Background(), executor.Command{Stage: "step_script", Script: script, Output: w}); err != nil {
		t.Fatal(err)
	}
	if w.overlap.Load() {
		t.Fatal("Output.Write called concurrently")
	}
	if !strings.Contains(w.buf.String(), "out-199") || !strings.Contains(w.buf.String(), "err-199") {
		t.Fatalf("output incomplete: %d bytes", w.buf.Len())
	}
}

type exclusiveWriter struct {
	busy    atomic.Bool
	overlap atomic.Bool
	buf     bytes.Buffer
}

func (w *exclusiveWriter) Write(p []byte) (int, error) {
	if !w.busy.CompareAndSwap(false, true) {
		w.overlap.Store(true)
		return len(p), nil
	}
	defer w.busy.Store(false)
	time.Sleep(10 * time.Microsecond)
	return w.buf.Write(p)
}
