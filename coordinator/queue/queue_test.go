package queue

import (
	"context"
	"sync"
	"testing"
	"time"
)

func runner(id int64, tags ...string) *Runner {
	r := &Runner{ID: id, RunUntagged: true, Tags: map[string]bool{}}
	for _, t := range tags {
		r.Tags[t] = true
	}
	return r
}

func TestCanRun(t *testing.T) {
	cases := []struct {
		name string
		r    Runner
		j    Job
		want bool
	}{
		{"untagged job, run_untagged", Runner{RunUntagged: true}, Job{}, true},
		{"untagged job, tagged-only runner", Runner{Tags: map[string]bool{"a": true}}, Job{}, false},
		{"tags subset", Runner{Tags: map[string]bool{"a": true, "b": true}}, Job{Tags: []string{"a"}}, true},
		{"tags not subset", Runner{Tags: map[string]bool{"a": true}}, Job{Tags: []string{"a", "b"}}, false},
		{"protected-only, unprotected ref", Runner{RunUntagged: true, ProtectedOnly: true}, Job{}, false},
		{"protected-only, protected ref", Runner{RunUntagged: true, ProtectedOnly: true}, Job{Protected: true}, true},
		{"project runner, own project", Runner{RunUntagged: true, Scope: Project, ProjectIDs: map[int64]bool{7: true}}, Job{ProjectID: 7}, true},
		{"project runner, other project", Runner{RunUntagged: true, Scope: Project, ProjectIDs: map[int64]bool{7: true}}, Job{ProjectID: 8}, false},
		{"group runner, ancestor group", Runner{RunUntagged: true, Scope: Group, GroupID: 3}, Job{NamespaceIDs: []int64{9, 3}}, true},
		{"group runner, other group", Runner{RunUntagged: true, Scope: Group, GroupID: 4}, Job{NamespaceIDs: []int64{9, 3}}, false},
		{"isolation offered exactly", Runner{RunUntagged: true, Isolation: 4}, Job{Isolation: 4}, true},
		{"stronger isolation offered", Runner{RunUntagged: true, Isolation: 5}, Job{Isolation: 4}, true},
		{"weaker isolation offered", Runner{RunUntagged: true, Isolation: 2}, Job{Isolation: 4}, false},
		{"isolation offered, tags not", Runner{Isolation: 5, Tags: map[string]bool{"a": true}}, Job{Tags: []string{"b"}, Isolation: 1}, false},
	}
	for _, c := range cases {
		if got := c.r.CanRun(&c.j); got != c.want {
			t.Errorf("%s: CanRun = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOrderPriorityThenFIFO(t *testing.T) {
	q := New()
	q.Push(&Job{ID: 1})
	q.Push(&Job{ID: 2, Priority: 5})
	q.Push(&Job{ID: 3})
	q.Push(&Job{ID: 4, Priority: 5})
	q.Push(&Job{ID: 5, Priority: -1})
	var got []int64
	req := Request{Runner: runner(1), Manager: "m"}
	for j := q.Take(context.Background(), req, 0); j != nil; j = q.Take(context.Background(), req, 0) {
		got = append(got, j.ID)
	}
	want := []int64{2, 4, 1, 3, 5}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestTakeSkipsJobsTheRunnerCannotRun(t *testing.T) {
	q := New()
	q.Push(&Job{ID: 1, Tags: []string{"gpu"}})
	q.Push(&Job{ID: 2})
	j := q.Take(context.Background(), Request{Runner: runner(1), Manager: "m"}, 0)
	if j == nil || j.ID != 2 {
		t.Fatalf("got %+v, want job 2", j)
	}
	if q.Take(context.Background(), Request{Runner: runner(1), Manager: "m"}, 0) != nil {
		t.Fatal("runner without gpu tag got the gpu job")
	}
	if j := q.Take(context.Background(), Request{Runner: runner(2, "gpu"), Manager: "n"}, 0); j == nil || j.ID != 1 {
		t.Fatalf("gpu runner got %+v", j)
	}
}

// waitFor polls cond; it only bounds how long a broken implementation hangs.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPushWakesHeldRequest(t *testing.T) {
	q := New()
	got := make(chan *Job)
	go func() { got <- q.Take(context.Background(), Request{Runner: runner(1), Manager: "m"}, time.Hour) }()
	waitFor(t, "request to be held", func() bool { return q.Waiting() == 1 })
	q.Push(&Job{ID: 42})
	if j := <-got; j == nil || j.ID != 42 {
		t.Fatalf("held request got %+v", j)
	}
	if q.Len() != 0 {
		t.Fatal("handed-over job also entered the backlog")
	}
}

func TestHeldRequestIgnoresJobsItCannotRun(t *testing.T) {
	q := New()
	got := make(chan *Job, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		got <- q.Take(ctx, Request{Runner: runner(1), Manager: "m"}, time.Hour)
	}()
	waitFor(t, "request to be held", func() bool { return q.Waiting() == 1 })
	q.Push(&Job{ID: 1, Tags: []string{"gpu"}})
	if q.Waiting() != 1 {
		t.Error("the push released the held request")
	}
	cancel() // (a hold that ends by itself could end before it is seen held on a loaded machine)
	if j := <-got; j != nil {
		t.Fatalf("held request got job %d it cannot run", j.ID)
	}
	if q.Len() != 1 {
		t.Fatal("job lost")
	}
}

func TestFairnessPrefersManagerWithFewestInFlight(t *testing.T) {
	q := New()
	// Manager "busy" already runs two jobs.
	q.MarkInFlight("busy")
	q.MarkInFlight("busy")
	busy := make(chan *Job, 1)
	idle := make(chan *Job, 1)
	go func() { busy <- q.Take(context.Background(), Request{Runner: runner(1), Manager: "busy"}, time.Hour) }()
	waitFor(t, "busy to wait", func() bool { return q.Waiting() == 1 })
	go func() { idle <- q.Take(context.Background(), Request{Runner: runner(2), Manager: "idle"}, time.Hour) }()
	waitFor(t, "idle to wait", func() bool { return q.Waiting() == 2 })
	q.Push(&Job{ID: 1})
	if j := <-idle; j == nil || j.ID != 1 {
		t.Fatalf("job did not go to the idle manager: %+v", j)
	}
	q.Push(&Job{ID: 2})
	if j := <-busy; j == nil || j.ID != 2 {
		t.Fatalf("second job did not reach the busy manager: %+v", j)
	}
}

func TestAbandonedHoldPutsHandedOverJobBack(t *testing.T) {
	q := New()
	w := &waiter{req: Request{Runner: runner(1), Manager: "m"}, got: make(chan *Job, 1)}
	w.elem = q.waiters.PushBack(w)
	q.Push(&Job{ID: 9}) // handed to w
	if q.Len() != 0 {
		t.Fatal("job not handed over")
	}
	if j := q.leave(w, true); j != nil {
		t.Fatal("abandoning waiter returned a job")
	}
	if q.Len() != 1 {
		t.Fatal("handed-over job was lost when the request went away")
	}
}

// TestClaim: a claim takes the held request Push would have chosen (the
// manager with fewest jobs in flight, a runner that may run the job) out
// of the waiters; the delivered job reaches it; a canceled claim ends the
// request without a job and its in-flight count.
func TestClaim(t *testing.T) {
	q := New()
	if c := q.Claim(&Job{}); c != nil {
		t.Fatal("claimed with no held request")
	}
	q.MarkInFlight("busy")
	busy := make(chan *Job, 1)
	idle := make(chan *Job, 1)
	gpu := make(chan *Job, 1)
	go func() {
		gpu <- q.Take(context.Background(), Request{Runner: runner(3, "gpu"), Manager: "gpu"}, time.Hour)
	}()
	waitFor(t, "gpu to wait", func() bool { return q.Waiting() == 1 })
	go func() { busy <- q.Take(context.Background(), Request{Runner: runner(1), Manager: "busy"}, time.Hour) }()
	waitFor(t, "busy to wait", func() bool { return q.Waiting() == 2 })
	ctx, cancel := context.WithCancel(context.Background())
	go func() { idle <- q.Take(ctx, Request{Runner: runner(2), Manager: "idle"}, time.Hour) }()
	waitFor(t, "idle to wait", func() bool { return q.Waiting() == 3 })

	c := q.Claim(&Job{Tags: []string{"gpu"}})
	if c == nil || c.Request.Manager != "gpu" || c.Request.Runner.ID != 3 {
		t.Fatalf("claim of a gpu job: %+v, want the gpu runner's request", c)
	}
	c.Deliver(&Job{ID: 1, Tags: []string{"gpu"}, Assigned: "h1"})
	if j := <-gpu; j == nil || j.ID != 1 || j.Assigned != "h1" {
		t.Fatalf("gpu request got %+v", j)
	}

	c = q.Claim(&Job{})
	if c == nil || c.Request.Manager != "idle" {
		t.Fatalf("claim: %+v, want the idle manager's request", c)
	}
	if q.Waiting() != 1 {
		t.Errorf("%d requests held after the claim, want 1", q.Waiting())
	}
	c.Deliver(&Job{ID: 2, Assigned: "h2"})
	if j := <-idle; j == nil || j.ID != 2 {
		t.Fatalf("idle request got %+v", j)
	}
	cancel()
	if q.Len() != 0 {
		t.Error("a job stored assigned entered the backlog")
	}

	c = q.Claim(&Job{})
	if c == nil || c.Request.Manager != "busy" {
		t.Fatalf("claim: %+v, want the busy manager's request", c)
	}
	c.Cancel()
	if j := <-busy; j != nil {
		t.Fatalf("the request of a canceled claim got %+v", j)
	}
	q.mu.Lock()
	inflight := q.inflight["busy"]
	q.mu.Unlock()
	if inflight != 1 {
		t.Errorf("busy has %d jobs in flight after a canceled claim, want 1", inflight)
	}
}

// TestAbandonedClaimKeepsTheAssignedJob: a request that gives up while
// its claimed job is being stored waits for it and takes it (the store
// has it assigned to that request; its caller releases it); a job that
// was not stored assigned goes back to the backlog as before.
func TestAbandonedClaimKeepsTheAssignedJob(t *testing.T) {
	q := New()
	w := &waiter{req: Request{Runner: runner(1), Manager: "m"}, got: make(chan *Job, 1)}
	w.elem = q.waiters.PushBack(w)
	c := q.Claim(&Job{})
	if c == nil {
		t.Fatal("no claim")
	}
	left := make(chan *Job, 1)
	go func() { left <- q.leave(w, true) }() // gives up before the delivery
	c.Deliver(&Job{ID: 5, Assigned: "h"})
	if j := <-left; j == nil || j.ID != 5 {
		t.Fatalf("a request that gave up during its claim got %+v, want the job stored assigned to it", j)
	}
	if q.Len() != 0 {
		t.Error("a job stored assigned entered the backlog")
	}
}

func TestCanceledContextReturnsNil(t *testing.T) {
	q := New()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *Job, 1)
	go func() { got <- q.Take(ctx, Request{Runner: runner(1), Manager: "m"}, time.Hour) }()
	waitFor(t, "request to be held", func() bool { return q.Waiting() == 1 })
	cancel()
	if j := <-got; j != nil {
		t.Fatal("got a job after cancel")
	}
	if q.Waiting() != 0 {
		t.Fatal("waiter not removed")
	}
}

func TestVersionChangesOnlyForJobsTheRunnerMayRun(t *testing.T) {
	q := New()
	r := runner(1)
	q.Take(context.Background(), Request{Runner: r, Manager: "m"}, 0) // register the runner
	v0 := q.Version(runner(1))
	q.Push(&Job{ID: 1, Tags: []string{"gpu"}})
	if q.Version(runner(1)) != v0 {
		t.Fatal("version changed for a job the runner cannot run")
	}
	q.Push(&Job{ID: 2})
	if q.Version(runner(1)) == v0 {
		t.Fatal("version did not change for a runnable job")
	}
	if New().Version(runner(1)) == New().Version(runner(1)) {
		t.Fatal("versions of two queues (processes) collide")
	}
}

func TestRemoveAndStats(t *testing.T) {
	q := New()
	now := time.Unix(1000, 0)
	q.Push(&Job{ID: 1, Tags: []string{"a"}, EnqueuedAt: now.Add(-10 * time.Second)})
	q.Push(&Job{ID: 2, Tags: []string{"a"}, EnqueuedAt: now.Add(-3 * time.Second)})
	q.Push(&Job{ID: 3, EnqueuedAt: now.Add(-1 * time.Second)})
	if !q.Remove(3) || q.Remove(3) {
		t.Fatal("Remove wrong")
	}
	st := q.Stats(now, nil)
	if len(st) != 1 || st[0].Queued != 2 || st[0].OldestWait != 10*time.Second || st[0].Tags[0] != "a" {
		t.Fatalf("stats %+v", st)
	}
	if st := q.Stats(now, runner(1)); len(st) != 0 {
		t.Fatalf("stats for untagged runner %+v", st)
	}
}

func TestCloseReleasesHeldRequests(t *testing.T) {
	q := New()
	got := make(chan *Job, 1)
	go func() { got <- q.Take(context.Background(), Request{Runner: runner(1), Manager: "m"}, time.Hour) }()
	waitFor(t, "request to be held", func() bool { return q.Waiting() == 1 })
	q.Close()
	if j := <-got; j != nil {
		t.Fatal("closed queue handed out a job")
	}
	if q.Take(context.Background(), Request{Runner: runner(1), Manager: "m"}, time.Hour) != nil {
		t.Fatal("Take after Close returned a job")
	}
}

// Many runners with different tags hold requests while jobs are pushed
// concurrently: every job is taken exactly once and only by a runner that
// may run it.
func TestConcurrentExactlyOnce(t *testing.T) {
	q := New()
	const jobs = 3000
	tagsets := [][]string{nil, {"a"}, {"b"}, {"a", "b"}}
	runners := []*Runner{runner(1, "a", "b"), runner(2, "a"), runner(3, "b"), runner(4)}
	runners[3].RunUntagged = true
	var mu sync.Mutex
	taken := map[int64]int{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		r := runners[i%len(runners)]
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for ctx.Err() == nil {
				j := q.Take(ctx, Request{Runner: r, Manager: string(rune('a' + i%5))}, 20*time.Millisecond)
				if j == nil {
					continue
				}
				if !r.CanRun(j) {
					t.Errorf("runner %d got job %d with tags %v", r.ID, j.ID, j.Tags)
				}
				mu.Lock()
				taken[j.ID]++
				mu.Unlock()
			}
		}(i)
	}
	var pw sync.WaitGroup
	for p := 0; p < 4; p++ {
		pw.Add(1)
		go func(p int) {
			defer pw.Done()
			for i := p; i < jobs; i += 4 {
				q.Push(&Job{ID: int64(i + 1), Tags: tagsets[i%len(tagsets)], Priority: i % 3})
			}
		}(p)
	}
	pw.Wait()
	waitFor(t, "all jobs taken", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(taken) == jobs
	})
	cancel()
	wg.Wait()
	for id, n := range taken {
		if n != 1 {
			t.Errorf("job %d taken %d times", id, n)
		}
	}
	if q.Len() != 0 {
		t.Errorf("%d jobs left in backlog", q.Len())
	}
}

