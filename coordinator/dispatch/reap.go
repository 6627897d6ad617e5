package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// ReapJobs enforces the server-side job lifecycle once, at now:
//   - handed out but not acknowledged within Timeouts.Ack → back to the
//     queue;
//   - pending and not picked up within Timeouts.Pending → failed,
//     stuck_or_timeout_failure;
//   - running past its timeout plus Timeouts.Grace → failed,
//     job_execution_timeout;
//   - running without an update for Timeouts.Stuck → failed,
//     no_updates_running;
//   - canceling without an update for Timeouts.Canceling → canceled,
//     no_updates_canceling.
//
// Every change is a compare-and-set, so a job that moved on meanwhile is
// left alone. One replica of a cluster (the leader) calls it.
func (d *Dispatcher) ReapJobs(ctx context.Context, now time.Time) error {
	jobs, err := d.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}})
	if err != nil {
		return err
	}
	var errs []error
	for _, j := range jobs {
		if j.RunnerManagerID == 0 && graph.IsBridge(j) { // (only a bridge runs without a runner)
			continue // no runner holds it: it follows its downstream pipeline
		}
		if err := d.reapJob(ctx, j, now); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (d *Dispatcher) reapJob(ctx context.Context, j *store.Job, now time.Time) error {
	t := d.timeouts
	fail := func(from store.Status, to store.Status, reason string) error {
		nj, err := d.Transition(ctx, j.ID, []store.Status{from},
			store.JobUpdate{Status: to, FailureReason: reason, FinishedAt: now, UpdatedAt: now})
		if err != nil {
			return err
		}
		d.log.Info("job dropped by the server", "job_id", j.ID, "status", nj.Status, "reason", reason)
		return nil
	}
	switch j.Status {
	case store.StatusPending:
		if j.RunnerManagerID != 0 {
			if now.Sub(j.AssignedAt) >= t.Ack && now.Sub(j.UpdatedAt) >= t.Ack {
				if err := d.store.UnassignJob(ctx, j.ID, j.RunnerManagerID); err != nil {
					return err
				}
				// Whatever the runner that never acknowledged wrote is not
				// the log of the run to come: the next runner appends from
				// offset 0 (gitlab-runner 17 crashes on the range a kept
				// log makes it answer).
				if err := d.store.ResetTrace(ctx, j.ID); err != nil {
					d.log.Error("clearing the log of a job queued again", "job_id", j.ID, "err", err)
				}
				d.forgetActive(j.ID)
				d.queue.Done(managerKey(j.RunnerManagerID))
				d.queue.Push(d.queueJob(j))
				d.log.Info("job not acknowledged, queued again", "job_id", j.ID)
			}
			return nil
		}
		if now.Sub(j.QueuedSince()) >= t.Pending {
			d.queue.Remove(j.ID)
			return fail(store.StatusPending, store.StatusFailed, runnerapi.StuckOrTimeoutFailure)
		}
	case store.StatusRunning:
		if j.Timeout > 0 && !j.StartedAt.IsZero() && now.Sub(j.StartedAt) >= time.Duration(j.Timeout)*time.Second+t.Grace {
			return fail(store.StatusRunning, store.StatusFailed, runnerapi.JobExecutionTimeout)
		}
		if now.Sub(j.UpdatedAt) >= t.Stuck {
			return fail(store.StatusRunning, store.StatusFailed, runnerapi.NoUpdatesRunning)
		}
	case store.StatusCanceling:
		if now.Sub(j.UpdatedAt) >= t.Canceling {
			return fail(store.StatusCanceling, store.StatusCanceled, runnerapi.NoUpdatesCanceling)
		}
	}
	return nil
}
