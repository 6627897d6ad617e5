package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/internal/flock"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/helper"
)

// The shell executor runs the berth binary as its helper; in tests the
// test binary plays that part.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	os.Exit(m.Run())
}

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func jobsByName(r *Result) map[string]JobResult {
	m := map[string]JobResult{}
	for _, j := range r.Jobs {
		m[j.Name] = j
	}
	return m
}

func TestRunTheExamplePipeline(t *testing.T) {
	testenv.LookPath(t, "git")
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: "../examples/hello", Logs: &logs})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	jobs := jobsByName(res)
	for name, want := range map[string]string{
		"build": "success", "test: [sha256sum]": "success", "test: [busybox sha256sum]": "success",
		"lint": "success", "flaky-on-purpose": "failed", "report": "success",
	} {
		if got := jobs[name].Status; got != want {
			t.Errorf("job %q: %s, want %s", name, got, want)
		}
	}
	if !jobs["flaky-on-purpose"].AllowFailure || jobs["flaky-on-purpose"].ExitCode != 3 {
		t.Errorf("flaky job %+v", jobs["flaky-on-purpose"])
	}
	out := logs.String()
	for _, want := range []string{
		"report                    │ after_script always runs",  // prefixed, aligned
		"test: [sha256sum]         │ hello from local/hello at", // artifact from build
		"OK", // sha256sum -c
	} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "section_start") || strings.Contains(out, "\x1b[") {
		t.Error("section markers or colours leaked into non-TTY logs")
	}
	var sum bytes.Buffer
	Summary(&sum, res)
	if !strings.Contains(sum.String(), "failed (allowed)") || !strings.Contains(sum.String(), "pipeline #1 success") {
		t.Errorf("summary:\n%s", sum.String())
	}
}

func TestRunFailureSkipsDependentsAndJobFilter(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{".gitlab-ci.yml": `
stages: [one, two, three]
ok:
  stage: one
  script: [echo "value=$VALUE"]
broken:
  stage: one
  script: [exit 4]
after:
  stage: two
  script: [echo never]
unrelated:
  stage: three
  needs: [ok]
  script: [echo fine]
`})
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Variables: []pipelines.PipelineVariable{{Key: "VALUE", Value: "42"}}})
	if err != nil {
		t.Fatal(err)
	}
	jobs := jobsByName(res)
	if res.Succeeded() || res.Status != "failed" || jobs["broken"].Status != "failed" || jobs["broken"].ExitCode != 4 ||
		jobs["after"].Status != "skipped" || jobs["unrelated"].Status != "success" {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(logs.String(), "value=42") {
		t.Errorf("pipeline variable not seen:\n%s", logs.String())
	}

	res, err = Run(t.Context(), Options{Dir: dir, Jobs: []string{"unrelated"}})
	if err != nil {
		t.Fatal(err)
	}
	jobs = jobsByName(res)
	if !res.Succeeded() || len(res.Jobs) != 2 || jobs["ok"].Status != "success" || jobs["unrelated"].Status != "success" {
		t.Fatalf("--job unrelated ran %+v", res.Jobs)
	}
}

func TestRunRefusesWhatItCannotRun(t *testing.T) {
	if _, err := Run(t.Context(), Options{Dir: t.TempDir()}); !errors.Is(err, ErrNoConfig) {
		t.Fatalf("no config: %v", err)
	}
	dir := writeDir(t, map[string]string{".gitlab-ci.yml": "job:\n  script: [true]\n"})
	if _, err := Run(t.Context(), Options{Dir: dir, Executor: "podman"}); err == nil || !strings.Contains(err.Error(), "podman") {
		t.Fatalf("unknown executor: %v", err)
	}
	bad := writeDir(t, map[string]string{".gitlab-ci.yml": "job:\n  script: [true]\n  stage: nope\n"})
	_, err := Run(t.Context(), Options{Dir: bad})
	if err == nil || !strings.Contains(err.Error(), ".gitlab-ci.yml:3") {
		t.Fatalf("invalid config: %v", err)
	}
}

