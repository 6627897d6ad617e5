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
