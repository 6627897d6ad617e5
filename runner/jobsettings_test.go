package runner

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// GIT_CLONE_PATH as GitLab's runner takes it: refused unless the entry
// enables custom_build_dir (the shell executor's default is off), then the
// project is checked out there — CI_PROJECT_DIR, the scripts' directory,
// artifacts and cache all follow — and a path outside CI_BUILDS_DIR is
// refused as a configuration error.
func TestGitClonePath(t *testing.T) {
	e := newE2E(t)
	git := newGitServer(t)
	dir := t.TempDir()
	enabled := true
	spec := func(name, tag, clonePath string) dispatch.JobSpec {
		return dispatch.JobSpec{
			Name: name, Tags: []string{tag}, ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
			Variables: []runnerapi.Variable{{Key: "GIT_CLONE_PATH", Value: clonePath}},
			Steps: script(`echo "pwd=$(pwd) project=$CI_PROJECT_DIR builds=$CI_BUILDS_DIR"`, "cat README",
				"if [ -f vendor/dep ]; then echo cache-hit; else mkdir -p vendor && touch vendor/dep; fi", "echo built > out.txt"),
			Cache:     []runnerapi.Cache{{Key: "clone-path", Paths: []string{"vendor/"}, Policy: "pull-push", When: "on_success"}},
			Artifacts: []runnerapi.Artifact{{Paths: []string{"out.txt"}, When: "on_success", ArtifactType: "archive", ArtifactFormat: "zip"}},
		}
	}

	// Off by default for the shell executor.
	_, _ = e.startRunnerWith(filepath.Join(dir, "off"), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{"off"}}, nil, nil)
	id := e.enqueue(t, spec("refused", "off", "$CI_BUILDS_DIR/go/src/example.com/demo"))
	j := e.waitDone(t, id)
	if tr := e.trace(t, id); j.Status != "failed" || j.FailureReason != runnerapi.RunnerConfigurationError ||
		!strings.Contains(tr, "setting GIT_CLONE_PATH is not allowed, enable `custom_build_dir` feature") || strings.Contains(tr, "demo-repo-content") {
		t.Fatalf("without custom_build_dir: %s %s\n%s", j.Status, j.FailureReason, tr)
	}

	_, _ = e.startRunnerWith(filepath.Join(dir, "on"), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{"on"}}, func(rc *config.Runner) {
		rc.CustomBuildDir.Enabled = &enabled
	}, nil)
	for _, run := range []string{"cache-miss", "cache-hit"} {
		id := e.enqueue(t, spec("cloned-"+run, "on", "$CI_BUILDS_DIR/go/src/example.com/demo"))
		j := e.waitDone(t, id)
		tr := e.trace(t, id)
		if j.Status != "success" || !strings.Contains(tr, "demo-repo-content") || len(j.Artifacts) == 0 {
			t.Fatalf("with GIT_CLONE_PATH: %s %s\n%s", j.Status, j.FailureReason, tr)
		}
		line := tr[strings.LastIndex(tr, "pwd="):]
		line = line[:strings.IndexByte(line, '\n')]
		var pwd, project, builds string
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "pwd":
				pwd = v
			case "project":
				project = v
			case "builds":
				builds = v
			}
		}
		if want := builds + "/go/src/example.com/demo"; pwd != want || project != want || !strings.HasPrefix(builds, filepath.Join(dir, "on")) {
			t.Fatalf("%s: want the project in %s: %s", run, want, line)
		}
		if run == "cache-hit" && !strings.Contains(tr, "cache-hit") {
			t.Errorf("the second job did not restore the cache made in the clone path:\n%s", tr)
		}
	}
	for _, outside := range []string{"$CI_BUILDS_DIR/../elsewhere", "/tmp/demo", "relative/dir"} {
		id := e.enqueue(t, spec("outside", "on", outside))
		j := e.waitDone(t, id)
		if tr := e.trace(t, id); j.Status != "failed" || j.FailureReason != runnerapi.RunnerConfigurationError || !strings.Contains(tr, "has to be within") {
			t.Errorf("GIT_CLONE_PATH=%s: %s %s\n%s", outside, j.Status, j.FailureReason, tr)
		}
	}
}

