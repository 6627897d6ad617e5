package pipelines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
)

// engine is the engine goroutine's state (the package comment draws it):
// the pipelines marked for processing, when to look again at pipelines
// with delayed jobs, and the watchers of pipelines. The runner API's hot
// path only marks a pipeline (an in-memory set): the engine's store reads
// happen off the request path.
type engine struct {
	mu     sync.Mutex
	dirty  map[int64]bool
	wakeAt map[int64]time.Time // pipelines with scheduled jobs: when to look again
	// bridges are the trigger jobs whose downstream pipeline is being
	// prepared off the engine (downstream.go).
	bridges map[int64]bool
	kick    chan struct{} // capacity 1: "dirty is not empty"
	calls   chan *engineCall

	wmu      sync.Mutex
	watchers map[int64]chan struct{} // closed on the pipeline's next change
}

type engineCall struct {
	fn   func(ctx context.Context) error
	err  error
	done chan struct{}
}

func (e *engine) init() {
	e.dirty = map[int64]bool{}
	e.wakeAt = map[int64]time.Time{}
	e.bridges = map[int64]bool{}
	e.kick = make(chan struct{}, 1)
	e.calls = make(chan *engineCall)
	e.watchers = map[int64]chan struct{}{}
}

// mark asks the engine to process a pipeline. Cheap and non-blocking.
func (e *engine) mark(pipelineID int64) {
	if pipelineID == 0 {
		return
	}
	e.mu.Lock()
	e.dirty[pipelineID] = true
	e.mu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// notify wakes the watchers of a pipeline.
func (e *engine) notify(pipelineID int64) {
	e.wmu.Lock()
	if ch, ok := e.watchers[pipelineID]; ok {
		close(ch)
		delete(e.watchers, pipelineID)
	}
	e.wmu.Unlock()
}

// PipelineChanged returns a channel that is closed at the pipeline's next
// change: a job's status, a new job (retry), the pipeline's status, or a
// job's log growing.
// Take the channel, then read the state; when it is closed, read again.
func (s *Engine) PipelineChanged(pipelineID int64) <-chan struct{} {
	e := &s.engine
	e.wmu.Lock()
	defer e.wmu.Unlock()
	ch, ok := e.watchers[pipelineID]
	if !ok {
		ch = make(chan struct{})
		e.watchers[pipelineID] = ch
	}
	return ch
}

// PipelineState is a pipeline and all its jobs (retried ones included,
// marked Retried), ordered by id.
type PipelineState struct {
	Pipeline *store.Pipeline
	Jobs     []*store.Job
}

// Latest returns the latest (not retried) job of a name, or nil.
func (st PipelineState) Latest(name string) *store.Job { return latestByName(st.Jobs)[name] }

// WatchPipeline calls fn with the pipeline's state now and after every
// change, until fn returns false (WatchPipeline returns nil), ctx ends or
// the server closes. Changes in quick succession may be seen as one. This
// is how an in-process caller (berth run) follows a pipeline.
func (s *Engine) WatchPipeline(ctx context.Context, pipelineID int64, fn func(PipelineState) bool) error {
	for {
		changed := s.PipelineChanged(pipelineID)
		st, err := s.PipelineState(ctx, pipelineID)
		if err != nil {
			return err
		}
		if !fn(st) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errors.New("coordinator closed")
		}
	}
}

// PipelineState reads a pipeline and its jobs.
func (s *Engine) PipelineState(ctx context.Context, pipelineID int64) (PipelineState, error) {
	p, err := s.store.GetPipeline(ctx, pipelineID)
	if errors.Is(err, store.ErrNotFound) {
		return PipelineState{}, fmt.Errorf("pipeline %d: %w", pipelineID, ErrNotFound)
	}
	if err != nil {
		return PipelineState{}, err
	}
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: pipelineID})
	if err != nil {
		return PipelineState{}, err
	}
	return PipelineState{Pipeline: p, Jobs: jobs}, nil
}

