// Package dispatch is the job lifecycle every part of the coordinator
// changes jobs through: the queue of pending jobs and the store's
// conditional writes behind it, the hand-out of a job to a runner, the
// jobs handed out and not finished, cancellation, the server-side
// timeouts, and the isolation level each queued job needs.
//
//	Enqueue / Push ──► queue ──► HandOut ──► (runner) ──► Transition ──► final
//	                     ▲          │ lost a race: next job                │
//	                     └─ Release ┘ (payload failed), ReapJobs (no ack)  ▼
//	                                                         JobChanged hook
//
// The store is the arbiter: every transition is a compare-and-set on the
// job's status, so the runner API, the pipeline engine, the reaper and
// other replicas may race and each change happens once. What a Dispatcher
// keeps beside the store — the queue, the jobs it handed out, the
// projects' isolation minimums — follows the other replicas through
// cluster events (Queued, Taken, Forget, ProjectChanged, Resync).
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
)

// ErrLostRaces: a hand-out lost the job it picked to other replicas (or
// cancels) too many times in a row; the runner asks again (GitLab's 409).
var ErrLostRaces = errors.New("job was already taken")

// maxLostRaces bounds how many jobs one hand-out tries after another
// replica (or a cancel) took the one it picked.
const maxLostRaces = 8

// busyRecheck is how soon a job another transaction held when a hand-out
// tried it (store.ErrBusy) is looked at again. Such a holder commits or
// rolls back within milliseconds; if it dies, PostgreSQL rolls it back as
// its connection closes.
const busyRecheck = 100 * time.Millisecond

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

// Timeouts are the server-side job lifecycle's bounds (ReapJobs).
type Timeouts struct {
	// Ack: a job handed out but not acknowledged within it goes back to
	// the queue.
	Ack time.Duration
	// Pending: a job nobody picked up for this long fails with
	// stuck_or_timeout_failure.
	Pending time.Duration
	// Stuck: a running job without any update for this long fails with
	// no_updates_running.
	Stuck time.Duration
	// Canceling: a canceling job without any update for this long
	// becomes canceled (no_updates_canceling).
	Canceling time.Duration
	// Grace is added to a job's timeout before a running job fails with
	// job_execution_timeout.
	Grace time.Duration
}

// Options are what a Dispatcher works with.
type Options struct {
	Store   store.Store
	Queue   *queue.Queue
	Runners *runners.Registry
	// Cluster carries changes to the other replicas (cluster.Local when
	// alone).
	Cluster cluster.Cluster
	Clock   Clock
	Logger  *slog.Logger // nil: discard
	// Registerer receives the dispatch metrics (nil: none).
	Registerer prometheus.Registerer
	// DefaultJobTimeout applies to specs without one, in seconds.
	DefaultJobTimeout int
	Timeouts          Timeouts
	// JobTokens mint and verify the jobs' tokens.
	JobTokens *jobtoken.Keys
	// JobChanged is called after the Dispatcher changed a job's status
	// (not for Enqueue and Push): the pipeline engine follows it. It must
	// not block.
	JobChanged func(*store.Job)
}

// Dispatcher is the job lifecycle of one replica. It is safe for
// concurrent use. Build it with New, call Load before the first
// hand-out.
type Dispatcher struct {
	store      store.Store
	queue      *queue.Queue
	runners    *runners.Registry
	cluster    cluster.Cluster
	clock      Clock
	log        *slog.Logger
	defTimeout int
	timeouts   Timeouts
	changed    func(*store.Job)
	tokens     *jobtoken.Keys
	metrics    metrics

	mu sync.Mutex
	// active: jobs handed out and not finished, as last written by this
	// process (without their spec), so that authenticating the many
	// updates of a running job does not read the store. The store stays
	// the source of truth: every transition is a conditional write.
	active map[int64]*store.Job
	// minimums are the projects' minimum isolation levels (absent: none).
	minimums map[int64]executor.Isolation
}

type metrics struct {
	enqueued  prometheus.Counter
	assigned  prometheus.Counter
	conflicts prometheus.Counter
	finished  *prometheus.CounterVec
	pickup    prometheus.Histogram
}