func TestCustomBuildDir(t *testing.T) {
	for _, tt := range []struct {
		clone, builds string
		enabled       bool
		want, err     string
	}{
		{"/b/s/0/go/src/x", "/b/s/0", true, "/b/s/0/go/src/x", ""},
		{"/b/s/0/", "/b/s/0", true, "/b/s/0", ""},
		{"/b/s/0/a/../c", "/b/s/0", true, "/b/s/0/c", ""},
		{"/b/s/0/..hidden", "/b/s/0", true, "/b/s/0/..hidden", ""},
		{"/b/s/0/x", "/b/s/0", false, "", "enable `custom_build_dir`"},
		{"/b/s/00", "/b/s/0", true, "", "has to be within"},
		{"/b/s/0/../1", "/b/s/0", true, "", "has to be within"},
		{"x/y", "/b/s/0", true, "", "has to be within"},
	} {
		got, err := customBuildDir(tt.clone, tt.builds, tt.enabled)
		if got != tt.want || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%s in %s (enabled %v): %q, %v", tt.clone, tt.builds, tt.enabled, got, err)
		}
	}
}

// clone_url: jobs fetch from <clone_url>/<project path>.git with the job
// token, not from the payload's repository URL (here unreachable), as
// gitlab-runner does for runners that reach GitLab by another address.
func TestCloneURL(t *testing.T) {
	e := newE2E(t)
	git := newGitServer(t)
	base := strings.TrimSuffix(git.url, "/group/demo.git")
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
		rc.CloneURL = base
	}, nil)
	id := e.enqueue(t, dispatch.JobSpec{Name: "clone-url", ProjectID: 1, ProjectFullPath: "group/demo",
		RepoURL: "http://127.0.0.1:1/git/group/demo.git", Ref: "main", Sha: git.sha, Steps: script("cat README")})
	j := e.waitDone(t, id)
	tr := e.trace(t, id)
	if j.Status != "success" || !strings.Contains(tr, "demo-repo-content") {
		t.Fatalf("with clone_url: %s\n%s", j.Status, tr)
	}
	if git.served.Load() == 0 || git.wrong.Load() != 0 {
		t.Errorf("git server: %d served, %d with wrong credentials", git.served.Load(), git.wrong.Load())
	}
	if strings.Contains(strings.ReplaceAll(tr, "glcbt-[MASKED]", ""), "glcbt-") {
		t.Error("the job token is in the trace")
	}
}

// CI_DEBUG_TRACE traces every command of the job's shell stages (set -x)
// and sends its log as a debug trace, which the coordinator records; an
// entry with debug_trace_disabled runs the job without it, saying why; a
// value that is not a bool is a warning. File variables' contents (keys)
// stay out of the trace.
func TestDebugTrace(t *testing.T) {
	e := newE2E(t)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{"on"}}, nil, nil)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{"off"}}, func(rc *config.Runner) {
		rc.DebugTraceDisabled = true
	}, nil)
	run := func(tag, value string) (*restapi.JobJSON, string, bool) {
		t.Helper()
		id := e.enqueue(t, dispatch.JobSpec{Name: "debug-" + tag, ProjectID: 1, Tags: []string{tag},
			Variables: []runnerapi.Variable{{Key: "CI_DEBUG_TRACE", Value: value}, {Key: "CI_DEBUG_SERVICES", Value: value}, {Key: "PROBE", Value: "probe-value"},
				{Key: "KEY_FILE", Value: "-----BEGIN PRIVATE KEY-----\nfile-secret\n", File: true}},
			Steps: script(`x="$PROBE"`, `test "$(wc -l <"$KEY_FILE")" -eq 2 && echo "done"`)})
		j := e.waitDone(t, id)
		stored, err := e.srv.Dispatch().Job(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return j, e.trace(t, id), stored.DebugTrace
	}
	j, tr, marked := run("on", "true")
	if j.Status != "success" || !strings.Contains(tr, "+ x=probe-value") || !marked || !strings.Contains(tr, "+ export KEY_FILE=") {
		t.Fatalf("CI_DEBUG_TRACE=true: %s, marked %v\n%s", j.Status, marked, tr)
	}
	if strings.Contains(tr, "file-secret") {
		t.Fatalf("a file variable's content is in the debug trace:\n%s", tr)
	}
	j, tr, marked = run("off", "true")
	if j.Status != "success" || strings.Contains(tr, "+ x=") || marked || !strings.Contains(tr, "CI_DEBUG_TRACE: usage is disabled on this Runner") ||
		!strings.Contains(tr, "CI_DEBUG_SERVICES: usage is disabled on this Runner") {
		t.Fatalf("debug_trace_disabled: %s, marked %v\n%s", j.Status, marked, tr)
	}
	j, tr, marked = run("on", "sure")
	if j.Status != "success" || strings.Contains(tr, "+ x=") || marked || !strings.Contains(tr, `CI_DEBUG_TRACE: expected bool got "sure"`) {
		t.Fatalf("CI_DEBUG_TRACE=sure: %s, marked %v\n%s", j.Status, marked, tr)
	}
}

