package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"
)

// MatrixOptions configure Matrix.
type MatrixOptions struct {
	// Berth is the berth binary.
	Berth string
	// Image is the jobs' image (a local Docker image).
	Image string
	// Jobs is the matrix's size (default 4).
	Jobs int
	// PrefixMiB is the common prefix's work: before_script hashes this
	// many MiB (default 64), CPU-bound like a build step.
	PrefixMiB int
	// Concurrency is berth run's --concurrency (0: its default).
	Concurrency int
	// Env is berth run's environment (nil: this process's).
	Env      []string
	Progress io.Writer
}

// MatrixRun is one berth run of the matrix.
type MatrixRun struct {
	Seconds float64 `json:"seconds"`
	// Results are the jobs' result lines, sorted.
	Results []string `json:"results"`
	// Resumed counts the jobs that started from the branch point.
	Resumed int `json:"resumed"`
	// PrefixSeconds is how long the common prefix took in the job that
	// ran it (branched runs).
	PrefixSeconds float64 `json:"prefix_seconds,omitempty"`
}

// MatrixResult compares a matrix run with and without branching.
type MatrixResult struct {
	Jobs       int       `json:"jobs"`
	PrefixMiB  int       `json:"prefix_mib"`
	Unbranched MatrixRun `json:"unbranched"`
	Branched   MatrixRun `json:"branched"`
	// Identical says every job's result is the same both ways.
	Identical bool `json:"identical"`
	// Speedup is unbranched time over branched time.
	Speedup float64 `json:"speedup"`
}

// MatrixPipeline is a parallel:matrix job of n microVM jobs whose
// before_script hashes mib MiB (the common prefix) and whose script
// prints a result line made of the prefix's output and the job's own.
func MatrixPipeline(image string, n, mib int) string {
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprint(i + 1)
	}
	return fmt.Sprintf(`variables:
  GIT_STRATEGY: none
  BERTH_MATRIX_BRANCH: "true"
build:
  isolation: microvm
  image: %s
  parallel:
    matrix:
      - VARIANT: [%s]
  before_script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - dd if=/dev/zero bs=1048576 count=%d 2>/dev/null | sha256sum | cut -c1-16 > prefix.sum
    - PREFIX=$(cat prefix.sum)
  script:
    - echo "RESULT variant=$VARIANT prefix=$PREFIX own=$(echo "$VARIANT" | sha256sum | cut -c1-16)"
`, image, strings.Join(vals, ", "), mib)
}

var (
	resultLine = regexp.MustCompile(`RESULT variant=[0-9]+ prefix=[0-9a-f]{16} own=[0-9a-f]{16}`)
	prefixTook = regexp.MustCompile(`Started from the matrix's common prefix, run once by job [0-9]+ \(.*\) in ([0-9.]+(?:ms|s|m[0-9.]+s))`)
)

// Matrix runs MatrixPipeline with berth run twice, unbranched then
// branched (BERTH_MATRIX_BRANCH), after a warm-up run that makes the
// image's VM template, and compares their times and results.
func Matrix(ctx context.Context, o MatrixOptions) (*MatrixResult, error) {
	if o.Jobs <= 0 {
		o.Jobs = 4
	}
	if o.PrefixMiB <= 0 {
		o.PrefixMiB = 64
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	dir, err := os.MkdirTemp("", "berth-bench-matrix-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(dir+"/.gitlab-ci.yml", []byte(MatrixPipeline(o.Image, o.Jobs, o.PrefixMiB)), 0o644); err != nil {
		return nil, err
	}
	run := func(what string, branch bool, job ...string) (MatrixRun, error) {
		args := []string{"run", ".", "--var", fmt.Sprintf("BERTH_MATRIX_BRANCH=%t", branch)}
		if o.Concurrency > 0 {
			args = append(args, "--concurrency", fmt.Sprint(o.Concurrency))
		}
		for _, j := range job {
			args = append(args, "--job", j)
		}
		fmt.Fprintf(o.Progress, "bench matrix: %s...\n", what)
		cmd := exec.CommandContext(ctx, o.Berth, args...)
		cmd.Dir, cmd.Env = dir, o.Env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		began := time.Now()
		err := cmd.Run()
		r := MatrixRun{Seconds: time.Since(began).Seconds()}
		if err != nil {
			return r, fmt.Errorf("%s: berth run: %v: %s", what, err, tail(out.Bytes()))
		}
		for _, m := range resultLine.FindAll(out.Bytes(), -1) {
			r.Results = append(r.Results, string(m))
		}
		slices.Sort(r.Results)
		r.Results = slices.Compact(r.Results)
		r.Resumed = strings.Count(out.String(), "Started from the matrix's common prefix")
		if m := prefixTook.FindSubmatch(out.Bytes()); m != nil {
			if d, err := time.ParseDuration(string(m[1])); err == nil {
				r.PrefixSeconds = d.Seconds()
			}
		}
		fmt.Fprintf(o.Progress, "bench matrix: %s took %.1fs\n", what, r.Seconds)
		return r, nil
	}
	if _, err := run("warm-up (one job: the image's VM template)", false, "build: [1]"); err != nil {
		return nil, err
	}
	res := &MatrixResult{Jobs: o.Jobs, PrefixMiB: o.PrefixMiB}
	if res.Unbranched, err = run(fmt.Sprintf("%d jobs unbranched", o.Jobs), false); err != nil {
		return nil, err
	}
	if res.Branched, err = run(fmt.Sprintf("%d jobs branched", o.Jobs), true); err != nil {
		return nil, err
	}
	if len(res.Unbranched.Results) != o.Jobs {
		return nil, fmt.Errorf("the unbranched run printed %d distinct results, want %d: %q", len(res.Unbranched.Results), o.Jobs, res.Unbranched.Results)
	}
	if res.Branched.Resumed == 0 {
		return nil, errors.New("no job of the branched run started from the branch point")
	}
	res.Identical = slices.Equal(res.Unbranched.Results, res.Branched.Results)
	if res.Branched.Seconds > 0 {
		res.Speedup = res.Unbranched.Seconds / res.Branched.Seconds
	}
	return res, nil
}