// New returns a Dispatcher with an empty queue view of the store.
func New(opts Options) *Dispatcher {
	d := &Dispatcher{store: opts.Store, queue: opts.Queue, runners: opts.Runners, cluster: opts.Cluster,
		clock: opts.Clock, log: opts.Logger, defTimeout: opts.DefaultJobTimeout, timeouts: opts.Timeouts,
		changed: opts.JobChanged, tokens: opts.JobTokens, active: map[int64]*store.Job{}, minimums: map[int64]executor.Isolation{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.changed == nil {
		d.changed = func(*store.Job) {}
	}
	if d.cluster == nil {
		d.cluster = cluster.Local{}
	}
	d.metrics = metrics{
		enqueued: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_jobs_enqueued_total",
			Help: "Jobs that entered the queue (pending)."}),
		assigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_jobs_assigned_total",
			Help: "Jobs handed to a runner (jobs/request answered 201)."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_assignment_conflicts_total",
			Help: "Hand-outs lost to another process (jobs/request answered 409)."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_coordinator_jobs_finished_total",
			Help: "Jobs that reached a final status, by status and failure reason."}, []string{"status", "failure_reason"}),
		pickup: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_coordinator_job_queue_seconds",
			Help:    "Time from a job becoming pending to its hand-out.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 15, 60, 300, 1800, 3600}}),
	}
	if reg := opts.Registerer; reg != nil {
		queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_queue_jobs",
			Help: "Jobs waiting in the queue."}, func() float64 { return float64(d.queue.Len()) })
		waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_long_polls_waiting",
			Help: "jobs/request long polls held waiting for a job."}, func() float64 { return float64(d.queue.Waiting()) })
		active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_jobs_handed_out",
			Help: "Jobs handed to runners and not finished."}, func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			return float64(len(d.active))
		})
		m := d.metrics
		for _, c := range []prometheus.Collector{m.enqueued, m.assigned, m.conflicts, m.finished, m.pickup, queued, waiting, active} {
			// A second coordinator on the same registry (tests, restarts
			// in process) keeps the first one's collectors.
			_ = reg.Register(c)
		}
	}
	return d
}

// Queue is the queue of pending jobs.
func (d *Dispatcher) Queue() *queue.Queue { return d.queue }

// Load reads the projects' isolation minimums and the runner managers'
// offers, then rebuilds the queue from the store: pending jobs not handed
// out are queued, handed-out ones counted in flight per manager. Bridges
// (which no runner runs) are left to the pipeline engine.
func (d *Dispatcher) Load(ctx context.Context) error {
	// Project minimums first: queued jobs need them.
	if err := d.loadMinimums(ctx); err != nil {
		return err
	}
	if err := d.runners.LoadOffers(ctx); err != nil {
		return err
	}
	jobs, err := d.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}})
	if err != nil {
		return fmt.Errorf("loading queue: %w", err)
	}
	queued := 0
	for _, j := range jobs {
		if j.RunnerManagerID == 0 && graph.IsBridge(j) { // (only a bridge runs without a runner)
			continue // never queued; the engine resumes it
		}
		if j.Status == store.StatusPending && j.RunnerManagerID == 0 {
			d.queue.Push(d.queueJob(j))
			queued++
			continue
		}
		d.queue.MarkInFlight(managerKey(j.RunnerManagerID))
		d.cacheActive(j)
	}
	d.log.Info("queue loaded", "queued", queued, "in_flight", len(jobs)-queued)
	return nil
}

// Enqueue validates a job spec, stores the job as pending and queues it.
// A runner waiting for such a job receives it at once.
func (d *Dispatcher) Enqueue(ctx context.Context, spec JobSpec) (*store.Job, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Stage == "" {
		spec.Stage = "test"
	}
	if spec.Timeout == 0 {
		spec.Timeout = d.defTimeout
	}
	nsIDs := spec.NamespaceIDs
	if len(nsIDs) == 0 {
		for _, id := range []int64{spec.NamespaceID, spec.RootNamespaceID} {
			if id > 0 {
				nsIDs = append(nsIDs, id)
			}
		}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encoding job spec: %w", err)
	}
	now := d.clock.Now().UTC()
	j := &store.Job{
		Status:       store.StatusPending,
		ProjectID:    spec.ProjectID,
		NamespaceID:  spec.NamespaceID,
		NamespaceIDs: nsIDs,
		PipelineID:   spec.PipelineID,
		Name:         spec.Name,
		Stage:        spec.Stage,
		Ref:          spec.Ref,
		Protected:    spec.Protected,
		Tags:         queue.NormalizeTags(spec.Tags),
		Priority:     spec.Priority,
		Timeout:      spec.Timeout,
		Isolation:    string(spec.RequestedIsolation()),
		Spec:         raw,
		Dependencies: spec.Dependencies,
		CreatedAt:    now,
		UpdatedAt:    now,
	}
	return d.Place(j, func(a *store.Assignment) (*store.Job, error) {
		if a != nil {
			j.RunnerID, j.RunnerManagerID, j.TokenDigest, j.AssignedAt = a.RunnerID, a.ManagerID, a.TokenDigest, a.At
		}
		if err := d.store.CreateJob(ctx, j); err != nil {
			return nil, fmt.Errorf("storing job: %w", err)
		}
		return j, nil
	})
}