func BenchmarkPushToHeldRequest(b *testing.B) {
	q := New()
	const waiters = 1000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan struct{}, waiters)
	for i := 0; i < waiters; i++ {
		r := runner(int64(i))
		go func() {
			for ctx.Err() == nil {
				if q.Take(ctx, Request{Runner: r, Manager: "m" + string(rune(i%50))}, time.Hour) != nil {
					got <- struct{}{}
				}
			}
		}()
	}
	for q.Waiting() < waiters {
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q.Push(&Job{ID: int64(i + 1)})
		<-got
	}
}

func BenchmarkTakeFromBacklog(b *testing.B) {
	q := New()
	for i := 0; i < b.N; i++ {
		q.Push(&Job{ID: int64(i + 1)})
	}
	req := Request{Runner: runner(1), Manager: "m"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if q.Take(context.Background(), req, 0) == nil {
			b.Fatal("empty")
		}
	}
}

func TestRunnersWithEqualSignaturesShareAVersion(t *testing.T) {
	q := New()
	a, b, gpu := runner(1, "linux"), runner(2, "linux"), runner(3, "gpu")
	for _, r := range []*Runner{a, b, gpu} {
		q.Take(context.Background(), Request{Runner: r, Manager: "m"}, 0)
	}
	if len(q.classes) != 2 {
		t.Fatalf("%d classes, want 2", len(q.classes))
	}
	va, vg := q.Version(runner(1)), q.Version(runner(3))
	q.Push(&Job{ID: 1, Tags: []string{"linux"}})
	if q.Version(runner(1)) == va || q.Version(runner(2)) != q.Version(runner(1)) || q.Version(runner(3)) != vg {
		t.Fatal("versions did not follow the classes")
	}
	// A runner whose tags change moves to another class.
	q.Take(context.Background(), Request{Runner: runner(2, "gpu"), Manager: "m"}, 0)
	if q.Version(runner(2)) != q.Version(runner(3)) {
		t.Fatal("runner 2 did not join the gpu class")
	}
	q.Forget(1)
	if len(q.classes) != 1 {
		t.Fatalf("empty class kept: %d classes", len(q.classes))
	}
}