// GIT_CHECKOUT=false fetches without checking out; GIT_FETCH_EXTRA_FLAGS
// replaces gitlab-runner's "--prune --quiet" (none: no flag); an
// after_script failure is a warning unless AFTER_SCRIPT_IGNORE_ERRORS is
// false, when it fails a job that had succeeded.
func TestGitlabRunnerJobSettings(t *testing.T) {
	e := newE2E(t)
	git := newGitServer(t)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil, nil)
	run := func(name string, vars map[string]string, steps []runnerapi.Step) (*restapi.JobJSON, string) {
		t.Helper()
		spec := dispatch.JobSpec{Name: name, ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
			Variables: []runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "clone"}}, Steps: steps}
		for k, v := range vars {
			spec.Variables = append(spec.Variables, runnerapi.Variable{Key: k, Value: v})
		}
		id := e.enqueue(t, spec)
		return e.waitDone(t, id), e.trace(t, id)
	}
	probe := script(`if [ -f README ]; then echo checked-out; else echo not-checked-out; fi`, "git rev-parse -q --verify FETCH_HEAD >/dev/null && echo fetched")
	j, tr := run("no-checkout", map[string]string{"GIT_CHECKOUT": "false"}, probe)
	if j.Status != "success" || !strings.Contains(tr, "Skipping Git checkout") || !strings.Contains(tr, "not-checked-out") || !strings.Contains(tr, "\nfetched") {
		t.Fatalf("GIT_CHECKOUT=false: %s\n%s", j.Status, tr)
	}
	j, tr = run("checkout", map[string]string{"GIT_CHECKOUT": "maybe"}, probe)
	if j.Status != "success" || !strings.Contains(tr, `GIT_CHECKOUT: expected bool got "maybe", using default value: true`) || !strings.Contains(tr, "\nchecked-out") {
		t.Fatalf("GIT_CHECKOUT=maybe: %s\n%s", j.Status, tr)
	}
	// The default fetch is quiet; --verbose makes git list the refs.
	if strings.Contains(tr, "[new branch]") {
		t.Errorf("the default fetch is not quiet:\n%s", tr)
	}
	j, tr = run("verbose-fetch", map[string]string{"GIT_FETCH_EXTRA_FLAGS": "--verbose"}, probe)
	if j.Status != "success" || !strings.Contains(tr, "[new branch]") {
		t.Fatalf("GIT_FETCH_EXTRA_FLAGS=--verbose: %s\n%s", j.Status, tr)
	}

	// A full history after a shallow one in the same directory: the fetch
	// unshallows (gitlab-runner's --unshallow).
	history := script(`echo "commits=$(git rev-list --count HEAD)"`)
	j, tr = run("shallow", map[string]string{"GIT_STRATEGY": "fetch", "GIT_DEPTH": "1"}, history)
	if j.Status != "success" || !strings.Contains(tr, "commits=1") {
		t.Fatalf("GIT_DEPTH=1: %s\n%s", j.Status, tr)
	}
	j, tr = run("deep", map[string]string{"GIT_STRATEGY": "fetch", "GIT_DEPTH": "0"}, history)
	if j.Status != "success" || !strings.Contains(tr, "commits=2") {
		t.Fatalf("GIT_DEPTH=0 after a shallow fetch: %s\n%s", j.Status, tr)
	}

	failingAfter := append(script("echo main-ok"), runnerapi.Step{Name: "after_script", Script: []string{"exit 3"}, Timeout: 60, When: "always"})
	j, tr = run("after-ignored", nil, failingAfter)
	if j.Status != "success" || !strings.Contains(tr, "after_script failed, but job will continue unaffected") {
		t.Fatalf("after_script failing by default: %s\n%s", j.Status, tr)
	}
	j, tr = run("after-counts", map[string]string{"AFTER_SCRIPT_IGNORE_ERRORS": "false"}, failingAfter)
	if j.Status != "failed" || j.FailureReason != runnerapi.ScriptFailure || strings.Contains(tr, "continue unaffected") {
		t.Fatalf("AFTER_SCRIPT_IGNORE_ERRORS=false: %s %s\n%s", j.Status, j.FailureReason, tr)
	}
}

