package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/fakeclock"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// recorder is a cluster that keeps what was published.
type recorder struct {
	cluster.Local
	mu     sync.Mutex
	events []cluster.Event
}

func (r *recorder) Publish(e cluster.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) published(k cluster.Kind, id int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.events, cluster.Event{Kind: k, ID: id})
}

// fixture is a Dispatcher over a real SQLite store, with the jobs its
// JobChanged hook was told of.
type fixture struct {
	t       *testing.T
	st      store.Store
	d       *dispatch.Dispatcher
	runners *runners.Registry
	clock   *fakeclock.Clock
	cl      *recorder

	mu      sync.Mutex
	changed []*store.Job
}

var timeouts = dispatch.Timeouts{Ack: time.Minute, Pending: time.Hour, Stuck: 10 * time.Minute,
	Canceling: 10 * time.Minute, Grace: time.Minute}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newFixtureOn(t, st)
}

// newFixtureOn is another replica over the same store.
func newFixtureOn(t *testing.T, st store.Store) *fixture {
	f := &fixture{t: t, st: st, clock: fakeclock.New(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)), cl: &recorder{}}
	q := queue.New()
	t.Cleanup(q.Close)
	f.runners = runners.New(runners.Options{Store: st, Queue: q, Cluster: f.cl, Clock: f.clock})
	f.d = dispatch.New(dispatch.Options{Store: st, Queue: q, Runners: f.runners, Cluster: f.cl, Clock: f.clock,
		DefaultJobTimeout: 3600, Timeouts: timeouts, JobTokens: jobtoken.New(jobtoken.Options{Store: st, Clock: f.clock}),
		JobChanged: func(j *store.Job) {
			f.mu.Lock()
			f.changed = append(f.changed, j)
			f.mu.Unlock()
		}})
	if err := f.d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f
}

// lastChanged returns the last job JobChanged was told of.
func (f *fixture) lastChanged() *store.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.changed) == 0 {
		return nil
	}
	return f.changed[len(f.changed)-1]
}

func spec(name string) dispatch.JobSpec {
	return dispatch.JobSpec{Name: name, ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}, When: "on_success"}}}
}

func (f *fixture) enqueue(s dispatch.JobSpec) *store.Job {
	f.t.Helper()
	j, err := f.d.Enqueue(context.Background(), s)
	if err != nil {
		f.t.Fatal(err)
	}
	return j
}

