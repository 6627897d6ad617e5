package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
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
	var errs []error
	if err := s.dispatch.ReapJobs(ctx, now); err != nil {
		errs = append(errs, err)
	}
	// Delayed jobs whose time has come (the engine also wakes itself for
	// them; this catches up after a restart or with an injected clock).
	scheduled, err := s.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusScheduled}})
	if err != nil {
		errs = append(errs, err)
	}
	for _, j := range scheduled {
		if !now.Before(j.ScheduledAt) {
			s.pipelines.Mark(j.PipelineID)
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
	if err := s.pipelines.AutoStopEnvironments(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := s.pages.Expire(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := s.logs.Archive(ctx, now); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