// Push queues a job that just became pending in the store.
func (d *Dispatcher) Push(j *store.Job) {
	d.metrics.enqueued.Inc()
	d.queue.Push(d.queueJob(j))
}

// Place brings a job into the queue: write stores it as pending and
// returns it as stored. When a held request (a long poll, a push stream
// with room) may run the job, write is given an assignment to that
// request's runner manager and stores the job already handed out: one
// write where an insert and then an assignment took two, and no other
// replica ever sees the job queued, so none races for it. The job then
// goes straight to that request. Otherwise write gets nil and the job is
// queued (Push). j is the job as it will be stored, for matching.
func (d *Dispatcher) Place(j *store.Job, write func(a *store.Assignment) (*store.Job, error)) (*store.Job, error) {
	qj := d.queueJob(j)
	var claim *queue.Claim
	if !graph.IsBridge(j) {
		claim = d.queue.Claim(qj)
	}
	// The job as stored is the one the queue hands back.
	stored := func(nj *store.Job) *queue.Job {
		qj.ID, qj.EnqueuedAt, qj.Data = nj.ID, nj.QueuedSince(), nj
		d.metrics.enqueued.Inc()
		return qj
	}
	if claim == nil {
		nj, err := write(nil)
		if err != nil {
			return nil, err
		}
		d.queue.Push(stored(nj))
		return nj, nil
	}
	managerID, err := strconv.ParseInt(claim.Request.Manager, 10, 64)
	if err != nil { // (HandOut's managerKey made it)
		claim.Cancel()
		return nil, fmt.Errorf("placing a job: runner manager %q: %w", claim.Request.Manager, err)
	}
	handOut := jobtoken.NewHandOut()
	nj, err := write(&store.Assignment{RunnerID: claim.Request.Runner.ID, ManagerID: managerID,
		TokenDigest: jobtoken.HandOutDigest(handOut), At: d.clock.Now().UTC()})
	if err != nil {
		claim.Cancel()
		return nil, err
	}
	qj = stored(nj)
	qj.Assigned = handOut
	claim.Deliver(qj)
	return nj, nil
}

// HandOut is a job just handed to a runner.
type HandOut struct {
	// Job is the job as the store now holds it (without a read back).
	Job *store.Job
	// Token is the runner's job token (every scope), ScriptToken the job
	// script's (CI_JOB_TOKEN: fetch the repository, download artifacts);
	// known only to this hand-out (coordinator/jobtoken).
	Token, ScriptToken string
	// Isolation is the level the job was matched at.
	Isolation executor.Isolation
	// Manager is the runner manager's id.
	Manager int64

	qj *queue.Job
}