// runner stores an instance runner (run untagged) and its manager.
func (f *fixture) runner() (*store.Runner, int64) {
	f.t.Helper()
	ctx := context.Background()
	rn := &store.Runner{Type: store.InstanceType, RunUntagged: true, TokenDigest: token.Digest(token.NewRunnerAuth(token.ScopeInstance)),
		CreatedAt: f.clock.Now()}
	if err := f.st.CreateRunner(ctx, rn); err != nil {
		f.t.Fatal(err)
	}
	m, err := f.runners.TouchManager(ctx, rn, "s_test", nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return rn, m
}

func (f *fixture) handOut(rn *store.Runner, m int64, hold time.Duration) *dispatch.HandOut {
	f.t.Helper()
	h, err := f.d.HandOut(context.Background(), rn, f.runners.QueueView(rn, executor.IsolationNone), m, hold)
	if err != nil {
		f.t.Fatal(err)
	}
	return h
}

// heldHandOut starts a hand-out that waits up to 20 s and returns once it
// is held in the queue; its result comes on the channel.
func (f *fixture) heldHandOut(rn *store.Runner, m int64) <-chan *dispatch.HandOut {
	f.t.Helper()
	got := make(chan *dispatch.HandOut, 1)
	before := f.d.Queue().Waiting()
	go func() { got <- f.handOut(rn, m, 20*time.Second) }()
	for f.d.Queue().Waiting() == before {
		time.Sleep(time.Millisecond)
	}
	return got
}

func (f *fixture) job(id int64) *store.Job {
	f.t.Helper()
	j, err := f.st.GetJob(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return j
}

func TestEnqueueValidatesAndDefaults(t *testing.T) {
	f := newFixture(t)
	if _, err := f.d.Enqueue(context.Background(), dispatch.JobSpec{Name: "x"}); err == nil || !strings.Contains(err.Error(), "project_id") {
		t.Fatalf("invalid spec: %v", err)
	}
	s := spec("build")
	s.Tags = []string{"b", "a", "b"}
	s.Variables = []runnerapi.Variable{{Key: runnerapi.IsolationVariable, Value: "container"}}
	j := f.enqueue(s)
	got := f.job(j.ID)
	if got.Status != store.StatusPending || got.Stage != "test" || got.Timeout != 3600 || !slices.Equal(got.Tags, []string{"a", "b"}) ||
		got.Isolation != "container" {
		t.Fatalf("stored %+v", got)
	}
	if !f.d.Queue().Has(j.ID) {
		t.Fatal("the job is not queued")
	}
}

// TestHandOutAssignsWithAFreshToken: the job goes to the manager in the
// store with the digest of a token only the hand-out knows, and it is
// out of the queue.
func TestHandOutAssignsWithAFreshToken(t *testing.T) {
	f := newFixture(t)
	rn, m := f.runner()
	if h := f.handOut(rn, m, 0); h != nil {
		t.Fatalf("an empty queue handed out %+v", h.Job)
	}
	j := f.enqueue(spec("a"))
	h := f.handOut(rn, m, time.Second)
	if h == nil || h.Job.ID != j.ID {
		t.Fatalf("hand-out %+v, want job %d", h, j.ID)
	}
	got := f.job(j.ID)
	if got.RunnerID != rn.ID || got.RunnerManagerID != m || got.TokenDigest == "" || got.TokenDigest == token.Digest(h.Token) ||
		!strings.HasPrefix(h.Token, "glcbt-") || h.Isolation != executor.IsolationNone {
		t.Fatalf("stored %+v, token %q isolation %s", got, h.Token, h.Isolation)
	}
	if f.d.Queue().Has(j.ID) {
		t.Fatal("a handed-out job is still queued")
	}
	// The runner's token may do everything, the script's only read; both
	// authenticate against this replica's copy of the job.
	ctx := context.Background()
	a, c, err := f.d.Authenticate(ctx, h.Token)
	if err != nil || a.ID != j.ID || !c.Allows(jobtoken.ScopeJob) || !c.Allows(jobtoken.ScopeTrace) || !dispatch.TokenActive(a) {
		t.Fatalf("runner token: %+v %+v %v", a, c, err)
	}
	if _, c, err := f.d.Authenticate(ctx, h.ScriptToken); err != nil || c.Allows(jobtoken.ScopeJob) || c.Allows(jobtoken.ScopeTrace) ||
		!c.Allows(jobtoken.ScopeRepositoryRead) || !c.MayRead(j.ID) {
		t.Fatalf("script token: %+v %v", c, err)
	}
	// Handed out again (after a release), the old tokens stop working.
	if err := f.d.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	h2 := f.handOut(rn, m, 0)
	if _, _, err := f.d.Authenticate(ctx, h.Token); !errors.Is(err, dispatch.ErrBadToken) {
		t.Fatalf("the first hand-out's token after the second hand-out: %v", err)
	}
	if _, _, err := f.d.Authenticate(ctx, h2.Token); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "glrt-x", "glcbt-random", h2.Token + "x"} {
		if _, _, err := f.d.Authenticate(ctx, bad); !errors.Is(err, dispatch.ErrBadToken) {
			t.Errorf("token %q: %v", bad, err)
		}
	}
}

// TestHandOutWaitsForAJob: a held hand-out is answered by the next job.
func TestHandOutWaitsForAJob(t *testing.T) {
	f := newFixture(t)
	rn, m := f.runner()
	got := f.heldHandOut(rn, m)
	j := f.enqueue(spec("late"))
	if h := <-got; h == nil || h.Job.ID != j.ID {
		t.Fatalf("held hand-out got %+v, want %d", h, j.ID)
	}
}

// countAssign is a store that counts AssignJob calls.
type countAssign struct {
	store.Store
	n atomic.Int32
}

func (c *countAssign) AssignJob(ctx context.Context, a store.Assignment) error {
	c.n.Add(1)
	return c.Store.AssignJob(ctx, a)
}

// TestPlacedAtCreation: a job enqueued while a runner waits for it is
// stored already assigned to that runner's manager (no separate
// assignment), reaches the waiting hand-out with working tokens, and is
// not queued; released, it is queued as any. With nobody waiting the job
// is stored queued.
func TestPlacedAtCreation(t *testing.T) {
	base := newFixture(t)
	st := &countAssign{Store: base.st}
	f := newFixtureOn(t, st)
	rn, m := f.runner()
	got := f.heldHandOut(rn, m)
	j := f.enqueue(spec("placed"))
	if j.RunnerManagerID != m || j.RunnerID != rn.ID || j.TokenDigest == "" {
		t.Fatalf("Enqueue returned %+v, want it assigned to manager %d", j, m)
	}
	stored := f.job(j.ID)
	if stored.Status != store.StatusPending || stored.RunnerManagerID != m || stored.TokenDigest != j.TokenDigest || stored.AssignedAt.IsZero() {
		t.Fatalf("stored %+v, want pending and assigned to manager %d", stored, m)
	}
	h := <-got
	if h == nil || h.Job.ID != j.ID || h.Manager != m {
		t.Fatalf("held hand-out got %+v, want job %d", h, j.ID)
	}
	if n := st.n.Load(); n != 0 {
		t.Errorf("%d AssignJob calls for a job placed at its creation, want 0", n)
	}
	if f.d.Queue().Has(j.ID) {
		t.Error("a placed job is queued")
	}
	ctx := context.Background()
	if a, _, err := f.d.Authenticate(ctx, h.Token); err != nil || a.ID != j.ID {
		t.Fatalf("the placed job's token: %+v %v", a, err)
	}
	if err := f.d.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if !f.d.Queue().Has(j.ID) {
		t.Fatal("a released placed job is not queued")
	}
	if h2 := f.handOut(rn, m, 0); h2 == nil || h2.Job.ID != j.ID || st.n.Load() != 1 {
		t.Fatalf("hand-out after the release: %+v (%d AssignJob calls), want job %d assigned once", h2, st.n.Load(), j.ID)
	}
	// Nobody waiting: stored queued.
	k := f.enqueue(spec("queued"))
	if k.RunnerManagerID != 0 || f.job(k.ID).RunnerManagerID != 0 || !f.d.Queue().Has(k.ID) {
		t.Fatalf("a job enqueued with nobody waiting: %+v, want queued", k)
	}
}

// TestPlacedByTransition: a job moving into the queue (the pipeline
// engine's transition to pending) while a runner waits is placed by that
// same transition.
func TestPlacedByTransition(t *testing.T) {
	f := newFixture(t)
	rn, m := f.runner()
	ctx := context.Background()
	j := &store.Job{Status: store.StatusCreated, ProjectID: 1, Name: "later", Spec: []byte(`{}`), CreatedAt: f.clock.Now()}
	if err := f.st.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	got := f.heldHandOut(rn, m)
	pj := *j
	pj.Status = store.StatusPending
	nj, err := f.d.Place(&pj, func(a *store.Assignment) (*store.Job, error) {
		return f.st.TransitionJob(ctx, j.ID, []store.Status{store.StatusCreated},
			store.JobUpdate{Status: store.StatusPending, UpdatedAt: f.clock.Now(), Assign: a})
	})
	if err != nil {
		t.Fatal(err)
	}
	if nj.Status != store.StatusPending || nj.RunnerManagerID != m {
		t.Fatalf("transitioned %+v, want pending and assigned to manager %d", nj, m)
	}
	if h := <-got; h == nil || h.Job.ID != j.ID {
		t.Fatalf("held hand-out got %+v, want job %d", h, j.ID)
	}
	// A write that fails gives the claimed request up without a job.
	got = f.heldHandOut(rn, m)
	if _, err := f.d.Place(&pj, func(*store.Assignment) (*store.Job, error) { return nil, store.ErrConflict }); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Place with a failing write: %v", err)
	}
	if h := <-got; h != nil {
		t.Fatalf("the request of a failed placement got %+v", h.Job)
	}
}

