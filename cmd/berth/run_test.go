package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/helper"
)

// The shell executor runs the berth binary as its helper, and a runner
// with executor = "plugin" runs "berth executor-plugin NAME"; in tests the
// test binary plays those parts.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	if len(os.Args) > 1 && os.Args[1] == "--version" { // an uploaded helper's check that it runs
		fmt.Println("berth test")
		os.Exit(0)
	}
	if os.Getenv(asBerthEnv) == "1" || (len(os.Args) > 1 && (os.Args[1] == "executor-plugin" || os.Args[1] == "fleeting-plugin")) {
		os.Exit(runMain(os.Args[1:]))
	}
	// berth run keeps build directories in the user's cache directory:
	// the tests' go with the tests.
	cache, err := os.MkdirTemp("", "berth-test-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv("XDG_CACHE_HOME", cache)
	code := m.Run()
	testenv.RemoveBuilt()
	os.RemoveAll(cache)
	os.Exit(code)
}

func TestRunCommandExitStatusAndJSON(t *testing.T) {
	testenv.LookPath(t, "git")
	out, err := runCLI(t, "run", "../../examples/hello", "--json", "--job", "build")
	if err != nil {
		t.Fatalf("berth run examples/hello: %v", err)
	}
	var res local.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	if res.Status != "success" || len(res.Jobs) != 1 || res.Jobs[0].Name != "build" {
		t.Fatalf("result %+v", res)
	}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte("fails:\n  script: [exit 1]\n"), 0o644)
	_, err = runCLI(t, "run", dir)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("failing pipeline: %v, want exit status 1", err)
	}
	_, err = runCLI(t, "run", dir, "--var", "novalue")
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("bad --var: %v, want exit status 2", err)
	}
	_, err = runCLI(t, "run", t.TempDir())
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("no .gitlab-ci.yml: %v, want exit status 2", err)
	}
}

// berth run runs a child pipeline's jobs too, prints them under their
// trigger job, and its exit status follows strategy: depend.
func TestRunCommandChildPipeline(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte("child:\n  trigger:\n    include: child.yml\n    strategy: depend\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "child.yml"), []byte("inner:\n  script: [echo inner ran]\n"), 0o644)
	out, err := runCLI(t, "run", dir)
	if err != nil {
		t.Fatalf("berth run: %v\n%s", err, out)
	}
	for _, want := range []string{"child › inner", "inner ran", "  └ pipeline #2", "    inner"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	os.WriteFile(filepath.Join(dir, "child.yml"), []byte("inner:\n  script: [exit 1]\n"), 0o644)
	out, err = runCLI(t, "run", dir, "--json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("depend on a failing child: %v, want exit status 1", err)
	}
	var res local.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	if res.Status != "failed" || len(res.Jobs) != 1 || res.Jobs[0].Downstream == nil || res.Jobs[0].Downstream.Jobs[0].Name != "inner" {
		t.Fatalf("result %+v", res)
	}
}

// TestRunCommandSource: --source runs what a pipeline of that source
// would (a scheduled pipeline's jobs, only: [schedules] included), and
// an invalid configuration is reported as with a push.
func TestRunCommandSource(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
nightly:
  script: [echo "source $CI_PIPELINE_SOURCE"]
  rules:
    - if: $CI_PIPELINE_SOURCE == "schedule"
old-style:
  script: [echo old]
  only: [schedules]
build:
  script: [echo build]
  except: [schedules]
`), 0o644)
	names := func(args ...string) []string {
		t.Helper()
		out, err := runCLI(t, append([]string{"run", dir, "--json", "--fresh"}, args...)...)
		if err != nil {
			t.Fatalf("berth run %v: %v\n%s", args, err, out)
		}
		var res local.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, j := range res.Jobs {
			ns = append(ns, j.Name)
		}
		slices.Sort(ns)
		return ns
	}
	if got := names(); !slices.Equal(got, []string{"build"}) {
		t.Errorf("push: %v, want [build]", got)
	}
	if got := names("--source", "schedule"); !slices.Equal(got, []string{"nightly", "old-style"}) {
		t.Errorf("--source schedule: %v, want [nightly old-style]", got)
	}
	var ee *exitError
	if _, err := runCLI(t, "run", dir, "--source", "cron"); !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "want one of push") {
		t.Errorf("--source cron: %v, want exit status 2 naming the sources", err)
	}
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte("a:\n  script: [x]\n  when: sometimes\n"), 0o644)
	if _, err := runCLI(t, "run", dir, "--source", "web"); err == nil || !strings.Contains(err.Error(), "invalid pipeline configuration:\n") || !strings.Contains(err.Error(), "when") {
		t.Errorf("invalid configuration with --source web: %v, want the configuration error", err)
	}
}