// HandOut takes the next job runner rn may run, as seen by view (the
// runner at the isolation level its manager offers), waiting up to hold
// for one, and assigns it to the manager in the store with a new job
// token. It returns nil when no job came within hold (or ctx ended), and
// ErrLostRaces when other replicas took the jobs it picked several times
// in a row.
func (d *Dispatcher) HandOut(ctx context.Context, rn *store.Runner, view *queue.Runner, managerID int64, hold time.Duration) (*HandOut, error) {
	mkey := managerKey(managerID)
	deadline := time.Now().Add(hold)
	for lost := 0; ; lost++ {
		qj := d.queue.Take(ctx, queue.Request{Runner: view, Manager: mkey}, max(time.Until(deadline), 0))
		if qj == nil {
			return nil, nil
		}
		// Taken from the queue, the job is assigned whether or not ctx
		// ends meanwhile: a write cancelled halfway would leave it unknown
		// whether the store holds the assignment. A caller whose ctx ended
		// releases what it gets.
		ctx := context.WithoutCancel(ctx)
		if handOut, ok := qj.Assigned.(string); ok {
			// Stored already assigned to this request (Place).
			j := *qj.Data.(*store.Job)
			return d.handedOut(ctx, &j, qj, handOut)
		}
		handOut := jobtoken.NewHandOut()
		now := d.clock.Now().UTC()
		err := d.store.AssignJob(ctx, store.Assignment{JobID: qj.ID, RunnerID: rn.ID, ManagerID: managerID, TokenDigest: jobtoken.HandOutDigest(handOut), At: now})
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			// Another replica handed it out first, or it was canceled:
			// try the next job, within the same poll. Past a few lost
			// races in a row, answer as GitLab does and let the runner
			// ask again.
			d.queue.Done(mkey)
			d.metrics.conflicts.Inc()
			if lost >= maxLostRaces {
				return nil, ErrLostRaces
			}
			continue
		}
		if errors.Is(err, store.ErrBusy) {
			// Another transaction holds it: most likely another
			// replica's assignment about to commit (the store then
			// announces the job taken), but it may roll back, or its
			// replica die with it, and then no replica would try the job
			// again: every one that met it here dropped it. Look again
			// once the holder is done; still queued, it goes back.
			d.queue.Done(mkey)
			d.metrics.conflicts.Inc()
			d.recheck(qj.ID, busyRecheck)
			if lost >= maxLostRaces {
				return nil, ErrLostRaces
			}
			continue
		}
		if err != nil {
			d.queue.Requeue(qj, mkey)
			return nil, fmt.Errorf("assigning job %d: %w", qj.ID, err)
		}
		// The queue hands back the job as it was enqueued; apply the
		// assignment the store just recorded instead of reading it back.
		j := *qj.Data.(*store.Job)
		j.RunnerID, j.RunnerManagerID, j.TokenDigest, j.AssignedAt = rn.ID, managerID, jobtoken.HandOutDigest(handOut), now
		return d.handedOut(ctx, &j, qj, handOut)
	}
}

// handedOut completes the hand-out of j, stored assigned: its tokens are
// minted and it becomes this replica's active job.
func (d *Dispatcher) handedOut(ctx context.Context, j *store.Job, qj *queue.Job, handOut string) (*HandOut, error) {
	d.metrics.assigned.Inc()
	d.metrics.pickup.Observe(j.AssignedAt.Sub(qj.EnqueuedAt).Seconds())
	h := &HandOut{Job: j, Isolation: executor.IsolationAt(qj.Isolation), Manager: j.RunnerManagerID, qj: qj}
	var err error
	if h.Token, h.ScriptToken, err = d.mintTokens(ctx, j, handOut, j.AssignedAt); err != nil {
		_ = d.Release(ctx, h)
		return nil, fmt.Errorf("minting the tokens of job %d: %w", j.ID, err)
	}
	d.setActive(j)
	return h, nil
}

// mintTokens mints a hand-out's two job tokens. They expire when the job
// can no longer run: the ack timeout, the job's timeout and the grace the
// reaper gives it past that.
func (d *Dispatcher) mintTokens(ctx context.Context, j *store.Job, handOut string, now time.Time) (runner, script string, err error) {
	c := jobtoken.Claims{JobID: j.ID, ProjectID: j.ProjectID, Organization: 1, HandOut: handOut, IssuedAt: now,
		Expires: now.Add(d.timeouts.Ack + time.Duration(j.Timeout)*time.Second + d.timeouts.Grace + time.Minute)}
	c.Scopes, c.Dependencies = jobtoken.RunnerScopes, j.Dependencies
	if runner, err = d.tokens.Mint(ctx, c); err != nil {
		return "", "", err
	}
	c.Scopes = jobtoken.ScriptScopes
	script, err = d.tokens.Mint(ctx, c)
	return runner, script, err
}

// Release undoes a hand-out whose payload could not be built or sent:
// the job goes back to the queue instead of waiting for the ack timeout.
func (d *Dispatcher) Release(ctx context.Context, h *HandOut) error {
	d.forgetActive(h.Job.ID)
	if err := d.store.UnassignJob(context.WithoutCancel(ctx), h.Job.ID, h.Manager); err != nil {
		return err
	}
	h.qj.Assigned = nil // (queued now, as any)
	d.queue.Requeue(h.qj, managerKey(h.Manager))
	return nil
}

// Job returns a job for authenticating a request about it: this replica's
// copy when it handed the job out, else the store's.
func (d *Dispatcher) Job(ctx context.Context, id int64) (*store.Job, error) {
	if j := d.activeJob(id); j != nil {
		return j, nil
	}
	return d.store.GetJob(ctx, id)
}