// TestQueuedReadsARun: jobs another replica queued are read together;
// only those still pending and unassigned are queued, once.
func TestQueuedReadsARun(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.st)
	rn, m := a.runner()
	var ids []int64
	for i := range 5 {
		ids = append(ids, a.enqueue(spec(fmt.Sprint("run-", i))).ID)
	}
	taken := a.handOut(rn, m, 0).Job.ID // (ids[0])
	a.enqueue(spec("not told"))
	canceled, err := a.d.Cancel(context.Background(), a.job(ids[1]))
	if err != nil || canceled.Status != store.StatusCanceled {
		t.Fatalf("cancel: %+v %v", canceled, err)
	}
	if err := b.d.Queued(context.Background(), ids[2]); err != nil { // told before
		t.Fatal(err)
	}
	if err := b.d.Queued(context.Background(), append(slices.Clone(ids), 1<<40)...); err != nil {
		t.Fatal(err)
	}
	got := b.d.Queue().IDs()
	slices.Sort(got)
	if want := ids[2:]; !slices.Equal(got, want) {
		t.Fatalf("queue after a run of events: %v, want %v (not %d taken, %d canceled)", got, want, taken, ids[1])
	}
}

// TestHandOutLosesRacesToAnotherReplica: two replicas queue the same jobs;
// what one assigned first the other skips, and past a few lost races in a
// row it answers ErrLostRaces (GitLab's 409) instead of looping.
func TestHandOutLosesRacesToAnotherReplica(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.st)
	rn, m := a.runner()
	var ids []int64
	for i := range 12 {
		j := a.enqueue(spec("j" + string(rune('a'+i))))
		if err := b.d.Queued(context.Background(), j.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	for range 11 {
		if h := a.handOut(rn, m, 0); h == nil {
			t.Fatal("replica a handed out nothing")
		}
	}
	// b's queue still holds all 12: the first nine it tries were taken.
	_, err := b.d.HandOut(context.Background(), rn, b.runners.QueueView(rn, executor.IsolationNone), m, 0)
	if !errors.Is(err, dispatch.ErrLostRaces) {
		t.Fatalf("after 9 lost races: %v, want ErrLostRaces", err)
	}
	// The next try finds the one job a left.
	h := b.handOut(rn, m, 0)
	if h == nil || h.Job.ID != ids[11] {
		t.Fatalf("replica b got %+v, want the last job %d", h, ids[11])
	}
}

// busyOnce is a store whose AssignJob finds each job held by another
// transaction at the first try (store.ErrBusy), as PostgreSQL's SKIP
// LOCKED does while another replica's write is in flight.
type busyOnce struct {
	store.Store
	mu   sync.Mutex
	seen map[int64]bool
}

func (b *busyOnce) AssignJob(ctx context.Context, a store.Assignment) error {
	b.mu.Lock()
	first := !b.seen[a.JobID]
	b.seen[a.JobID] = true
	b.mu.Unlock()
	if first {
		return fmt.Errorf("assigning job %d: %w", a.JobID, store.ErrBusy)
	}
	return b.Store.AssignJob(ctx, a)
}

// TestHandOutComesBackToABusyJob: a job another transaction held when it
// was tried is not dropped (that holder may roll back or die, and no other
// replica would try the job again): it is looked at again and handed out.
func TestHandOutComesBackToABusyJob(t *testing.T) {
	base := newFixture(t)
	f := newFixtureOn(t, &busyOnce{Store: base.st, seen: map[int64]bool{}})
	rn, m := f.runner()
	j := f.enqueue(spec("held"))
	h := f.handOut(rn, m, 30*time.Second)
	if h == nil || h.Job.ID != j.ID {
		t.Fatalf("hand-out after the job was busy: %+v, want job %d", h, j.ID)
	}
	if got := f.job(j.ID); got.RunnerManagerID != m {
		t.Errorf("stored manager %d, want %d", got.RunnerManagerID, m)
	}
}

// TestTransitionsFollowTheJob: the ack and the final update are
// compare-and-sets; each tells JobChanged, a final one ends the hand-out
// (the token stops working) and a stale one conflicts.
func TestTransitionsFollowTheJob(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rn, m := f.runner()
	j := f.enqueue(spec("a"))
	h := f.handOut(rn, m, 0)
	now := f.clock.Now()
	running, err := f.d.Transition(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now})
	if err != nil || running.Status != store.StatusRunning {
		t.Fatalf("ack: %+v %v", running, err)
	}
	if c := f.lastChanged(); c == nil || c.ID != j.ID || c.Status != store.StatusRunning {
		t.Fatalf("JobChanged told %+v", c)
	}
	if a, _ := f.d.Job(ctx, j.ID); a.Status != store.StatusRunning {
		t.Fatalf("active copy says %s", a.Status)
	}
	if !f.cl.published(cluster.JobChanged, j.ID) {
		t.Error("the other replicas were not told to forget their copy")
	}
	if _, err := f.d.Transition(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning, UpdatedAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second ack: %v, want ErrConflict", err)
	}
	done, err := f.d.Transition(ctx, j.ID, []store.Status{store.StatusRunning}, store.JobUpdate{Status: store.StatusSuccess, FinishedAt: now, UpdatedAt: now})
	if err != nil || done.Status != store.StatusSuccess {
		t.Fatalf("final: %+v %v", done, err)
	}
	if c := f.lastChanged(); c.Status != store.StatusSuccess {
		t.Fatalf("JobChanged told %s", c.Status)
	}
	if a, _ := f.d.Job(ctx, j.ID); dispatch.TokenActive(a) {
		t.Fatalf("token of a finished job still active (%s)", a.Status)
	}
	if _, _, err := f.d.Authenticate(ctx, h.Token); !errors.Is(err, dispatch.ErrJobNotRunning) {
		t.Fatalf("the token of a finished job: %v", err)
	}
}

