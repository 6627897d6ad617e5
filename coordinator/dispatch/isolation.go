package dispatch

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
)

// Isolation levels (docs/isolation.md). A job asks for a level (the ci
// keyword isolation:, or the BERTH_ISOLATION variable); its project may set
// a minimum; the job needs the stronger of the two. Runner managers offer
// levels in info.isolation_levels of their requests (none when they name
// none; runners.Registry remembers them), and the queue hands a job only
// to a runner whose strongest offered level is at least as strong as the
// one the job needs. A job nobody can take says why (pending_reason).

// minimum is a project's minimum level ("" for none).
func (d *Dispatcher) minimum(projectID int64) executor.Isolation {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.minimums[projectID]
}

// setMinimum records a project's minimum and reports whether it changed.
func (d *Dispatcher) setMinimum(projectID int64, l executor.Isolation) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l == executor.IsolationNone {
		l = ""
	}
	if d.minimums[projectID] == l {
		return false
	}
	if l == "" {
		delete(d.minimums, projectID)
	} else {
		d.minimums[projectID] = l
	}
	return true
}

// jobIsolation is the level a job needs: the stronger of what it asks for
// and its project's minimum; none when neither names one.
func (d *Dispatcher) jobIsolation(j *store.Job) executor.Isolation {
	asked, _ := ParseIsolation(j.Isolation) // written by this coordinator, checked then
	l := executor.StrongerIsolation(asked, d.minimum(j.ProjectID))
	if l == "" {
		return executor.IsolationNone
	}
	return l
}

// queueJob converts a stored job to the queue's matching view, with the
// isolation it needs now.
func (d *Dispatcher) queueJob(j *store.Job) *queue.Job {
	return &queue.Job{
		ID:           j.ID,
		ProjectID:    j.ProjectID,
		NamespaceIDs: j.NamespaceIDs,
		Protected:    j.Protected,
		Tags:         j.Tags,
		Priority:     j.Priority,
		Isolation:    d.jobIsolation(j).Rank(),
		EnqueuedAt:   j.QueuedSince(),
		Data:         j,
	}
}

// SetProjectMinimum records a project's minimum level, applies it to the
// project's jobs already in the queue, and tells the other replicas.
func (d *Dispatcher) SetProjectMinimum(projectID int64, l executor.Isolation) {
	if d.applyProjectMinimum(projectID, l) {
		d.publish(cluster.ProjectChanged, projectID)
	}
}

// ProjectChanged reads the minimum of a project another replica changed
// and applies it here.
func (d *Dispatcher) ProjectChanged(ctx context.Context, projectID int64) error {
	p, err := d.store.GetProject(ctx, projectID)
	if err != nil {
		return err
	}
	d.applyProjectMinimum(p.ID, executor.Isolation(p.MinIsolation))
	return nil
}

// applyProjectMinimum records a project's minimum level here and applies
// it to the queued jobs; it reports whether the minimum changed.
func (d *Dispatcher) applyProjectMinimum(projectID int64, l executor.Isolation) bool {
	if !d.setMinimum(projectID, l) {
		return false
	}
	d.requeueIsolation(projectID)
	return true
}

// requeueIsolation recomputes the level of the queued jobs of a project
// (0: of every project) after its minimum changed.
func (d *Dispatcher) requeueIsolation(projectID int64) {
	d.queue.UpdateIsolation(func(qj *queue.Job) int {
		j, ok := qj.Data.(*store.Job)
		if !ok || projectID != 0 && qj.ProjectID != projectID {
			return qj.Isolation
		}
		return d.jobIsolation(j).Rank()
	})
}

// loadMinimums reads the projects' minimums.
func (d *Dispatcher) loadMinimums(ctx context.Context) error {
	projects, err := d.store.ListProjects(ctx)
	if err != nil {
		return fmt.Errorf("loading project isolation minimums: %w", err)
	}
	for _, p := range projects {
		if l, err := ParseIsolation(p.MinIsolation); err == nil {
			d.setMinimum(p.ID, l)
		}
	}
	return nil
}

// IsolationWait is why a queued job waits for its isolation level.
type IsolationWait struct {
	Level executor.Isolation
	// Offered are the levels offered by the online runners that could
	// run the job but for its isolation, weakest first; empty when there
	// are none.
	Offered []executor.Isolation
}

// Reason is the job's pending_reason.
func (w *IsolationWait) Reason() string {
	if len(w.Offered) == 0 {
		return fmt.Sprintf("no runner offers isolation level %s (no online runner could take this job)", w.Level)
	}
	return fmt.Sprintf("no runner offers isolation level %s (online runners offer: %s)", w.Level, joinLevels(w.Offered))
}

// LogLine is the line the job's log shows before it starts.
func (w *IsolationWait) LogLine() string {
	if len(w.Offered) == 0 {
		return fmt.Sprintf("Waiting for a runner that offers isolation level %s: no online runner could take this job\n", w.Level)
	}
	return fmt.Sprintf("Waiting for a runner that offers isolation level %s: no online runner offers it (offered: %s)\n", w.Level, joinLevels(w.Offered))
}

func joinLevels(ls []executor.Isolation) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

// IsolationWaitOf tells whether a queued job waits for its isolation
// level: it needs more than none, and no runner manager that asked within
// runners.OnlineWindow and may run the job otherwise (scope, tags,
// protected refs) offers that level or a stronger one. Nil otherwise, and
// for jobs that are not queued. It reads no store.
func (d *Dispatcher) IsolationWaitOf(j *store.Job) *IsolationWait {
	if j.Status != store.StatusPending || j.RunnerManagerID != 0 {
		return nil
	}
	qj := d.queueJob(j)
	if qj.Isolation == 0 {
		return nil
	}
	w := &IsolationWait{Level: executor.IsolationAt(qj.Isolation)}
	for _, o := range d.runners.Offers(d.clock.Now().Add(-runners.OnlineWindow)) {
		if !o.View.Admits(qj) {
			continue
		}
		if o.View.Isolation >= qj.Isolation {
			return nil
		}
		for _, l := range o.Levels {
			if !slices.Contains(w.Offered, l) {
				w.Offered = append(w.Offered, l)
			}
		}
	}
	slices.SortFunc(w.Offered, func(a, b executor.Isolation) int { return a.Rank() - b.Rank() })
	return w
}

// PendingReason is a job's pending_reason: why a queued job is not handed
// out, when the coordinator knows ("" otherwise).
func (d *Dispatcher) PendingReason(j *store.Job) string {
	if w := d.IsolationWaitOf(j); w != nil {
		return w.Reason()
	}
	return ""
}