// Reload reads a job from the store and makes it this replica's copy
// (dropping the copy of a job no longer handed out): for a caller whose
// copy lost a compare-and-set, perhaps to a replica that died before it
// could tell the others.
func (d *Dispatcher) Reload(ctx context.Context, id int64) (*store.Job, error) {
	j, err := d.store.GetJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if TokenActive(j) {
		d.cacheActive(j)
	} else {
		d.Forget(id)
	}
	return j, nil
}

// TokenActive reports whether a job's token is valid: from hand-out until
// the job finishes.
func TokenActive(j *store.Job) bool {
	switch j.Status {
	case store.StatusRunning, store.StatusCanceling:
		return true
	case store.StatusPending:
		return j.RunnerManagerID != 0
	}
	return false
}

// Transition changes a job's status in the store from one of from
// (store.TransitionJob's compare-and-set) and applies the change here: a
// final status ends the job's hand-out, a handed-out job's copy is
// updated; JobChanged is told either way.
func (d *Dispatcher) Transition(ctx context.Context, id int64, from []store.Status, u store.JobUpdate) (*store.Job, error) {
	nj, err := d.store.TransitionJob(ctx, id, from, u)
	if err != nil {
		return nil, err
	}
	d.applied(nj)
	return nj, nil
}

// applied brings this replica up to date with a transition it made.
func (d *Dispatcher) applied(j *store.Job) {
	switch {
	case j.Status.Finished():
		d.finished(j)
	case j.RunnerManagerID != 0:
		d.setActive(j)
	}
	d.changed(j)
}

// finished forgets a job that reached a final status and ends its
// in-flight count.
func (d *Dispatcher) finished(j *store.Job) {
	if j.RunnerManagerID != 0 {
		d.forgetActive(j.ID)
		d.queue.Done(managerKey(j.RunnerManagerID))
	}
	d.metrics.finished.WithLabelValues(string(j.Status), j.FailureReason).Inc()
}

// Cancel cancels a job that runs on a runner (bridges are the pipeline
// engine's): a job not handed out (queued, or waiting in created,
// scheduled or waiting_for_resource) becomes canceled at once; a job a
// runner holds becomes canceling, and the runner, told by Job-Status on
// its next update, stops the script, runs after_script and reports back.
// Finished and manual jobs are left as they are (GitLab does not cancel
// manual jobs). It returns the job afterwards.
func (d *Dispatcher) Cancel(ctx context.Context, j *store.Job) (*store.Job, error) {
	now := d.clock.Now().UTC()
	for {
		var (
			nj  *store.Job
			err error
		)
		switch {
		case j.Status == store.StatusCreated || j.Status == store.StatusScheduled || j.Status == store.StatusWaitingForResource:
			nj, err = d.Transition(ctx, j.ID, []store.Status{j.Status},
				store.JobUpdate{Status: store.StatusCanceled, FinishedAt: now, UpdatedAt: now})
		case j.Status == store.StatusPending && j.RunnerManagerID == 0:
			// Queued: out of the queue first, so no runner takes it
			// while it is canceled (a runner that took it between our
			// read and the transition learns at its ack: 403).
			d.queue.Remove(j.ID)
			nj, err = d.Transition(ctx, j.ID, []store.Status{store.StatusPending},
				store.JobUpdate{Status: store.StatusCanceled, FinishedAt: now, UpdatedAt: now})
		case j.Status == store.StatusPending:
			// Handed out, not yet acknowledged: the runner's ack gets 403
			// and it drops the job.
			nj, err = d.Transition(ctx, j.ID, []store.Status{store.StatusPending},
				store.JobUpdate{Status: store.StatusCanceled, FinishedAt: now, UpdatedAt: now})
		case j.Status == store.StatusRunning:
			nj, err = d.Transition(ctx, j.ID, []store.Status{store.StatusRunning},
				store.JobUpdate{Status: store.StatusCanceling, UpdatedAt: now})
		default:
			return j, nil
		}
		if errors.Is(err, store.ErrConflict) {
			// It moved on meanwhile: look again.
			if j, err = d.store.GetJob(ctx, j.ID); err != nil {
				return nil, err
			}
			continue
		}
		return nj, err
	}
}

// setActive records the state this replica just wrote for a handed-out
// job, and tells the other replicas to forget their copies.
func (d *Dispatcher) setActive(j *store.Job) {
	d.cacheActive(j)
	d.publish(cluster.JobChanged, j.ID)
}