// RUNNER_SCRIPT_TIMEOUT bounds the steps alone: the job fails as a timeout
// and after_script still runs; RUNNER_AFTER_SCRIPT_TIMEOUT bounds
// after_script; malformed values are gitlab-runner's warnings.
func TestStageTimeouts(t *testing.T) {
	e := newE2E(t)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil, nil)
	run := func(name string, vars map[string]string, main, after string) (*restapi.JobJSON, string) {
		t.Helper()
		spec := dispatch.JobSpec{Name: name, ProjectID: 1, Timeout: 600,
			Steps: append(script(main), runnerapi.Step{Name: "after_script", Script: []string{after}, Timeout: 60, When: "always"})}
		for k, v := range vars {
			spec.Variables = append(spec.Variables, runnerapi.Variable{Key: k, Value: v})
		}
		id := e.enqueue(t, spec)
		return e.waitDone(t, id), e.trace(t, id)
	}
	j, tr := run("script-timeout", map[string]string{"RUNNER_SCRIPT_TIMEOUT": "1s"}, "sleep 60", `echo "after:$CI_JOB_STATUS"`)
	if j.Status != "failed" || j.FailureReason != runnerapi.JobExecutionTimeout || !strings.Contains(tr, "after:failed") ||
		!strings.Contains(tr, "script timed out after 1s (RUNNER_SCRIPT_TIMEOUT)") {
		t.Fatalf("RUNNER_SCRIPT_TIMEOUT=1s: %s %s\n%s", j.Status, j.FailureReason, tr)
	}
	j, tr = run("after-timeout", map[string]string{"RUNNER_AFTER_SCRIPT_TIMEOUT": "1s"}, "true", "sleep 60")
	if j.Status != "success" || !strings.Contains(tr, "after_script timed out after 1s") {
		t.Fatalf("RUNNER_AFTER_SCRIPT_TIMEOUT=1s: %s\n%s", j.Status, tr)
	}
	j, tr = run("malformed", map[string]string{"RUNNER_SCRIPT_TIMEOUT": "soon", "RUNNER_AFTER_SCRIPT_TIMEOUT": "2h"}, "true", "true")
	if j.Status != "success" || !strings.Contains(tr, "Ignoring malformed RUNNER_SCRIPT_TIMEOUT timeout: soon") ||
		!strings.Contains(tr, "RUNNER_AFTER_SCRIPT_TIMEOUT timeout: 2h is longer than job timeout. Setting to job timeout") {
		t.Fatalf("malformed timeouts: %s\n%s", j.Status, tr)
	}
}

// slowPrepare wraps a provider: Prepare waits (until its context ends)
// when slow is set, and Run fails when the context Prepare was given has
// ended meanwhile — an executor that keeps it must not be cut off once
// the preparation is over.
type slowPrepare struct {
	executor.Provider
	slow bool
}

func (p slowPrepare) Create(ctx context.Context) (executor.Executor, error) {
	ex, err := p.Provider.Create(ctx)
	return &slowExecutor{Executor: ex, slow: p.slow}, err
}

type slowExecutor struct {
	executor.Executor
	slow    bool
	prepCtx context.Context
}

func (e *slowExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	e.prepCtx = ctx
	if e.slow {
		select {
		case <-ctx.Done():
			return executor.Environment{}, fmt.Errorf("preparing: %w", ctx.Err())
		case <-time.After(time.Minute):
		}
	}
	return e.Executor.Prepare(ctx, o)
}

func (e *slowExecutor) Run(ctx context.Context, cmd executor.Command) error {
	err := e.Executor.Run(ctx, cmd)
	if perr := e.prepCtx.Err(); perr != nil && ctx.Err() == nil {
		return fmt.Errorf("the context of Prepare ended: %w", perr)
	}
	return err
}

