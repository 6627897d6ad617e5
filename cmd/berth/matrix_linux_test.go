package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// TestMatrixBranch: berth run of a parallel:matrix of three microVM jobs
// with BERTH_MATRIX_BRANCH. Branched, before_script runs once: every job
// sees the same random id it wrote, the variable it set without export,
// its working directory and the process it left running, and two jobs
// say they started from the branch point; each job's own matrix value is
// its own. Unbranched (the same pipeline, the variable false), each job
// runs the prefix itself.
func TestMatrixBranch(t *testing.T) {
	testenv.VMs(t)
	testenv.DockerImage(t, debugTestImage)
	env := append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
variables:
  GIT_STRATEGY: none
  BERTH_MATRIX_BRANCH: "true"
test:
  isolation: microvm
  image: `+debugTestImage+`
  parallel:
    matrix:
      - FLAVOR: [a, b, c]
  before_script:
    - mkdir -p "$CI_PROJECT_DIR/sub" && cd "$CI_PROJECT_DIR/sub"
    - head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' > prefix-id
    - PREFIX_ID=$(cat prefix-id)
    - (setsid sleep 31337 </dev/null >/dev/null 2>&1 &)
  script:
    - test "$(pwd)" = "$CI_PROJECT_DIR/sub"
    - running=no; for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) running=yes;; esac; done
    - echo "RESULT flavor=$FLAVOR prefix=$PREFIX_ID file=$(cat prefix-id) sleeper=$running"
`), 0o644)
	result := regexp.MustCompile(`RESULT flavor=(\w+) prefix=(\w+) file=(\w+) sleeper=(\w+)`)
	run := func(branch string) (flavors, prefixes []string, resumed int) {
		out, err := berthCmd(t, env, "run", dir, "--concurrency", "2", "--var", "BERTH_MATRIX_BRANCH="+branch).CombinedOutput()
		if err != nil {
			t.Fatalf("berth run (branch %s): %v\n%s", branch, err, out)
		}
		for _, m := range result.FindAllStringSubmatch(string(out), -1) {
			if m[2] != m[3] {
				t.Errorf("branch %s: the variable before_script set (%s) is not its file's content (%s)", branch, m[2], m[3])
			}
			if m[4] != "yes" {
				t.Errorf("branch %s: job %s does not see the process before_script left running", branch, m[1])
			}
			flavors = append(flavors, m[1])
			if !slices.Contains(prefixes, m[2]) {
				prefixes = append(prefixes, m[2])
			}
		}
		slices.Sort(flavors)
		if !slices.Equal(flavors, []string{"a", "b", "c"}) {
			t.Fatalf("branch %s: results of %v, want a, b and c:\n%s", branch, flavors, out)
		}
		return flavors, prefixes, strings.Count(string(out), "Started from the matrix's common prefix, run once by job")
	}
	if _, prefixes, resumed := run("true"); len(prefixes) != 1 || resumed != 2 {
		t.Errorf("branched: before_script's ids %v, %d jobs started from the branch point; want one id, 2 jobs", prefixes, resumed)
	}
	if _, prefixes, resumed := run("false"); len(prefixes) != 3 || resumed != 0 {
		t.Errorf("unbranched: before_script's ids %v, %d jobs started from the branch point; want 3 ids, none", prefixes, resumed)
	}
}

// TestSnapshotPoints: berth run of jobs that take snapshot points and
// later jobs that start from them. build saves its VM at the end of its
// script; test, restoring build:end, sees what build's script wrote
// (no artifact carries it). prep saves after before_script; use,
// restoring prep:before_script, runs its script only (its own
// before_script does not run) with what prep's before_script wrote and
// set. A job restoring a point nobody took runs from the start.
func TestSnapshotPoints(t *testing.T) {
	testenv.VMs(t)
	testenv.DockerImage(t, debugTestImage)
	env := append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
stages: [build, test]
variables:
  GIT_STRATEGY: none
default:
  isolation: microvm
  image: `+debugTestImage+`
build:
  stage: build
  variables:
    BERTH_SNAPSHOT: end
  script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' > built
    - echo "BUILT $(cat built)"
prep:
  stage: build
  variables:
    BERTH_SNAPSHOT: before_script
  before_script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - echo prepared > prepared
    - PREP=yes
  script:
    - echo "PREP-SCRIPT $PREP"
test:
  stage: test
  needs: [build]
  variables:
    BERTH_RESTORE: "build:end"
  script:
    - cd "$CI_PROJECT_DIR"
    - echo "TESTED $(cat built)"
use:
  stage: test
  needs: [prep]
  variables:
    BERTH_RESTORE: "prep:before_script"
  before_script:
    - echo "USE-BEFORE-SCRIPT-RAN"
  script:
    - echo "USE $PREP $(cat prepared) in $(pwd)"
fallback:
  stage: test
  needs: [build]
  variables:
    BERTH_RESTORE: "nobody:end"
  script:
    - echo "FALLBACK ran"
`), 0o644)
	out, err := berthCmd(t, env, "run", dir, "--concurrency", "2").CombinedOutput()
	if err != nil {
		t.Fatalf("berth run: %v\n%s", err, out)
	}
	s := string(out)
	built := regexp.MustCompile(`BUILT (\w+)`).FindStringSubmatch(s)
	tested := regexp.MustCompile(`TESTED (\w+)`).FindStringSubmatch(s)
	if built == nil || tested == nil || built[1] != tested[1] {
		t.Errorf("test restoring build:end: built %v, tested %v", built, tested)
	}
	if !strings.Contains(s, "Started from snapshot point build:end of job") || !strings.Contains(s, "Started from snapshot point prep:before_script of job") {
		t.Errorf("the restoring jobs do not say where they started:\n%s", s)
	}
	if !regexp.MustCompile(`USE yes prepared in /\S+`).MatchString(s) {
		t.Errorf("use restoring prep:before_script does not see what prep's before_script left:\n%s", s)
	}
	if strings.Contains(s, "USE-BEFORE-SCRIPT-RAN") {
		t.Errorf("use's own before_script ran, though it started after prep's:\n%s", s)
	}
	if !strings.Contains(s, `no snapshot point "nobody:end"`) || !strings.Contains(s, "FALLBACK ran") {
		t.Errorf("a job restoring a point nobody took does not say so and run:\n%s", s)
	}
}
