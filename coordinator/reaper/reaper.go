// Package reaper is the coordinator's once-per-cluster housekeeping: the
// server-side job lifecycle (timeouts, stuck and unacknowledged jobs),
// delayed jobs and pipeline schedules that are due, the expiry of
// artifacts, environments and Pages deployments, and the archiving of
// finished jobs' logs. The
// replica that leads the cluster runs it (coordinator/cluster's Lead); a
// single coordinator always leads.
package reaper

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/store"
)

// expiryBatch bounds the artifacts deleted in one round.
const expiryBatch = 1000

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Options are what the reaper works on.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	Dispatch  *dispatch.Dispatcher
	Pipelines *pipelines.Engine
	Pages     *pages.Sites
	Logs      *joblog.Logs
	Clock     Clock
	Logger    *slog.Logger // nil: discard
	// Interval is how often Run reaps (and how long one round may take).
	Interval time.Duration
}

// Reaper runs the housekeeping rounds.
type Reaper struct{ o Options }

// New returns a reaper over opts.
func New(opts Options) *Reaper {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{o: opts}
}

// Run reaps every Interval until ctx ends (the server stops, or this
// replica no longer leads).
func (r *Reaper) Run(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, r.o.Interval)
			if err := r.Reap(rctx); err != nil {
				r.o.Logger.Error("reaping jobs", "err", err)
			}
			cancel()
		}
	}
}

// Reap runs one round at the clock's now:
//   - the job lifecycle's timeouts (dispatch.Dispatcher.ReapJobs);
//   - scheduled (delayed) jobs that are due → pending, through the engine
//     (which also wakes itself for them; this catches up after a restart
//     or with an injected clock);
//   - pipeline schedules that are due → their pipelines;
//   - artifacts past their expiry → deleted;
//   - environments past auto_stop_in → stopped;
//   - Pages deployments past their expire_in → removed;
//   - logs of jobs finished long enough ago → archived.
//
// A failing part does not stop the others; their errors are joined.
func (r *Reaper) Reap(ctx context.Context) error {
	o := r.o
	now := o.Clock.Now().UTC()
	var errs []error
	if err := o.Dispatch.ReapJobs(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := o.Pipelines.WakeScheduled(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := o.Pipelines.RunDueSchedules(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := r.expireArtifacts(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := o.Pipelines.AutoStopEnvironments(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := o.Pages.Expire(ctx, now); err != nil {
		errs = append(errs, err)
	}
	if err := o.Logs.Archive(ctx, now); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// expireArtifacts deletes artifacts past their expiry, object and record
// (artifacts.DeleteRecorded).
func (r *Reaper) expireArtifacts(ctx context.Context, now time.Time) error {
	expired, err := r.o.Store.ExpiredArtifacts(ctx, now, expiryBatch)
	if err != nil {
		return err
	}
	return artifacts.DeleteRecorded(ctx, r.o.Store, r.o.Artifacts, expired)
}