// onEngine runs fn on the engine goroutine and returns its error.
func (s *Engine) onEngine(ctx context.Context, fn func(ctx context.Context) error) error {
	c := &engineCall{fn: fn, done: make(chan struct{})}
	select {
	case s.engine.calls <- c:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return errors.New("coordinator closed")
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Engine) engineLoop() {
	defer close(s.engineDone)
	e := &s.engine
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Wake for the earliest scheduled job (real time; with a fake
		// clock the reaper marks due pipelines instead).
		e.mu.Lock()
		next := time.Duration(0)
		now := s.clock.Now()
		for id, at := range e.wakeAt {
			d := at.Sub(now)
			if d <= 0 {
				e.dirty[id] = true
				delete(e.wakeAt, id)
				continue
			}
			if next == 0 || d < next {
				next = d
			}
		}
		pending := len(e.dirty) > 0
		e.mu.Unlock()
		if !pending {
			if next == 0 {
				next = time.Hour
			}
			timer.Reset(next)
			select {
			case <-s.stop:
				return
			case c := <-e.calls:
				c.err = s.engineStep(ctx, c.fn)
				close(c.done)
			case <-e.kick:
			case <-timer.C:
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		e.mu.Lock()
		ids := make([]int64, 0, len(e.dirty))
		for id := range e.dirty {
			ids = append(ids, id)
		}
		clear(e.dirty)
		e.mu.Unlock()
		slices.Sort(ids)
		if len(ids) == 0 {
			continue
		}
		err := s.engineStep(ctx, func(ctx context.Context) error {
			for _, id := range ids {
				select {
				case <-s.stop:
					return nil
				default:
				}
				if err := s.processPipeline(ctx, id); err != nil {
					s.log.Error("processing pipeline", "pipeline_id", id, "err", err)
				}
			}
			return nil
		})
		if err != nil {
			// The engine lock could not be had (the database is away):
			// the pipelines stay marked, for the next round.
			s.log.Error("pipeline engine", "err", err)
			for _, id := range ids {
				s.engine.mark(id)
			}
			select {
			case <-s.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// engineStep runs fn holding the cluster's engine lock, so that the
// engines of several replicas never move pipelines at the same time.
func (s *Engine) engineStep(ctx context.Context, fn func(ctx context.Context) error) error {
	unlock, err := s.cluster.EngineLock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return fn(ctx)
}

// Resume marks every unfinished pipeline for processing (after a
// restart, or a crash between two steps of the engine).
func (s *Engine) Resume(ctx context.Context) error {
	ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{Statuses: []store.Status{
		store.StatusCreated, store.StatusWaitingForResource, store.StatusPending, store.StatusRunning,
		store.StatusCanceling, store.StatusManual, store.StatusScheduled,
	}})
	if err != nil {
		return fmt.Errorf("loading unfinished pipelines: %w", err)
	}
	for _, p := range ps {
		s.engine.mark(p.ID)
	}
	return nil
}

// ProcessPipeline runs the engine on a pipeline now and waits for it
// (normally the engine is triggered by job changes; tests and tools may
// call this).
func (s *Engine) ProcessPipeline(ctx context.Context, pipelineID int64) error {
	return s.onEngine(ctx, func(ctx context.Context) error { return s.processPipeline(ctx, pipelineID) })
}

// processPipeline moves one pipeline on. Engine goroutine only.
func (s *Engine) processPipeline(ctx context.Context, id int64) error {
	defer s.Notify(id)
	p, err := s.store.GetPipeline(ctx, id)
	if err != nil {
		return err
	}
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: id})
	if err != nil {
		return err
	}
	now := s.clock.Now().UTC()

	// Automatic retries first: a retried job must not skip its dependents.
	retried := false
	counts := map[string]int{}
	for _, j := range jobs {
		if j.Retried {
			counts[j.Name]++
		}
	}
	for _, j := range jobs {
		if n := graph.NodeOf(j); graph.AutoRetry(n, counts[j.Name]) {
			if _, err := s.retryJob(ctx, j, true, jobs); err != nil && !errors.Is(err, store.ErrConflict) {
				return fmt.Errorf("retrying job %d: %w", j.ID, err)
			}
			s.log.Info("job retried automatically", "job_id", j.ID, "pipeline_id", id, "attempt", counts[j.Name]+2)
			retried = true
		}
	}
	// Bridges follow their downstream pipelines (and get one after a
	// crash left a running bridge without it).
	bridged, err := s.reconcileBridges(ctx, jobs)
	if err != nil {
		return fmt.Errorf("moving the bridges of pipeline %d on: %w", id, err)
	}
	if retried || bridged {
		if jobs, err = s.store.ListJobs(ctx, store.JobFilter{PipelineID: id}); err != nil {
			return err
		}
	}

	byID := map[int64]*store.Job{}
	nodes := make([]*graph.Node, 0, len(jobs))
	for _, j := range jobs {
		byID[j.ID] = j
		nodes = append(nodes, graph.NodeOf(j))
	}
	// Jobs waiting for a resource group take it when it is free.
	for _, n := range nodes {
		if n.Retried || n.Status != store.StatusWaitingForResource {
			continue
		}
		nj, err := s.enqueuePipelineJob(ctx, byID[n.ID], jobs, store.StatusWaitingForResource)
		if err != nil && !errors.Is(err, store.ErrConflict) {
			return err
		}
		if nj != nil {
			n.Status, byID[n.ID] = nj.Status, nj
		}
	}
	for _, a := range graph.Plan(nodes, now) {
		j := byID[a.ID]
		var (
			nj  *store.Job
			err error
		)
		switch a.Kind {
		case graph.ActEnqueue:
			nj, err = s.enqueuePipelineJob(ctx, j, jobs, j.Status)
		case graph.ActManual:
			nj, err = s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusManual, UpdatedAt: now})
		case graph.ActSchedule:
			nj, err = s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusScheduled, ScheduledAt: a.At, UpdatedAt: now})
		case graph.ActSkip:
			nj, err = s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusCreated}, store.JobUpdate{Status: store.StatusSkipped, UpdatedAt: now})
		}
		if errors.Is(err, store.ErrConflict) {
			// Changed meanwhile (canceled through the runner API): the
			// next pass sees it.
			s.engine.mark(id)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s job %d: %w", a.Kind, j.ID, err)
		}
		if nj == nil {
			continue
		}
		byID[j.ID] = nj
		for _, n := range nodes {
			if n.ID == nj.ID {
				n.Status, n.ScheduledAt = nj.Status, nj.ScheduledAt
			}
		}
	}

	// Scheduled jobs: look again when the first is due.
	var wake time.Time
	usesResources := false
	for _, n := range nodes {
		if n.Retried {
			continue
		}
		if n.Status == store.StatusScheduled && (wake.IsZero() || n.ScheduledAt.Before(wake)) {
			wake = n.ScheduledAt
		}
		if n.Graph.ResourceGroup != "" && n.Status.Finished() {
			usesResources = true
		}
	}
	if err := s.syncDeployments(ctx, p, nodes, byID); err != nil {
		return fmt.Errorf("deployments of pipeline %d: %w", id, err)
	}
	s.engine.mu.Lock()
	if wake.IsZero() {
		delete(s.engine.wakeAt, id)
	} else {
		s.engine.wakeAt[id] = wake
	}
	s.engine.mu.Unlock()
	if usesResources {
		if err := s.markResourceWaiters(ctx, p.ProjectID, id); err != nil {
			return err
		}
	}
	return s.updatePipelineStatus(ctx, p, nodes, now)
}