func TestInterruptCancelsThePipelineAndRunsAfterScript(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{".gitlab-ci.yml": `
slow:
  script: [echo started, sleep 60]
  after_script: [echo cleaning up]
`})
	logs := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		for !strings.Contains(logs.String(), "started") {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	res, err := Run(ctx, Options{Dir: dir, Logs: logs})
	if !errors.Is(err, context.Canceled) || res == nil {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if res.Status != "canceled" || jobsByName(res)["slow"].Status != "canceled" {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(logs.String(), "cleaning up") {
		t.Errorf("after_script did not run on cancel:\n%s", logs.String())
	}
}

func TestBlockingManualJobEndsTheRun(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{".gitlab-ci.yml": `
build:
  script: [echo hi]
deploy:
  stage: deploy
  script: [echo deploy]
  when: manual
  allow_failure: false
`})
	res, err := Run(t.Context(), Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded() || res.Status != "manual" || jobsByName(res)["deploy"].Status != "manual" {
		t.Fatalf("result %+v", res)
	}
}

// TestImageIgnoredInTheShellSaysSoOnce: with --executor shell a job's
// image: cannot be honoured; every such job's log says so and the run
// warns once.
func TestImageIgnoredInTheShellSaysSoOnce(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{".gitlab-ci.yml": "a:\n  image: alpine:3\n  script: [echo a]\nb:\n  image: alpine:3\n  script: [echo b]\n"})
	var logs, warnings testenv.SyncBuffer
	res, err := Run(t.Context(), Options{Dir: dir, Executor: "shell", Logs: &logs, Warnings: &warnings})
	if err != nil || !res.Succeeded() {
		t.Fatalf("%v %+v\n%s", err, res, logs.String())
	}
	if n := strings.Count(warnings.String(), "jobs with image: run in the shell"); n != 1 {
		t.Errorf("warnings %q: want one", warnings.String())
	}
	if n := strings.Count(logs.String(), "image alpine:3 ignored"); n != 2 {
		t.Errorf("%d job logs say the image was ignored, want 2:\n%s", n, logs.String())
	}
}

// TestJobAskingForALevelNobodyOffersEndsTheRun: with the shell only, a
// job that asks for a VM would wait forever; the run ends with why and
// what the level would take here.
func TestJobAskingForALevelNobodyOffersEndsTheRun(t *testing.T) {
	testenv.LookPath(t, "git")
	for _, c := range []struct{ level, hint string }{
		{"vm", "(berth run offers microVMs, not full VMs)"},
		{"microvm", "(microVM jobs need root, QEMU, a kernel in /boot and a Docker engine: no QEMU in this test)"},
	} {
		t.Run(c.level, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
fine:
  script: [echo fine]
isolated:
  variables:
    BERTH_ISOLATION: `+c.level+`
  script: [echo never]
`), 0o644)
			var logs bytes.Buffer
			start := time.Now()
			res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Executor: "shell", MicroVMUnavailable: "no QEMU in this test"})
			var ue *UnservableError
			if !errors.As(err, &ue) || ue.Job != "isolated" || string(ue.Level) != c.level ||
				!strings.Contains(err.Error(), "isolation level "+c.level) || !strings.HasSuffix(err.Error(), c.hint) {
				t.Fatalf("Run: %v (result %+v), want an UnservableError for job isolated ending with %s\n%s", err, res, c.hint, logs.String())
			}
			if time.Since(start) > time.Minute {
				t.Errorf("the run took %s to give up", time.Since(start))
			}
			if res == nil || jobsByName(res)["fine"].Status != "success" || jobsByName(res)["isolated"].Status != "canceled" {
				t.Errorf("result %+v: want fine succeeded and isolated canceled", res)
			}
		})
	}
}

func TestRunChildPipelines(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{
		".gitlab-ci.yml": `
generate:
  stage: build
  script:
    - |
      mkdir -p gen
      cat > gen/child.yml <<'EOY'
      generated:
        script: [echo "generated child sees $FROM_PARENT"]
      EOY
  artifacts:
    paths: [gen/]
dynamic:
  stage: test
  needs: [generate]
  variables:
    FROM_PARENT: hello
  trigger:
    include: [{artifact: gen/child.yml, job: generate}]
    strategy: depend
static:
  stage: test
  trigger:
    include: ci/failing.yml
`,
		"ci/failing.yml": "broken:\n  script: [echo broken child; exit 3]\n",
	})
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs})
	if err != nil {
		t.Fatal(err)
	}
	// static has no strategy: its child's failure does not fail the run.
	if !res.Succeeded() {
		t.Fatalf("result %s\n%s", res.Status, logs.String())
	}
	jobs := jobsByName(res)
	dyn, st := jobs["dynamic"], jobs["static"]
	if dyn.Status != "success" || dyn.Downstream == nil || dyn.Downstream.Status != "success" ||
		len(dyn.Downstream.Jobs) != 1 || dyn.Downstream.Jobs[0].Name != "generated" {
		t.Errorf("dynamic %+v (downstream %+v)", dyn, dyn.Downstream)
	}
	if st.Status != "success" || st.Downstream == nil || st.Downstream.Status != "failed" || st.Downstream.Jobs[0].ExitCode != 3 {
		t.Errorf("static %+v (downstream %+v)", st, st.Downstream)
	}
	out := logs.String()
	for _, want := range [][2]string{
		{"dynamic › generated ", "│ generated child sees hello"},
		{"static › broken ", "│ broken child"},
		{"dynamic ", "│ Created child pipeline #"},
	} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			found = found || strings.HasPrefix(line, want[0]) && strings.Contains(line, want[1])
		}
		if !found {
			t.Errorf("logs lack a line %q … %q:\n%s", want[0], want[1], out)
		}
	}
	var sum bytes.Buffer
	Summary(&sum, res)
	for _, want := range []string{"dynamic  ", "  └ pipeline #", "    generated", "    broken", "failed"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}

	// With strategy: depend the child's failure is the run's.
	dir = writeDir(t, map[string]string{
		".gitlab-ci.yml": "child:\n  trigger:\n    include: c.yml\n    strategy: depend\n",
		"c.yml":          "broken:\n  script: [exit 1]\n",
	})
	res, err = Run(t.Context(), Options{Dir: dir, Logs: &logs})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded() || jobsByName(res)["child"].Status != "failed" {
		t.Errorf("depend on a failing child: %+v", res)
	}
}

// Jobs of a pipeline on the same build directory fetch once: the next
// ones skip the fetch, as the coordinator vouches that the refs did not
// change, until a job changes the directory's refs.
func TestLaterJobsSkipTheFetchUntilTheRefsChange(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{
		"README": "content\n",
		".gitlab-ci.yml": `stages: [a, b, c, d]
first:
  stage: a
  script: [cat README]
second:
  stage: b
  script:
    - cat README
    - git update-ref -d refs/remotes/origin/main
third:
  stage: c
  script: [git rev-parse --verify origin/main]
fourth:
  stage: d
  variables: {GIT_DEPTH: "3"}
  script: [cat README]
`})
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Executor: "shell", Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	skipped := map[string]bool{}
	for _, l := range strings.Split(logs.String(), "\n") {
		if name, rest, ok := strings.Cut(l, "│"); ok && strings.Contains(rest, "Skipping the fetch") {
			skipped[strings.TrimSpace(name)] = true
		}
	}
	// first fetches; second skips; third fetches (second deleted a ref
	// the fetch writes) and has it back; fourth asks for another depth.
	want := map[string]bool{"second": true}
	for _, name := range []string{"first", "second", "third", "fourth"} {
		if skipped[name] != want[name] {
			t.Errorf("job %s skipped the fetch: %v, want %v\n%s", name, skipped[name], want[name], logs.String())
		}
	}
}

// Build directories are kept between runs of a directory: the next run's
// jobs fetch into the checkout that is there; a run that finds them held
// by another starts from none.
func TestBuildDirectoriesKeptBetweenRuns(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{
		"README":         "content\n",
		".gitlab-ci.yml": "job:\n  script:\n    - cat README\n    - test ! -e left-over\n    - touch left-over\n",
	})
	keep := KeepDir(t.TempDir(), dir)
	run := func() string {
		var logs bytes.Buffer
		res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Executor: "shell", KeepDir: keep})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Succeeded() {
			t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
		}
		return logs.String()
	}
	if out := run(); !strings.Contains(out, "Initialized empty Git repository") {
		t.Fatalf("first run:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(keep, "builds")); err != nil {
		t.Fatalf("nothing kept: %v", err)
	}
	// The checkout is reused, and what the last job left is cleaned; the
	// same files make the same commit and refs, so not even a fetch.
	if out := run(); !strings.Contains(out, "Reinitialized existing Git repository") || !strings.Contains(out, "Skipping the fetch") {
		t.Fatalf("second run did not reuse the kept checkout:\n%s", out)
	}
	// A changed file is a new commit: fetched.
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(); strings.Contains(out, "Skipping the fetch") || !strings.Contains(out, "changed") {
		t.Fatalf("a changed file was not fetched:\n%s", out)
	}
	lk, err := flock.TryLock(filepath.Join(keep, "lock"), 0o600)
	if err != nil {
		t.Fatalf("the lock is still held after the run: %v", err)
	}
	if out := run(); !strings.Contains(out, "Initialized empty Git repository") {
		t.Errorf("a run while another holds the kept directories used them:\n%s", out)
	}
	lk.Close()
	if _, err := os.Stat(filepath.Join(keep, "builds")); err != nil {
		t.Errorf("the kept directories went with a run that did not hold them: %v", err)
	}
}

func TestKeptDirectoriesPruned(t *testing.T) {
	root := t.TempDir()
	old := KeepDir(root, "/some/project")
	if err := os.MkdirAll(filepath.Join(old, "builds", "0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	week := time.Now().Add(-8 * 24 * time.Hour)
	os.Chtimes(filepath.Join(old, "lock"), week, week)
	recent := KeepDir(root, "/other/project") // prunes the stale one
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("stale kept directory stayed (%v)", err)
	}
	if recent == old {
		t.Error("two directories share a kept directory")
	}
}

// TestRunTestReport: the JUnit reports a run's jobs upload are its
// result's test report, and the summary names the failed tests.
func TestRunTestReport(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeDir(t, map[string]string{
		"report.xml": `<testsuite name="unit" time="1.5"><testcase classname="calc" name="adds" time="0.5"/>` +
			`<testcase classname="calc" name="divides" time="1"><failure>division by zero</failure></testcase>` +
			`<testcase classname="calc" name="later" time="0"><skipped/></testcase></testsuite>`,
		".gitlab-ci.yml": `
unit:
  script: [cp report.xml out.xml, "false"]
  artifacts:
    when: always
    reports:
      junit: out.xml
plain:
  script: ["true"]
`})
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs})
	if err != nil {
		t.Fatal(err)
	}
	tr := res.Tests
	if tr == nil || tr.Total != 3 || tr.Passed != 1 || tr.Failed != 1 || tr.Skipped != 1 || tr.Seconds != 1.5 ||
		len(tr.Failures) != 1 || tr.Failures[0] != (TestFailure{Status: "failed", Suite: "unit", Classname: "calc", Name: "divides"}) {
		t.Fatalf("tests %+v\n%s", tr, logs.String())
	}
	var sum bytes.Buffer
	Summary(&sum, res)
	for _, want := range []string{"tests: 1 passed, 1 failed, 0 errors, 1 skipped in 1.5s", "failed  unit › calc › divides"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}

	// A run without reports has no test report.
	dir = writeDir(t, map[string]string{".gitlab-ci.yml": "plain:\n  script: [\"true\"]\n"})
	if res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs}); err != nil || res.Tests != nil {
		t.Errorf("a run without reports: tests %+v, err %v", res.Tests, err)
	}
}