func TestIsolationViews(t *testing.T) {
	q := New()
	weak, strong := runner(1), runner(1)
	strong.Isolation = 4
	for _, r := range []*Runner{weak, strong} {
		q.Take(context.Background(), Request{Runner: r, Manager: "m"}, 0)
	}
	vw, vs := q.Version(weak), q.Version(strong)
	q.Push(&Job{ID: 1, Isolation: 4})
	if q.Version(weak) != vw || q.Version(strong) == vs {
		t.Fatal("only the view offering the level should see a new version")
	}
	if st := q.Stats(time.Now(), weak); len(st) != 0 {
		t.Fatalf("stats of the weak view %+v", st)
	}
	if st := q.Stats(time.Now(), strong); len(st) != 1 || st[0].Queued != 1 {
		t.Fatalf("stats of the strong view %+v", st)
	}
	if q.Take(context.Background(), Request{Runner: weak, Manager: "m"}, 0) != nil {
		t.Fatal("the weak view took a job needing more isolation")
	}
	q.Forget(1)
	if len(q.runners) != 0 || len(q.classes) != 0 {
		t.Fatalf("Forget left %d views, %d classes", len(q.runners), len(q.classes))
	}
}

func TestUpdateIsolation(t *testing.T) {
	q := New()
	q.Push(&Job{ID: 1, ProjectID: 7})
	q.Push(&Job{ID: 2, ProjectID: 8})
	raise := func(j *Job) int {
		if j.ProjectID == 7 {
			return 3
		}
		return j.Isolation
	}
	q.UpdateIsolation(raise)
	weak := runner(1)
	if j := q.Take(context.Background(), Request{Runner: weak, Manager: "m"}, 0); j == nil || j.ID != 2 {
		t.Fatalf("weak runner got %+v, want job 2 (job 1 now needs rank 3)", j)
	}
	// Lowering hands the job to a held request that may now run it.
	got := make(chan *Job, 1)
	go func() { got <- q.Take(context.Background(), Request{Runner: weak, Manager: "m"}, time.Hour) }()
	waitFor(t, "request to be held", func() bool { return q.Waiting() == 1 })
	q.UpdateIsolation(func(*Job) int { return 0 })
	if j := <-got; j == nil || j.ID != 1 {
		t.Fatalf("held request got %+v, want job 1", j)
	}
	if q.Len() != 0 {
		t.Fatalf("%d jobs left", q.Len())
	}
}