// updatePipelineStatus stores the pipeline's composite status (over its
// latest jobs) when it changed, with its start and finish times.
func (s *Engine) updatePipelineStatus(ctx context.Context, p *store.Pipeline, nodes []*graph.Node, now time.Time) error {
	var latest []*graph.Node
	for _, n := range nodes {
		if !n.Retried {
			latest = append(latest, n)
		}
	}
	st, _ := graph.CompositeStatus(latest)
	if st == "" {
		if p.Status != store.StatusCreated {
			return nil // a pipeline that failed at creation keeps its status
		}
		st = store.StatusFailed
	}
	if st == p.Status {
		return nil
	}
	u := store.PipelineUpdate{Status: st, UpdatedAt: now}
	if p.StartedAt.IsZero() && st != store.StatusCreated && st != store.StatusPending {
		u.StartedAt = now
	}
	if st.Finished() {
		u.FinishedAt = now
	}
	if !st.Finished() && !p.FinishedAt.IsZero() {
		u.ClearFinished = true
	}
	if _, err := s.store.UpdatePipeline(ctx, p.ID, u); err != nil {
		return err
	}
	s.log.Info("pipeline status", "pipeline_id", p.ID, "from", p.Status, "to", st)
	// The bridge that created a downstream pipeline follows it.
	s.engine.mark(p.UpstreamPipelineID)
	if st.Finished() {
		s.tracer.PipelineFinished(p.ID)
	}
	return nil
}

