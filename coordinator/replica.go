package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/store"
)

// Replicas. Several coordinators may serve one store (PostgreSQL) behind
// a load balancer; any of them answers any request. The store decides
// every change (conditional writes); what each replica keeps beside it
// (queue, handed-out jobs, runners, project minimums, pipeline watchers)
// follows the others' changes through cluster events:
//
//	change here ──► store ──► publish ──► other replicas: applyEvent
//
// Jobs entering and leaving the queue are the store's to announce
// (cluster.JobQueued, JobTaken: PostgreSQL's trigger, at commit); the rest
// is published by the replica that made the change.
//
// Once-per-cluster work (the reaper with its expiry and auto-stop) runs on
// the leader; the engine's steps hold the cluster's engine lock, so
// pipelines move on as if one engine ran them. See docs/coordinator.md.

// eventLoop applies the other replicas' events until the server stops.
func (s *Server) eventLoop() {
	defer close(s.eventsDone)
	events := s.cluster.Events()
	if events == nil {
		return
	}
	var next *cluster.Event // an event read ahead, applied next
	for {
		var e cluster.Event
		if next != nil {
			e, next = *next, nil
		} else {
			select {
			case <-s.stop:
				return
			case e = <-events:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if e.Kind == cluster.JobQueued {
			// Jobs queued elsewhere come in runs (a pipeline's stage,
			// a burst of API calls): the run that has arrived is read
			// in one query, not one each, in order with what follows.
			ids := []int64{e.ID}
		run:
			for len(ids) < maxQueuedRead {
				select {
				case f := <-events:
					if f.Kind != cluster.JobQueued {
						next = &f
						break run
					}
					ids = append(ids, f.ID)
				default:
					break run
				}
			}
			if err := s.dispatch.Queued(ctx, ids...); err != nil {
				s.log.Error("queueing jobs another replica queued", "jobs", len(ids), "first", e.String(), "err", err)
			}
		} else if err := s.applyEvent(ctx, e); err != nil {
			s.log.Error("applying another replica's change", "event", e.String(), "err", err)
		}
		cancel()
	}
}

// maxQueuedRead bounds the jobs one read of the event loop asks for.
const maxQueuedRead = 256

// applyEvent brings this replica's copies up to date with one change
// another replica made.
func (s *Server) applyEvent(ctx context.Context, e cluster.Event) error {
	switch e.Kind {
	case cluster.JobQueued:
		return s.dispatch.Queued(ctx, e.ID)
	case cluster.JobTaken:
		s.dispatch.Taken(e.ID)
	case cluster.JobChanged:
		s.dispatch.Forget(e.ID)
	case cluster.PipelineChanged:
		s.pipelines.WakeWatchers(e.ID)
	case cluster.RunnerChanged:
		s.runners.Forget(e.ID)
	case cluster.ProjectChanged:
		if err := s.dispatch.ProjectChanged(ctx, e.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	case cluster.Resync:
		return s.resync(ctx)
	}
	return nil
}

// resync rebuilds every copy from the store after events may have been
// lost: the queue holds exactly the pending, unassigned jobs, and cached
// runners, handed-out jobs and project minimums are read again.
func (s *Server) resync(ctx context.Context) error {
	s.log.Warn("replica events may have been lost: reloading from the store")
	s.runners.ForgetAll()
	return s.dispatch.Resync(ctx)
}

// interruptedAfter is how old a pipeline without jobs must be before a
// new leader takes it for one whose creating replica died: creating a
// pipeline's jobs takes milliseconds.
const interruptedAfter = time.Minute

// leaderLoop runs the once-per-cluster work whenever this replica leads.
func (s *Server) leaderLoop() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.stop
		cancel()
	}()
	s.cluster.Lead(ctx, func(ctx context.Context) {
		// A single process did this in Start. A replica that comes to
		// lead resumes every unfinished pipeline (the engine's schedule
		// of delayed jobs lived in the memory of the leader that went)
		// and fails pipelines whose creation a dead replica left
		// without jobs (old enough that no live replica is still
		// creating them).
		if !s.single {
			if _, err := s.pipelines.FailInterrupted(ctx, s.clock.Now().Add(-interruptedAfter)); err != nil {
				s.log.Error("failing interrupted pipelines as the new leader", "err", err)
			}
			if err := s.pipelines.Resume(ctx); err != nil {
				s.log.Error("resuming pipelines as the new leader", "err", err)
			}
		}
		s.reaper.Run(ctx)
	})
}

// Reap runs one round of the leader's housekeeping now (reaper.Reaper.Reap;
// tests and tools call it, the leader runs it every ReapInterval).
func (s *Server) Reap(ctx context.Context) error { return s.reaper.Reap(ctx) }
