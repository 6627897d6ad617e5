package local

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner"
)

// Timings is where the time of a run went (berth run --timings): the
// run's phases in order, then every job as its runner saw it.
type Timings struct {
	Phases []Phase       `json:"phases"`
	Total  float64       `json:"total_seconds"`
	Jobs   []JobTimings  `json:"jobs"`
	Steps  []StepSummary `json:"steps"`
}

// Phase is a named span of time.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// JobTimings is one job, from its hand-out to its final update.
type JobTimings struct {
	ID    int64  `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
	// HandedOut is when the runner read the job's payload, in seconds
	// since the pipeline was created.
	HandedOut float64 `json:"handed_out_seconds"`
	// Acknowledge is the job's first update (state running).
	Acknowledge float64 `json:"acknowledge_seconds"`
	// Steps are the job's sections in order (GitLab's stage names, then
	// "cleanup", the executor's cleanup).
	Steps []Phase `json:"steps"`
	// Finalize is the final update (trace flushed, state sent).
	Finalize float64 `json:"finalize_seconds"`
	// Total runs from hand-out to the final update accepted; Overhead is
	// Total less the user's scripts (step_* and after_script).
	Total    float64 `json:"total_seconds"`
	Overhead float64 `json:"overhead_seconds"`
}

// StepSummary is one step over every job of the run.
type StepSummary struct {
	Name   string  `json:"name"`
	Jobs   int     `json:"jobs"`
	Median float64 `json:"median_seconds"`
	Max    float64 `json:"max_seconds"`
}

// timer records a run's phases and its jobs' timings.
type timer struct {
	mu       sync.Mutex
	start    time.Time
	last     time.Time
	pipeline time.Time // when the pipeline was created
	phases   []Phase
	jobs     []runner.JobTiming
}

func newTimer() *timer {
	now := time.Now()
	return &timer{start: now, last: now}
}

// mark ends the phase name (nil-safe: a run without --timings).
func (t *timer) mark(name string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	t.phases = append(t.phases, Phase{Name: name, Seconds: now.Sub(t.last).Seconds()})
	t.last = now
	if name == "pipeline" {
		t.pipeline = now
	}
}

func (t *timer) job(jt runner.JobTiming) {
	t.mu.Lock()
	t.jobs = append(t.jobs, jt)
	t.mu.Unlock()
}

// isScript reports whether a step runs the user's commands.
func isScript(step string) bool {
	return step == executor.StageStepScript || step == executor.StageAfterScript || strings.HasPrefix(step, "step_")
}

func (t *timer) result() *Timings {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := &Timings{Phases: slices.Clone(t.phases), Total: t.last.Sub(t.start).Seconds(), Jobs: []JobTimings{}}
	jobs := slices.Clone(t.jobs)
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].JobID < jobs[b].JobID })
	base := t.pipeline
	if base.IsZero() {
		base = t.start
	}
	byStep := map[string][]float64{}
	var order []string
	for _, j := range jobs {
		jt := JobTimings{ID: j.JobID, Name: j.Name, State: j.State, HandedOut: j.Received.Sub(base).Seconds(),
			Total: j.Total().Seconds(), Steps: []Phase{}}
		if !j.Acknowledged.IsZero() {
			jt.Acknowledge = j.Acknowledged.Sub(j.Received).Seconds()
		}
		end := j.Acknowledged
		script := time.Duration(0)
		for _, s := range j.Steps {
			jt.Steps = append(jt.Steps, Phase{Name: s.Name, Seconds: s.Duration.Seconds()})
			if e := s.Start.Add(s.Duration); e.After(end) {
				end = e
			}
			if isScript(s.Name) {
				script += s.Duration
			}
			if _, seen := byStep[s.Name]; !seen {
				order = append(order, s.Name)
			}
			byStep[s.Name] = append(byStep[s.Name], s.Duration.Seconds())
		}
		if !end.IsZero() && j.Finished.After(end) {
			jt.Finalize = j.Finished.Sub(end).Seconds()
		}
		jt.Overhead = (j.Total() - script).Seconds()
		out.Jobs = append(out.Jobs, jt)
	}
	for _, name := range order {
		v := byStep[name]
		slices.Sort(v)
		out.Steps = append(out.Steps, StepSummary{Name: name, Jobs: len(v), Median: v[len(v)/2], Max: v[len(v)-1]})
	}
	return out
}

// stepColumns groups a job's steps into the columns of the timings
// table.
var stepColumns = []struct {
	title string
	steps []string
}{
	{"PREPARE", []string{executor.StagePrepareExecutor, executor.StagePrepareScript}},
	{"SOURCES", []string{executor.StageGetSources}},
	{"RESTORE", []string{executor.StageRestoreCache, executor.StageDownloadArtifacts}},
	{"SCRIPT", nil}, // step_* and after_script
	{"SAVE", []string{executor.StageArchiveCache, executor.StageArchiveCacheOnFailure, executor.StageUploadArtifactsOnSuccess, executor.StageUploadArtifactsOnFailure}},
	{"CLEANUP", []string{executor.StageCleanupFileVariables, "cleanup"}},
}

func ms(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

// PrintTimings writes the run's phases, a row per job and each step's
// median over the jobs.
func PrintTimings(w io.Writer, t *Timings) {
	fmt.Fprintln(w, "PHASE     TIME")
	for _, p := range t.Phases {
		fmt.Fprintf(w, "%-9s %9s\n", p.Name, ms(p.Seconds))
	}
	fmt.Fprintf(w, "%-9s %9s\n", "total", ms(t.Total))
	if len(t.Jobs) == 0 {
		return
	}
	nameW := len("JOB")
	for _, j := range t.Jobs {
		nameW = max(nameW, len(j.Name))
	}
	fmt.Fprintf(w, "\n%-*s  %9s  %8s", nameW, "JOB", "HANDED", "ACK")
	for _, c := range stepColumns {
		fmt.Fprintf(w, "  %8s", c.title)
	}
	fmt.Fprintf(w, "  %8s  %8s  %8s\n", "FINAL", "TOTAL", "OVERHEAD")
	var overheads []float64
	for _, j := range t.Jobs {
		fmt.Fprintf(w, "%-*s  %9s  %8s", nameW, j.Name, fmt.Sprintf("+%.3fs", j.HandedOut), ms(j.Acknowledge))
		for _, c := range stepColumns {
			var sum float64
			for _, s := range j.Steps {
				if (c.steps == nil && isScript(s.Name)) || slices.Contains(c.steps, s.Name) {
					sum += s.Seconds
				}
			}
			fmt.Fprintf(w, "  %8s", ms(sum))
		}
		fmt.Fprintf(w, "  %8s  %8s  %8s\n", ms(j.Finalize), ms(j.Total), ms(j.Overhead))
		overheads = append(overheads, j.Overhead)
	}
	slices.Sort(overheads)
	fmt.Fprintf(w, "\nper-job overhead (hand-out to final update, less the scripts): median %s, max %s over %d jobs\n",
		ms(overheads[len(overheads)/2]), ms(overheads[len(overheads)-1]), len(overheads))
	fmt.Fprintln(w, "\nSTEP                          JOBS    MEDIAN       MAX")
	for _, s := range t.Steps {
		fmt.Fprintf(w, "%-28s  %4d  %8s  %8s\n", s.Name, s.Jobs, ms(s.Median), ms(s.Max))
	}
}
