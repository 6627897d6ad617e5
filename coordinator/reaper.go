package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// reapLoop reaps every ReapInterval until ctx ends (the server stops, or
// this replica no longer leads).
func (s *Server) reapLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, s.cfg.ReapInterval)
			if err := s.Reap(rctx); err != nil {
				s.log.Error("reaping jobs", "err", err)
			}
			cancel()
		}
	}
}

// Reap enforces the server-side job lifecycle once, at the clock's now:
//   - handed out but not acknowledged within AckTimeout → back to the queue;
//   - pending and not picked up within PendingTimeout → failed,
//     stuck_or_timeout_failure;
//   - running past its timeout plus TimeoutGrace → failed,
//     job_execution_timeout;
//   - running without an update for StuckTimeout → failed, no_updates_running;
//   - canceling without an update for CancelingTimeout → canceled,
//     no_updates_canceling;
//   - scheduled (delayed) jobs that are due → pending, through the engine;
//   - artifacts past their expiry → deleted;
//   - environments past auto_stop_in → stopped (deploy.go);
//   - Pages deployments past their expire_in → removed (pages.go);
//   - logs of jobs finished TraceArchiveAfter ago → archived (traces.go).
func (s *Server) Reap(ctx context.Context) error {
	now := s.clock.Now().UTC()
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}})
	if err != nil {
		return err
	}
	var errs []error
	for _, j := range jobs {
		if j.RunnerManagerID == 0 && graph.IsBridge(j) { // (only a bridge runs without a runner)
			continue // no runner holds it: it follows its downstream pipeline
		}
		if err := s.reapJob(ctx, j, now); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, err)
		}
	}
	// Delayed jobs whose time has come (the engine also wakes itself for
	// them; this catches up after a restart or with an injected clock).
	scheduled, err := s.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusScheduled}})
	if err != nil {
		errs = append(errs, err)
	}
	for _, j := range scheduled {
		if !now.Before(j.ScheduledAt) {
			s.engine.mark(j.PipelineID)
		}
	}
	expired, err := s.store.ExpiredArtifacts(ctx, now, 1000)
	if err != nil {
		errs = append(errs, err)
	}
	for _, a := range expired {
		if err := s.artifacts.Delete(ctx, a.StorageKey); err != nil && !errors.Is(err, artifacts.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		if err := s.store.DeleteArtifact(ctx, a.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := s.autoStopEnvironments(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := s.expirePages(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := s.logs.Archive(ctx, now); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *Server) reapJob(ctx context.Context, j *store.Job, now time.Time) error {
	fail := func(from store.Status, to store.Status, reason string) error {
		nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{from},
			store.JobUpdate{Status: to, FailureReason: reason, FinishedAt: now, UpdatedAt: now})
		if err != nil {
			return err
		}
		s.log.Info("job dropped by the server", "job_id", j.ID, "status", nj.Status, "reason", reason)
		s.jobFinished(nj)
		return nil
	}
	switch j.Status {
	case store.StatusPending:
		if j.RunnerManagerID != 0 {
			if now.Sub(j.AssignedAt) >= s.cfg.AckTimeout && now.Sub(j.UpdatedAt) >= s.cfg.AckTimeout {
				if err := s.store.UnassignJob(ctx, j.ID, j.RunnerManagerID); err != nil {
					return err
				}
				s.forgetActive(j.ID)
				s.queue.Done(managerKey(j.RunnerManagerID))
				s.queue.Push(s.queueJob(j))
				s.log.Info("job not acknowledged, queued again", "job_id", j.ID)
			}
			return nil
		}
		if now.Sub(j.QueuedSince()) >= s.cfg.PendingTimeout {
			s.queue.Remove(j.ID)
			return fail(store.StatusPending, store.StatusFailed, runnerapi.StuckOrTimeoutFailure)
		}
	case store.StatusRunning:
		if j.Timeout > 0 && !j.StartedAt.IsZero() && now.Sub(j.StartedAt) >= time.Duration(j.Timeout)*time.Second+s.cfg.TimeoutGrace {
			return fail(store.StatusRunning, store.StatusFailed, runnerapi.JobExecutionTimeout)
		}
		if now.Sub(j.UpdatedAt) >= s.cfg.StuckTimeout {
			return fail(store.StatusRunning, store.StatusFailed, runnerapi.NoUpdatesRunning)
		}
	case store.StatusCanceling:
		if now.Sub(j.UpdatedAt) >= s.cfg.CancelingTimeout {
			return fail(store.StatusCanceling, store.StatusCanceled, runnerapi.NoUpdatesCanceling)
		}
	}
	return nil
}