// latestByName maps names to the latest (not retried) job of that name.
func latestByName(jobs []*store.Job) map[string]*store.Job {
	m := map[string]*store.Job{}
	for _, j := range jobs {
		if !j.Retried {
			m[j.Name] = j
		}
	}
	return m
}

// enqueuePipelineJob moves a job from one of its waiting statuses to
// pending and into the queue, with its dependencies resolved to the
// latest jobs of their names; a job of a busy resource group goes to
// waiting_for_resource instead. It returns the job as stored (nil, nil
// when it stays waiting for its resource).
func (s *Engine) enqueuePipelineJob(ctx context.Context, j *store.Job, jobs []*store.Job, from store.Status) (*store.Job, error) {
	g := graph.Decode(j.Graph)
	now := s.clock.Now().UTC()
	if g.ResourceGroup != "" {
		busy, err := s.resourceBusy(ctx, j.ProjectID, g.ResourceGroup, j.ID)
		if err != nil {
			return nil, err
		}
		if busy {
			if from == store.StatusWaitingForResource {
				return nil, nil
			}
			return s.store.TransitionJob(ctx, j.ID, []store.Status{from}, store.JobUpdate{Status: store.StatusWaitingForResource, UpdatedAt: now})
		}
	}
	byName := latestByName(jobs)
	deps := []int64{}
	for _, name := range g.Dependencies {
		if d := byName[name]; d != nil && d.ID != j.ID {
			deps = append(deps, d.ID)
		}
	}
	if g.Bridge != nil {
		return s.startBridge(ctx, j, from, deps)
	}
	if len(g.CrossNeeds) > 0 {
		cross, err := s.resolveCrossNeeds(ctx, j, g.CrossNeeds)
		if errors.Is(err, errMissingDependency) {
			return s.failUnqueued(ctx, j, from, "missing_dependency_failure", err.Error())
		}
		if err != nil {
			return nil, err
		}
		deps = append(deps, cross...)
	}
	// As it will be stored, for Place to match it with a waiting runner.
	pj := *j
	pj.Status, pj.Dependencies, pj.QueuedAt, pj.UpdatedAt = store.StatusPending, deps, now, now
	return s.dispatch.Place(&pj, func(a *store.Assignment) (*store.Job, error) {
		return s.store.TransitionJob(ctx, j.ID, []store.Status{from},
			store.JobUpdate{Status: store.StatusPending, Dependencies: deps, QueuedAt: now, UpdatedAt: now, Assign: a})
	})
}

// resourceBusy reports whether a job of the project's resource group other
// than except holds it (pending, running or canceling).
func (s *Engine) resourceBusy(ctx context.Context, projectID int64, group string, except int64) (bool, error) {
	active, err := s.store.ListJobs(ctx, store.JobFilter{ProjectID: projectID,
		Statuses: []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}})
	if err != nil {
		return false, err
	}
	for _, a := range active {
		if a.ID != except && a.PipelineID != 0 && graph.Decode(a.Graph).ResourceGroup == group {
			return true, nil
		}
	}
	return false, nil
}

