package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// ExecutorCase is one executor to measure.
type ExecutorCase struct {
	Name     string
	Provider executor.Provider
	// Job is the payload Prepare gets (an image for docker); nil for
	// executors that need none.
	Job *runnerapi.JobResponse
	// BuildsDir and CacheDir are the runner's builds_dir and cache_dir
	// ("" for the executor's defaults).
	BuildsDir, CacheDir string
	// Inspect, if set, looks at a job's environment after its first
	// stage (a VM executor: the VM's boot time and memory).
	Inspect func(executor.Executor) (Inspection, error)
}

// Inspection is what ExecutorCase.Inspect found.
type Inspection struct {
	// Boot is the time from asking for the environment to it answering
	// (a VM: from the hypervisor's create to the guest agent's hello).
	Boot time.Duration
	// RSS is the resident memory of the environment's host process (a
	// VM's hypervisor process), in bytes.
	RSS int64
}

// ExecutorResult are the figures of one executor: per job, the time from
// Create to the first byte of the first script's output (what a user
// waits for after a runner took the job), each following stage on the
// prepared environment, and a trivial job's total (prepare, the stages a
// job runs — get_sources, restore_cache, download_artifacts, step_script,
// archive_cache, upload_artifacts — each a one-line script, and cleanup).
type ExecutorResult struct {
	Name           string  `json:"name"`
	Jobs           int     `json:"jobs"`
	FirstLineP50Ms float64 `json:"first_line_p50_ms"`
	FirstLineP95Ms float64 `json:"first_line_p95_ms"`
	StageP50Ms     float64 `json:"stage_p50_ms"`
	JobP50Ms       float64 `json:"job_p50_ms"`
	JobP95Ms       float64 `json:"job_p95_ms"`
	// With ExecutorCase.Inspect: the environment's boot time and its host
	// process's resident memory, p50.
	BootP50Ms float64 `json:"boot_p50_ms,omitempty"`
	RSSP50MiB float64 `json:"rss_p50_mib,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// BenchRunner is the runner identity the benchmark's jobs carry (what a
// caller removes afterwards: docker volumes, say).
var BenchRunner = executor.SweepOptions{SystemID: "s_benchmark000", ShortToken: "benchtok"}

// trivialStages are the stages of a trivial job after the first.
var trivialStages = []string{executor.StageRestoreCache, executor.StageDownloadArtifacts, executor.StageStepScript,
	executor.StageArchiveCache, executor.StageUploadArtifactsOnSuccess, executor.StageCleanupFileVariables}

// Executors measures each case with jobs trivial jobs run one after the
// other (after one warm-up job, not counted).
func Executors(ctx context.Context, cases []ExecutorCase, jobs int, progress io.Writer) []ExecutorResult {
	if progress == nil {
		progress = io.Discard
	}
	var out []ExecutorResult
	for _, c := range cases {
		res := ExecutorResult{Name: c.Name, Jobs: jobs}
		var first, total, stage, boot []time.Duration
		var rss []int64
		for i := 0; i <= jobs; i++ {
			f, t, s, in, err := trivialJob(ctx, c, i)
			if err != nil {
				res.Err = err.Error()
				break
			}
			if i == 0 {
				continue // warm-up: image caches, connections, helper upload
			}
			first, total, stage = append(first, f), append(total, t), append(stage, s...)
			boot, rss = append(boot, in.Boot), append(rss, in.RSS)
			fmt.Fprintf(progress, "bench executors: %s job %d/%d: first line after %v\n", c.Name, i, jobs, f.Round(time.Millisecond))
		}
		if res.Err == "" {
			res.FirstLineP50Ms, res.FirstLineP95Ms = ms(quantile(first, .5)), ms(quantile(first, .95))
			res.JobP50Ms, res.JobP95Ms = ms(quantile(total, .5)), ms(quantile(total, .95))
			res.StageP50Ms = ms(quantile(stage, .5))
			if c.Inspect != nil {
				res.BootP50Ms = ms(quantile(boot, .5))
				res.RSSP50MiB = math.Round(float64(quantile(rss, .5))/(1<<20)*10) / 10
			}
		}
		fmt.Fprintf(progress, "bench executors: %s done\n", c.Name)
		out = append(out, res)
	}
	return out
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*100) / 100 }

func quantile[T int64 | time.Duration](ds []T, q float64) T {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

// firstByte records when the first byte arrives.
type firstByte struct {
	once sync.Once
	at   time.Time
}

func (f *firstByte) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { f.at = time.Now() })
	}
	return len(p), nil
}

func trivialJob(ctx context.Context, c ExecutorCase, n int) (first, total time.Duration, stages []time.Duration, in Inspection, err error) {
	start := time.Now()
	ex, err := c.Provider.Create(ctx)
	if err != nil {
		return 0, 0, nil, in, fmt.Errorf("%s: create: %w", c.Name, err)
	}
	defer func() {
		if cerr := ex.Cleanup(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = fmt.Errorf("%s: cleanup: %w", c.Name, cerr)
		}
		total = time.Since(start)
	}()
	o := executor.PrepareOptions{JobID: int64(n + 1), ProjectPath: "bench/project", ShortToken: BenchRunner.ShortToken, ConcurrencyID: 0,
		SystemID: BenchRunner.SystemID, Output: io.Discard, BuildsDir: c.BuildsDir, CacheDir: c.CacheDir}
	if c.Job != nil {
		job := *c.Job
		job.ID = o.JobID
		o.Job = &job
	}
	if _, err := ex.Prepare(ctx, o); err != nil {
		return 0, 0, nil, in, fmt.Errorf("%s: prepare: %w", c.Name, err)
	}
	fb := &firstByte{}
	if err := ex.Run(ctx, executor.Command{Stage: executor.StageGetSources, Script: "echo first line\n", Output: fb}); err != nil {
		return 0, 0, nil, in, fmt.Errorf("%s: first stage: %w", c.Name, err)
	}
	if fb.at.IsZero() {
		return 0, 0, nil, in, fmt.Errorf("%s: the first stage printed nothing", c.Name)
	}
	first = fb.at.Sub(start)
	if c.Inspect != nil {
		if in, err = c.Inspect(ex); err != nil {
			return 0, 0, nil, in, fmt.Errorf("%s: inspecting the environment: %w", c.Name, err)
		}
	}
	for _, st := range trivialStages {
		t := time.Now()
		if err := ex.Run(ctx, executor.Command{Stage: st, Script: "echo " + st + "\n", Output: io.Discard}); err != nil {
			return 0, 0, nil, in, fmt.Errorf("%s: stage %s: %w", c.Name, st, err)
		}
		stages = append(stages, time.Since(t))
	}
	return first, 0, stages, in, nil
}