// TestCancel covers every state a job is canceled in.
func TestCancel(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rn, m := f.runner()

	queued := f.enqueue(spec("queued"))
	c, err := f.d.Cancel(ctx, queued)
	if err != nil || c.Status != store.StatusCanceled || f.d.Queue().Has(queued.ID) {
		t.Fatalf("queued job: %+v %v (still queued: %v)", c, err, f.d.Queue().Has(queued.ID))
	}
	if h := f.handOut(rn, m, 0); h != nil {
		t.Fatalf("a canceled job was handed out: %+v", h.Job)
	}

	handed := f.enqueue(spec("handed"))
	f.handOut(rn, m, 0)
	if c, err = f.d.Cancel(ctx, handed); err != nil || c.Status != store.StatusCanceled {
		t.Fatalf("handed-out, unacknowledged job: %+v %v", c, err)
	}

	running := f.enqueue(spec("running"))
	f.handOut(rn, m, 0)
	now := f.clock.Now()
	if _, err := f.d.Transition(ctx, running.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	// Cancel from a stale copy (pending): it reads the job again.
	if c, err = f.d.Cancel(ctx, running); err != nil || c.Status != store.StatusCanceling {
		t.Fatalf("running job: %+v %v", c, err)
	}
	if a, _ := f.d.Job(ctx, running.ID); a.Status != store.StatusCanceling || !dispatch.TokenActive(a) {
		t.Fatalf("the runner's copy says %s: it must learn of the cancel and still report back", a.Status)
	}
	// A finished job is left alone.
	done := f.job(c.ID)
	if _, err := f.d.Transition(ctx, done.ID, []store.Status{store.StatusCanceling}, store.JobUpdate{Status: store.StatusCanceled, FinishedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if c, err = f.d.Cancel(ctx, f.job(done.ID)); err != nil || c.Status != store.StatusCanceled {
		t.Fatalf("finished job: %+v %v", c, err)
	}
}

// TestReleasePutsTheJobBack: a hand-out whose payload failed is undone.
func TestReleasePutsTheJobBack(t *testing.T) {
	f := newFixture(t)
	rn, m := f.runner()
	j := f.enqueue(spec("a"))
	h := f.handOut(rn, m, 0)
	if err := f.d.Release(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if got := f.job(j.ID); got.RunnerManagerID != 0 || got.TokenDigest != "" || got.Status != store.StatusPending {
		t.Fatalf("released job %+v", got)
	}
	if h2 := f.handOut(rn, m, 0); h2 == nil || h2.Job.ID != j.ID || h2.Token == h.Token || h2.ScriptToken == h.ScriptToken {
		t.Fatalf("after release: %+v", h2)
	}
}

// TestReapJobs: each server-side timeout, at the injected clock.
func TestReapJobs(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rn, m := f.runner()
	reap := func() {
		t.Helper()
		if err := f.d.ReapJobs(ctx, f.clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	start := func(name string, timeout int) *store.Job {
		t.Helper()
		s := spec(name)
		s.Timeout = timeout
		j := f.enqueue(s)
		f.handOut(rn, m, 0)
		now := f.clock.Now()
		j, err := f.d.Transition(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	unacked := f.enqueue(spec("unacked"))
	f.handOut(rn, m, 0)
	short := start("short", 60)
	long := start("long", 3600)
	canceling := start("canceling", 3600)
	if _, err := f.d.Cancel(ctx, canceling); err != nil {
		t.Fatal(err)
	}
	reap()
	for _, j := range []*store.Job{unacked, short, long, canceling} {
		if got := f.job(j.ID); got.Status.Finished() || (got.Status == store.StatusPending && got.RunnerManagerID == 0) {
			t.Fatalf("%s reaped too early: %s", j.Name, got.Status)
		}
	}

	f.clock.Advance(timeouts.Ack)
	reap()
	if got := f.job(unacked.ID); got.RunnerManagerID != 0 || !f.d.Queue().Has(unacked.ID) {
		t.Fatalf("unacknowledged job after the ack timeout: %+v (queued %v)", got, f.d.Queue().Has(unacked.ID))
	}
	// short: 60 s + 60 s grace have passed.
	f.clock.Advance(2 * time.Minute)
	reap()
	if got := f.job(short.ID); got.Status != store.StatusFailed || got.FailureReason != runnerapi.JobExecutionTimeout {
		t.Fatalf("short job past its timeout: %s %s", got.Status, got.FailureReason)
	}
	f.clock.Advance(timeouts.Stuck)
	reap()
	if got := f.job(long.ID); got.Status != store.StatusFailed || got.FailureReason != runnerapi.NoUpdatesRunning {
		t.Fatalf("silent running job: %s %s", got.Status, got.FailureReason)
	}
	if got := f.job(canceling.ID); got.Status != store.StatusCanceled || got.FailureReason != runnerapi.NoUpdatesCanceling {
		t.Fatalf("silent canceling job: %s %s", got.Status, got.FailureReason)
	}
	f.clock.Advance(timeouts.Pending)
	reap()
	if got := f.job(unacked.ID); got.Status != store.StatusFailed || got.FailureReason != runnerapi.StuckOrTimeoutFailure || f.d.Queue().Has(unacked.ID) {
		t.Fatalf("job nobody took: %s %s", got.Status, got.FailureReason)
	}
}

// TestLoadRebuildsTheQueue: a restarted replica queues what is pending and
// authenticates the jobs still handed out.
func TestLoadRebuildsTheQueue(t *testing.T) {
	f := newFixture(t)
	rn, m := f.runner()
	handed := f.enqueue(spec("handed"))
	h := f.handOut(rn, m, 0)
	queued := f.enqueue(spec("queued"))

	g := newFixtureOn(t, f.st)
	if !g.d.Queue().Has(queued.ID) || g.d.Queue().Has(handed.ID) {
		t.Fatalf("rebuilt queue %v", g.d.Queue().IDs())
	}
	if j, _, err := g.d.Authenticate(context.Background(), h.Token); err != nil || j.ID != handed.ID {
		t.Fatalf("handed-out job after a restart: %+v %v", j, err)
	}
}

// TestResync: after lost events the queue holds exactly the pending,
// unassigned jobs.
func TestResync(t *testing.T) {
	a := newFixture(t)
	b := newFixtureOn(t, a.st)
	rn, m := a.runner()
	gone := a.enqueue(spec("gone"))
	if err := b.d.Queued(context.Background(), gone.ID); err != nil {
		t.Fatal(err)
	}
	a.handOut(rn, m, 0) // b misses the JobTaken event
	missed := a.enqueue(spec("missed"))
	if err := b.d.Resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := b.d.Queue().IDs(); !slices.Equal(ids, []int64{missed.ID}) {
		t.Fatalf("queue after resync %v, want [%d]", ids, missed.ID)
	}
}

// listHook is a store that runs a hook after each ListJobs, as if another
// request ran right after the read.
type listHook struct {
	store.Store
	after func()
}

func (l *listHook) ListJobs(ctx context.Context, f store.JobFilter) ([]*store.Job, error) {
	jobs, err := l.Store.ListJobs(ctx, f)
	if l.after != nil {
		l.after()
	}
	return jobs, err
}

// TestResyncKeepsAJobQueuedMeanwhile: a job this replica enqueues while a
// resync reads the store stays queued (it is not in the listing, and the
// store's event for it goes to the other replicas only).
func TestResyncKeepsAJobQueuedMeanwhile(t *testing.T) {
	base := newFixture(t)
	hook := &listHook{Store: base.st}
	f := newFixtureOn(t, hook)
	var meanwhile *store.Job
	hook.after = func() {
		hook.after = nil
		meanwhile = f.enqueue(spec("meanwhile"))
	}
	if err := f.d.Resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if meanwhile == nil || !f.d.Queue().Has(meanwhile.ID) {
		t.Fatalf("a job enqueued while the resync read the store is not queued (%v)", f.d.Queue().IDs())
	}
}

// TestIsolationMinimumsAndPendingReasons: a project's minimum raises its
// queued jobs' level, and a job nobody offers its level to says why.
func TestIsolationMinimumsAndPendingReasons(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rn, m := f.runner()
	j := f.enqueue(spec("a"))
	if w := f.d.IsolationWaitOf(f.job(j.ID)); w != nil {
		t.Fatalf("a job asking nothing waits: %+v", w)
	}
	f.d.SetProjectMinimum(1, executor.IsolationVM)
	if !f.cl.published(cluster.ProjectChanged, 1) {
		t.Error("the minimum was not published to the other replicas")
	}
	if h := f.handOut(rn, m, 0); h != nil {
		t.Fatalf("a runner offering none got a job its project wants in a vm: %+v", h.Job)
	}
	f.runners.NoteOffer(rn, "s_test", &runnerapi.Info{IsolationLevels: []string{"none", "container"}})
	if got := f.d.PendingReason(f.job(j.ID)); got != "no runner offers isolation level vm (online runners offer: none, container)" {
		t.Fatalf("pending reason %q", got)
	}
	view := f.runners.NoteOffer(rn, "s_test", &runnerapi.Info{IsolationLevels: []string{"vm"}})
	if f.d.PendingReason(f.job(j.ID)) != "" {
		t.Fatal("a job a runner offers its level to still has a pending reason")
	}
	h, err := f.d.HandOut(ctx, rn, view, m, 0)
	if err != nil || h == nil || h.Isolation != executor.IsolationVM {
		t.Fatalf("vm hand-out %+v %v", h, err)
	}
	// Another replica learns a minimum changed elsewhere from the store.
	p := &store.Project{Path: "p", Name: "p", DefaultBranch: "main", Visibility: "private", CreatedAt: f.clock.Now()}
	if err := f.st.CreateProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	s := spec("b")
	s.ProjectID = p.ID
	k := f.enqueue(s)
	g := newFixtureOn(t, f.st)
	if w := g.d.IsolationWaitOf(f.job(k.ID)); w != nil {
		t.Fatalf("before the change: %+v", w)
	}
	p.MinIsolation = "microvm"
	if err := f.st.UpdateProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := g.d.ProjectChanged(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if w := g.d.IsolationWaitOf(f.job(k.ID)); w == nil || w.Level != executor.IsolationMicroVM {
		t.Fatalf("after the change: %+v", w)
	}
}

// DebugMode: the runner's word, or the job's variables as GitLab reads
// them (CI_DEBUG_TRACE or CI_DEBUG_SERVICES, GitLab's true words,
// expanded).
func TestDebugMode(t *testing.T) {
	job := func(vars ...runnerapi.Variable) *store.Job {
		b, err := json.Marshal(dispatch.JobSpec{Name: "j", Variables: vars})
		if err != nil {
			t.Fatal(err)
		}
		return &store.Job{Spec: b}
	}
	v := func(k, val string) runnerapi.Variable { return runnerapi.Variable{Key: k, Value: val} }
	for _, tt := range []struct {
		name string
		j    *store.Job
		want bool
	}{
		{"none", job(), false},
		{"the runner said so", &store.Job{DebugTrace: true}, true},
		{"true", job(v("CI_DEBUG_TRACE", "true")), true},
		{"yes", job(v("CI_DEBUG_TRACE", "YES")), true},
		{"1, services", job(v("CI_DEBUG_SERVICES", "1")), true},
		{"false", job(v("CI_DEBUG_TRACE", "false")), false},
		{"set later to false", job(v("CI_DEBUG_TRACE", "true"), v("CI_DEBUG_TRACE", "false")), false},
		{"expanded", job(v("D", "on"), v("CI_DEBUG_TRACE", "$D")), true},
		{"raw, not expanded", job(v("D", "on"), runnerapi.Variable{Key: "CI_DEBUG_TRACE", Value: "$D", Raw: true}), false},
		{"not a word of GitLab's", job(v("CI_DEBUG_TRACE", "sure")), false},
	} {
		if got := dispatch.DebugMode(tt.j); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
