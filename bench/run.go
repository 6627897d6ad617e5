package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// RunOptions configure Run: berth run on a generated fan-out/fan-in
// pipeline, optionally beside another command on the same directory.
type RunOptions struct {
	// Berth is the berth binary to time (`berth run DIR`).
	Berth string
	// Jobs is the size of the generated pipeline (default 20): half of
	// them write an artifact, the other half each read one through needs.
	Jobs int
	// Dir, if set, is run instead of a generated pipeline.
	Dir string
	// Against, if set, is a command timed on the same directory (sh -c,
	// in the directory), e.g. "gitlab-ci-local".
	Against string
	// Runs is how many times each command runs (default 3); they
	// alternate, so both see the same machine.
	Runs int
	// TrivialJobs is the length of the chain of `true` jobs, run one at
	// a time, whose per-job overhead is measured (default 10); NoTrivial
	// skips that.
	TrivialJobs int
	NoTrivial   bool
	// Progress receives a line per run (nil: none).
	Progress io.Writer
}

// RunResult is what Run measured.
type RunResult struct {
	Jobs  int        `json:"jobs"`
	Runs  int        `json:"runs"`
	Berth RunTimings `json:"berth"`
	// Against is set when RunOptions.Against was.
	Against *RunTimings `json:"against,omitempty"`
	// Ratio is berth's best over the other command's best.
	Ratio float64 `json:"ratio,omitempty"`
	// Overhead is, per job of berth's best run, the time from hand-out
	// to the final update less the job's scripts.
	Overhead Spread `json:"overhead"`
	// Trivial is the per-job overhead of a chain of `true` jobs, one at
	// a time (nil when not measured).
	Trivial *Spread `json:"trivial,omitempty"`
}

// RunTimings are one command's wall times.
type RunTimings struct {
	Command string    `json:"command"`
	Seconds []float64 `json:"seconds"`
	Best    float64   `json:"best_seconds"`
	Median  float64   `json:"median_seconds"`
	// PerJob is Best divided by the number of jobs.
	PerJob float64 `json:"per_job_seconds"`
}

// Spread is a distribution of durations in seconds.
type Spread struct {
	N      int     `json:"n"`
	Median float64 `json:"median_seconds"`
	P95    float64 `json:"p95_seconds"`
	Max    float64 `json:"max_seconds"`
}

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return Spread{N: len(v), Median: v[len(v)/2], P95: v[min(len(v)-1, len(v)*95/100)], Max: v[len(v)-1]}
}

func timings(cmd string, secs []float64, jobs int) RunTimings {
	s := slices.Clone(secs)
	slices.Sort(s)
	t := RunTimings{Command: cmd, Seconds: secs, Best: s[0], Median: s[len(s)/2]}
	if jobs > 0 {
		t.PerJob = t.Best / float64(jobs)
	}
	return t
}

// FanPipeline is a .gitlab-ci.yml of n shell jobs: ⌈n/2⌉ in stage build
// each write an artifact, the others in stage test each read one of them
// through needs.
func FanPipeline(n int) string {
	producers := (n + 1) / 2
	var b strings.Builder
	b.WriteString("# berth bench run: fan-out/fan-in with artifacts\nstages: [build, test]\n")
	for i := 1; i <= producers; i++ {
		fmt.Fprintf(&b, "\nbuild%d:\n  stage: build\n  script:\n    - mkdir -p out && echo %d > out/b%d.txt\n  artifacts:\n    paths: [out/b%d.txt]\n", i, i, i, i)
	}
	for i := 1; i <= n-producers; i++ {
		p := (i-1)%producers + 1
		fmt.Fprintf(&b, "\ntest%d:\n  stage: test\n  needs: [build%d]\n  script:\n    - test \"$(cat out/b%d.txt)\" = %d\n", i, p, p, p)
	}
	return b.String()
}

// chainPipeline is n `true` jobs, one stage each.
func chainPipeline(n int) string {
	var b strings.Builder
	stages := make([]string, n)
	for i := range stages {
		stages[i] = fmt.Sprintf("s%d", i+1)
	}
	fmt.Fprintf(&b, "stages: [%s]\n", strings.Join(stages, ", "))
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "\ntrue%d:\n  stage: s%d\n  script: [\"true\"]\n", i, i)
	}
	return b.String()
}

