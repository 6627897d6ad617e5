package runner

import (
	"sync"
	"time"
)

// JobTiming is where one job's time went, as its runner saw it: from the
// payload read off the job request to the final update accepted. It is
// what `berth run --timings` prints; a Manager reports one per job to
// Options.OnJobTiming.
type JobTiming struct {
	JobID int64
	Name  string
	Stage string // the pipeline stage
	// Received is when the job's payload was read (the job handed out);
	// Acknowledged when the coordinator accepted it as running; Finished
	// when it accepted the final update.
	Received     time.Time
	Acknowledged time.Time
	Finished     time.Time
	// Steps are the job's sections in order (prepare_executor,
	// get_sources, …, step_script, upload_artifacts_on_success, …),
	// then "cleanup": the executor's cleanup.
	Steps []StepTiming
	State string // success | failed | aborted
}

// StepTiming is one section of a job.
type StepTiming struct {
	Name     string
	Start    time.Time
	Duration time.Duration
}

// Total is the time from hand-out to the final update.
func (t JobTiming) Total() time.Duration { return t.Finished.Sub(t.Received) }

// Step returns the summed duration of the steps named name.
func (t JobTiming) Step(name string) time.Duration {
	var d time.Duration
	for _, s := range t.Steps {
		if s.Name == name {
			d += s.Duration
		}
	}
	return d
}

// timings collects a job's steps (stages may end on other goroutines:
// after_script runs under its own context).
type timings struct {
	mu sync.Mutex
	t  JobTiming
}

func (t *timings) step(name string, start time.Time) {
	t.mu.Lock()
	t.t.Steps = append(t.t.Steps, StepTiming{Name: name, Start: start, Duration: time.Since(start)})
	t.mu.Unlock()
}

func (t *timings) snapshot() JobTiming {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.t
	out.Steps = append([]StepTiming(nil), t.t.Steps...)
	return out
}

func (t *timings) setState(s string) {
	t.mu.Lock()
	t.t.State = s
	t.mu.Unlock()
}