// markResourceWaiters marks the other pipelines of a project that have
// jobs waiting for a resource group.
func (s *Engine) markResourceWaiters(ctx context.Context, projectID, except int64) error {
	waiting, err := s.store.ListJobs(ctx, store.JobFilter{ProjectID: projectID, Statuses: []store.Status{store.StatusWaitingForResource}})
	if err != nil {
		return err
	}
	for _, w := range waiting {
		if w.PipelineID != except {
			s.engine.mark(w.PipelineID)
		}
	}
	return nil
}

// retryJob replaces a finished job with a new one (GitLab's retry): the
// old job is marked retried, the new one starts as created (pending at
// once outside pipelines), and skipped jobs downstream of it are created
// again. immediate makes a manual or delayed job run when its turn comes
// instead of waiting again. Engine goroutine only.
func (s *Engine) retryJob(ctx context.Context, j *store.Job, immediate bool, jobs []*store.Job) (*store.Job, error) {
	now := s.clock.Now().UTC()
	nj := &store.Job{
		Status: store.StatusCreated, ProjectID: j.ProjectID, NamespaceID: j.NamespaceID, NamespaceIDs: j.NamespaceIDs,
		PipelineID: j.PipelineID, Name: j.Name, Stage: j.Stage, Ref: j.Ref, Protected: j.Protected, Tags: j.Tags,
		Priority: j.Priority, Timeout: j.Timeout, Isolation: j.Isolation, Spec: j.Spec, Graph: j.Graph,
		CreatedAt: now, UpdatedAt: now,
	}
	if j.PipelineID == 0 {
		nj.Status, nj.Dependencies = store.StatusPending, j.Dependencies
	} else {
		g := graph.Decode(j.Graph)
		g.Immediate = immediate
		b, err := json.Marshal(g)
		if err != nil {
			return nil, err
		}
		nj.Graph = b
	}
	if err := s.store.RetryJob(ctx, j.ID, nj); err != nil {
		return nil, err
	}
	if j.PipelineID == 0 {
		s.dispatch.Push(nj)
		return nj, nil
	}
	var nodes []*graph.Node
	for _, o := range jobs {
		nodes = append(nodes, graph.NodeOf(o))
	}
	for _, d := range graph.Downstream(nodes, graph.NodeOf(j)) {
		if d.Status != store.StatusSkipped {
			continue
		}
		if _, err := s.store.TransitionJob(ctx, d.ID, []store.Status{store.StatusSkipped},
			store.JobUpdate{Status: store.StatusCreated, UpdatedAt: now}); err != nil && !errors.Is(err, store.ErrConflict) {
			return nil, err
		}
	}
	return nj, nil
}

// JobChanged tells the engine that a job's status changed outside
// it (runner API, reaper, cancel). Cheap: the hot path calls it.
func (s *Engine) JobChanged(j *store.Job) {
	if j.PipelineID != 0 {
		s.engine.mark(j.PipelineID)
	}
}

// CancelJob cancels a job: a job not handed out (queued, or waiting in
// created, scheduled or waiting_for_resource) becomes canceled at once; a
// job a runner holds becomes canceling, and the runner, told by
// Job-Status on its next update, stops the script, runs after_script and
// reports back. Finished and manual jobs are left as they are (GitLab does
// not cancel manual jobs). It returns the job afterwards.
func (s *Engine) CancelJob(ctx context.Context, j *store.Job) (*store.Job, error) {
	if graph.IsBridge(j) {
		return s.cancelBridge(ctx, j)
	}
	return s.dispatch.Cancel(ctx, j)
}

// Notify wakes the watchers of a pipeline, here and on the other
// replicas.
func (s *Engine) Notify(id int64) {
	s.engine.notify(id)
	s.cluster.Publish(cluster.Event{Kind: cluster.PipelineChanged, ID: id})
}

// WakeScheduled marks the pipelines whose delayed jobs are due at now.
func (s *Engine) WakeScheduled(ctx context.Context, now time.Time) error {
	scheduled, err := s.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusScheduled}})
	if err != nil {
		return err
	}
	for _, j := range scheduled {
		if !now.Before(j.ScheduledAt) {
			s.engine.mark(j.PipelineID)
		}
	}
	return nil
}