// prepare_timeout bounds the executor's preparation and get_sources_timeout
// the get_sources stage: the job fails as a timeout with gitlab-runner's
// message; a job whose preparation was quick runs on past the prepare
// timeout; values above the job's timeout are warnings.
func TestPrepareAndGetSourcesTimeouts(t *testing.T) {
	e := newE2E(t)
	git := newGitServer(t)
	dir := t.TempDir()
	second, minute, hour := time.Second, time.Minute, 2*time.Hour
	runner := func(tag string, slow bool, tune func(*config.Runner)) {
		_, _ = e.startRunnerWith(filepath.Join(dir, tag), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{tag}},
			tune, func(p executor.Provider) executor.Provider { return slowPrepare{Provider: p, slow: slow} })
	}
	run := func(tag, main string) (*restapi.JobJSON, string) {
		t.Helper()
		id := e.enqueue(t, dispatch.JobSpec{Name: tag, Tags: []string{tag}, ProjectID: 1, ProjectFullPath: "group/demo", Timeout: 600,
			RepoURL: git.url, Ref: "main", Sha: git.sha, Steps: script(main)})
		return e.waitDone(t, id), e.trace(t, id)
	}

	runner("slow-prepare", true, func(rc *config.Runner) { rc.PrepareTimeout = &second })
	j, tr := run("slow-prepare", "echo ran")
	if j.Status != "failed" || j.FailureReason != runnerapi.JobExecutionTimeout ||
		!strings.Contains(tr, "prepare timeout: exceeded timeout of 1s") || strings.Contains(tr, "\nran") {
		t.Fatalf("prepare_timeout 1s, a slow preparation: %s %s\n%s", j.Status, j.FailureReason, tr)
	}

	runner("quick-prepare", false, func(rc *config.Runner) { rc.PrepareTimeout = &second })
	j, tr = run("quick-prepare", "sleep 2; echo ran")
	if j.Status != "success" || !strings.Contains(tr, "\nran") {
		t.Fatalf("prepare_timeout 1s, a quick preparation and a 2 s script: %s %s\n%s", j.Status, j.FailureReason, tr)
	}

	runner("slow-sources", false, func(rc *config.Runner) {
		rc.GetSourcesTimeout = &second
		rc.PreGetSourcesScript = "sleep 30"
	})
	j, tr = run("slow-sources", "echo ran")
	if j.Status != "failed" || j.FailureReason != runnerapi.JobExecutionTimeout ||
		!strings.Contains(tr, "get sources timeout: exceeded timeout of 1s") || strings.Contains(tr, "\nran") {
		t.Fatalf("get_sources_timeout 1s, pre_get_sources_script sleeping: %s %s\n%s", j.Status, j.FailureReason, tr)
	}

	runner("long", false, func(rc *config.Runner) { rc.PrepareTimeout, rc.GetSourcesTimeout = &hour, &minute })
	j, tr = run("long", "echo ran")
	if j.Status != "success" || !strings.Contains(tr, "prepare_timeout (2h0m0s) exceeds job timeout (10m0s); using job timeout") {
		t.Fatalf("prepare_timeout above the job's: %s\n%s", j.Status, tr)
	}
}