// cacheActive records a handed-out job's state as read from the store.
func (d *Dispatcher) cacheActive(j *store.Job) {
	c := *j
	c.Spec = nil
	d.mu.Lock()
	d.active[j.ID] = &c
	d.mu.Unlock()
}

// forgetActive drops a job this replica changed so that it is no longer
// handed out, here and on the other replicas.
func (d *Dispatcher) forgetActive(id int64) {
	d.Forget(id)
	d.publish(cluster.JobChanged, id)
}

// Forget drops this replica's copy of a handed-out job (another replica
// changed it).
func (d *Dispatcher) Forget(id int64) {
	d.mu.Lock()
	delete(d.active, id)
	d.mu.Unlock()
}

// activeJob returns a copy of a handed-out job's state, or nil.
func (d *Dispatcher) activeJob(id int64) *store.Job {
	d.mu.Lock()
	defer d.mu.Unlock()
	if j, ok := d.active[id]; ok {
		c := *j
		return &c
	}
	return nil
}

// publish tells the other replicas of a change to a record.
func (d *Dispatcher) publish(k cluster.Kind, id int64) {
	if id > 0 {
		d.cluster.Publish(cluster.Event{Kind: k, ID: id})
	}
}

// Queued queues jobs another replica made pending, unless they are queued
// already or no longer pending. Several are read in one query.
func (d *Dispatcher) Queued(ctx context.Context, ids ...int64) error {
	var missing []int64
	for _, id := range ids {
		if !d.queue.Has(id) { // (else this replica's own job, or told twice)
			missing = append(missing, id)
		}
	}
	var jobs []*store.Job
	switch len(missing) {
	case 0:
		return nil
	case 1:
		j, err := d.store.GetJob(ctx, missing[0])
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		jobs = []*store.Job{j}
	default:
		var err error
		if jobs, err = d.store.ListJobs(ctx, store.JobFilter{IDs: missing, Statuses: []store.Status{store.StatusPending}}); err != nil {
			return err
		}
	}
	for _, j := range jobs {
		if j.Status == store.StatusPending && j.RunnerManagerID == 0 && !graph.IsBridge(j) && !d.queue.Has(j.ID) {
			d.queue.Push(d.queueJob(j))
		}
	}
	return nil
}

// recheck queues job id again after delay if the store still has it
// queued (Queued), retrying with a longer delay while the store cannot be
// read, until the queue closes.
func (d *Dispatcher) recheck(id int64, delay time.Duration) {
	time.AfterFunc(delay, func() {
		if d.queue.Closed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Queued(ctx, id); err != nil {
			next := min(2*delay, time.Minute)
			d.log.Warn("looking again at a job another transaction held", "job_id", id, "retry_in", next, "err", err)
			d.recheck(id, next)
		}
	})
}

// Taken drops a job another replica handed out (or canceled) from the
// queue.
func (d *Dispatcher) Taken(id int64) { d.queue.Remove(id) }

// Resync rebuilds this replica's copies from the store after cluster
// events may have been lost: the queue holds exactly the pending,
// unassigned jobs, and handed-out jobs and project minimums are read
// again.
func (d *Dispatcher) Resync(ctx context.Context) error {
	d.mu.Lock()
	clear(d.active)
	d.mu.Unlock()
	if err := d.loadMinimums(ctx); err != nil {
		return err
	}
	if err := d.runners.LoadOffers(ctx); err != nil {
		return err
	}
	d.requeueIsolation(0)
	// Only jobs queued before the store is read can be known stale: a job
	// this replica queues meanwhile (an enqueue here, which the others
	// hear of but this replica does not) may be missing from the listing.
	before := d.queue.IDs()
	jobs, err := d.store.ListJobs(ctx, store.JobFilter{Statuses: []store.Status{store.StatusPending}})
	if err != nil {
		return err
	}
	queued := map[int64]bool{}
	for _, j := range jobs {
		if j.RunnerManagerID != 0 || graph.IsBridge(j) {
			continue
		}
		queued[j.ID] = true
		if !d.queue.Has(j.ID) {
			d.queue.Push(d.queueJob(j))
		}
	}
	for _, id := range before {
		if !queued[id] {
			d.queue.Remove(id)
		}
	}
	return nil
}

func managerKey(managerID int64) string { return strconv.FormatInt(managerID, 10) }