// gitProject makes dir a git repository with one commit of files (tools
// such as gitlab-ci-local want one), ignoring what they write there.
func gitProject(ctx context.Context, dir string, files map[string]string) error {
	files[".gitignore"] = ".gitlab-ci-local/\n"
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A"},
		{"-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "bench"},
		{"remote", "add", "origin", "https://example.invalid/bench/project.git"},
	} {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// berthRunJSON is what Run reads of `berth run --json --timings`.
type berthRunJSON struct {
	Status  string `json:"status"`
	Timings struct {
		Jobs []struct {
			Name     string  `json:"name"`
			Overhead float64 `json:"overhead_seconds"`
		} `json:"jobs"`
	} `json:"timings"`
}

// Run times berth run (and o.Against) on the same pipeline.
func Run(ctx context.Context, o RunOptions) (*RunResult, error) {
	if o.Berth == "" {
		return nil, errors.New("bench run: no berth binary")
	}
	if o.Jobs <= 0 {
		o.Jobs = 20
	}
	if o.Runs <= 0 {
		o.Runs = 3
	}
	if o.TrivialJobs <= 0 {
		o.TrivialJobs = 10
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	tmp, err := os.MkdirTemp("", "berth-bench-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// berth run keeps the build directories of what it runs in the
	// user's cache; the bench's generated directories' go with it.
	cache, err := os.MkdirTemp(tmp, "cache-")
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(), "XDG_CACHE_HOME="+cache)
	dir, jobs := o.Dir, o.Jobs
	if dir == "" {
		dir = filepath.Join(tmp, "fan")
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		if err := gitProject(ctx, dir, map[string]string{".gitlab-ci.yml": FanPipeline(o.Jobs)}); err != nil {
			return nil, err
		}
	} else {
		jobs = 0
	}
	res := &RunResult{Jobs: jobs, Runs: o.Runs}
	var berthSecs, againstSecs []float64
	var bestOverheads []float64
	best := -1.0
	for i := 1; i <= o.Runs; i++ {
		secs, out, err := timeCmd(ctx, dir, env, o.Berth, "run", "--json", "--timings", ".")
		if err != nil {
			return nil, fmt.Errorf("berth run: %w\n%s", err, tail(out))
		}
		var r berthRunJSON
		if err := json.Unmarshal(out, &r); err != nil || r.Status != "success" {
			return nil, fmt.Errorf("berth run: pipeline %q (%v)\n%s", r.Status, err, tail(out))
		}
		if jobs == 0 {
			jobs, res.Jobs = len(r.Timings.Jobs), len(r.Timings.Jobs)
		}
		berthSecs = append(berthSecs, secs)
		if best < 0 || secs < best {
			best, bestOverheads = secs, nil
			for _, j := range r.Timings.Jobs {
				bestOverheads = append(bestOverheads, j.Overhead)
			}
		}
		fmt.Fprintf(progress, "run %d/%d  berth run %.2fs", i, o.Runs, secs)
		if o.Against != "" {
			secs, out, err := timeCmd(ctx, dir, nil, "sh", "-c", o.Against)
			if err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", o.Against, err, tail(out))
			}
			againstSecs = append(againstSecs, secs)
			fmt.Fprintf(progress, "  %s %.2fs", o.Against, secs)
		}
		fmt.Fprintln(progress)
	}
	res.Berth = timings("berth run", berthSecs, jobs)
	res.Overhead = spread(bestOverheads)
	if o.Against != "" {
		a := timings(o.Against, againstSecs, jobs)
		res.Against = &a
		res.Ratio = res.Berth.Best / a.Best
	}
	if !o.NoTrivial {
		chain := filepath.Join(tmp, "chain")
		if err := os.Mkdir(chain, 0o755); err != nil {
			return nil, err
		}
		if err := gitProject(ctx, chain, map[string]string{".gitlab-ci.yml": chainPipeline(o.TrivialJobs)}); err != nil {
			return nil, err
		}
		_, out, err := timeCmd(ctx, chain, env, o.Berth, "run", "--json", "--timings", "--concurrency", "1", ".")
		if err != nil {
			return nil, fmt.Errorf("berth run (trivial jobs): %w\n%s", err, tail(out))
		}
		var r berthRunJSON
		if err := json.Unmarshal(out, &r); err != nil || r.Status != "success" {
			return nil, fmt.Errorf("berth run (trivial jobs): pipeline %q (%v)\n%s", r.Status, err, tail(out))
		}
		var v []float64
		for _, j := range r.Timings.Jobs {
			v = append(v, j.Overhead)
		}
		s := spread(v)
		res.Trivial = &s
		fmt.Fprintf(progress, "trivial jobs: %d `true` jobs one after the other, overhead median %.1f ms\n", s.N, s.Median*1000)
	}
	return res, nil
}

// timeCmd runs name args in dir (with env, nil: this process's) and
// returns its wall time and stdout (stderr too when it fails).
func timeCmd(ctx context.Context, dir string, env []string, name string, args ...string) (float64, []byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	secs := time.Since(start).Seconds()
	if err != nil {
		return secs, append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return secs, stdout.Bytes(), nil
}

// tail is the end of a command's output, for an error.
func tail(b []byte) string {
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