// clean_git_config: a job's hooks and configuration in the repository are
// gone before the next job's git runs (and after the job), on by default
// except on the shell executor; off, the planted hook runs.
func TestCleanGitConfig(t *testing.T) {
	testenv.LookPath(t, "git")
	e := newE2E(t)
	git := newGitServer(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "hook-ran")
	plant := `printf '#!/bin/sh\ntouch ` + marker + `\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout && git config berth.planted yes`
	probe := `git config --get berth.planted || echo not-planted; if [ -d .git/hooks ]; then echo hooks-dir; fi`
	for _, c := range []struct {
		tag   string
		clean *bool
		ran   bool
	}{{"clean", ptr(true), false}, {"shell-default", nil, true}, {"off", ptr(false), true}} {
		os.Remove(marker)
		_, _ = e.startRunnerWith(filepath.Join(dir, c.tag), restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{c.tag}},
			func(rc *config.Runner) {
				rc.CleanGitConfig = c.clean
				// One job at a time: the job is done for the coordinator
				// before its slot is free, and a second slot would check
				// out in a directory of its own, without the planted hook.
				rc.Limit = 1
			}, nil)
		for i, steps := range []string{"mkdir -p .git/hooks && " + plant, probe} {
			id := e.enqueue(t, dispatch.JobSpec{Name: c.tag, Tags: []string{c.tag}, ProjectID: 1, ProjectFullPath: "group/demo",
				RepoURL: git.url, Ref: "main", Sha: git.sha, Steps: script(steps),
				Variables: []runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "fetch"}}})
			j, tr := e.waitDone(t, id), e.trace(t, id)
			if j.Status != "success" {
				t.Fatalf("%s, job %d: %s\n%s", c.tag, i, j.Status, tr)
			}
			if i == 1 {
				_, err := os.Stat(marker)
				if ran := err == nil; ran != c.ran || strings.Contains(tr, "\nyes") == !c.ran || strings.Contains(tr, "\nhooks-dir") == !c.ran {
					t.Errorf("%s: hook ran %v (want %v), second job:\n%s", c.tag, ran, c.ran, tr)
				}
			}
		}
		if c.clean != nil && *c.clean {
			// The job's cleanup took them away already.
			if _, err := os.Stat(filepath.Join(dir, c.tag, "builds")); err != nil {
				t.Fatal(err)
			}
			matches, _ := filepath.Glob(filepath.Join(dir, c.tag, "builds", "*", "*", "group", "demo", ".git", "config"))
			if len(matches) != 0 {
				t.Errorf("%s: the repository's configuration is left after the job: %v", c.tag, matches)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// The runner's user setting, end to end: as root, a job's checkout, cache
// and artifacts are made by that user (the helper runs in its shell), and
// the job sees itself as that user.
func TestJobsRunAsUser(t *testing.T) {
	testenv.Root(t)
	testenv.LookPath(t, "git")
	e := newE2E(t)
	git := newGitServer(t)
	dir := t.TempDir()
	for d := dir; strings.HasPrefix(d, os.TempDir()+string(filepath.Separator)); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The helper (this test binary) where the user may run it.
	self, err := os.ReadFile(helperBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	helperPath := filepath.Join(dir, "berth")
	if err := os.WriteFile(helperPath, self, 0o755); err != nil {
		t.Fatal(err)
	}
	e.options = func(o *Options) { o.User = "nobody" }
	_, _ = e.startRunnerWith(filepath.Join(dir, "runner"), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil,
		func(executor.Provider) executor.Provider {
			return shell.New(shell.Config{Helper: helperPath, KillGrace: time.Second})
		})
	spec := dispatch.JobSpec{Name: "as-nobody", ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
		Steps: script(`echo "uid=$(id -u) home=$HOME"`, "cat README",
			"if [ -f vendor/dep ]; then echo cache-hit; else mkdir -p vendor && touch vendor/dep; fi", "echo built > out.txt"),
		Cache:     []runnerapi.Cache{{Key: "as-user", Paths: []string{"vendor/"}, Policy: "pull-push", When: "on_success"}},
		Artifacts: []runnerapi.Artifact{{Paths: []string{"out.txt"}, When: "on_success", ArtifactType: "archive", ArtifactFormat: "zip"}},
	}
	for _, run := range []string{"first", "second"} {
		id := e.enqueue(t, spec)
		j := e.waitDone(t, id)
		tr := e.trace(t, id)
		if j.Status != "success" || !strings.Contains(tr, "uid=65534 home=/nonexistent") || !strings.Contains(tr, "demo-repo-content") || len(j.Artifacts) == 0 {
			t.Fatalf("%s job as nobody: %s %s\n%s", run, j.Status, j.FailureReason, tr)
		}
		if run == "second" && !strings.Contains(tr, "cache-hit") {
			t.Errorf("the second job did not restore the cache the first made:\n%s", tr)
		}
	}
	var foreign []string
	_ = filepath.WalkDir(filepath.Join(dir, "runner"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == filepath.Join(dir, "runner") || p == filepath.Join(dir, "runner", "builds") {
			return err
		}
		if st, err := os.Lstat(p); err == nil && st.Sys().(*syscall.Stat_t).Uid != 65534 {
			foreign = append(foreign, p)
		}
		return nil
	})
	if len(foreign) > 0 {
		t.Errorf("not nobody's: %v", foreign)
	}
}
