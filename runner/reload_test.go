package runner

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/taskscaler"
)

func TestRoomLimitChanges(t *testing.T) {
	r := newRoom(1)
	if !r.tryTake() || r.tryTake() {
		t.Fatal("a room of 1 took 0 or 2")
	}
	got := make(chan bool, 1)
	go func() { got <- r.take(context.Background()) }()
	select {
	case <-got:
		t.Fatal("take returned with no room")
	case <-time.After(20 * time.Millisecond):
	}
	r.setLimit(2) // a raise lets the waiter in
	if !<-got {
		t.Fatal("take failed after the raise")
	}
	r.setLimit(1) // lowered below what is held: nothing given
	r.give()
	if r.free() != 0 || r.tryTake() {
		t.Fatalf("1 of 2 held under a limit of 1: free %d", r.free())
	}
	r.give()
	if r.free() != 1 {
		t.Fatalf("free %d, want 1", r.free())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if !r.tryTake() || r.take(ctx) {
		t.Fatal("take with a canceled context and no room succeeded")
	}
}

// shutdownCounter wraps a provider and counts its Shutdowns; it may
// take policies too (an autoscaled provider's SetPolicies).
type shutdownCounter struct {
	executor.Provider
	shutdowns atomic.Int32
	mu        sync.Mutex
	policies  [][]taskscaler.Policy
}

func (p *shutdownCounter) Shutdown(context.Context) error { p.shutdowns.Add(1); return nil }

type policyProvider struct{ *shutdownCounter }

func (p policyProvider) SetPolicies(ps []taskscaler.Policy) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.policies = append(p.policies, ps)
	return taskscaler.CheckPolicies(ps)
}

// reloadHarness is a harness whose providers are counted, by token.
type reloadHarness struct {
	*harness
	mu        sync.Mutex
	providers map[string][]*shutdownCounter
}

func newReloadHarness(t *testing.T, mutate func(*config.Config)) *reloadHarness {
	rh := &reloadHarness{providers: map[string][]*shutdownCounter{}}
	rh.harness = newHarness(t, newFake(t), func(c *config.Config, o *Options) {
		if mutate != nil {
			mutate(c)
		}
		inner := o.NewProvider
		o.NewProvider = func(rc *config.Runner) (executor.Provider, error) {
			p, err := inner(rc)
			if err != nil {
				return nil, err
			}
			sc := &shutdownCounter{Provider: p}
			rh.mu.Lock()
			rh.providers[rc.Token] = append(rh.providers[rc.Token], sc)
			rh.mu.Unlock()
			if rc.Autoscaler != nil {
				return policyProvider{sc}, nil
			}
			return sc, nil
		}
	})
	return rh
}

func (rh *reloadHarness) made(tok string) []*shutdownCounter {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	return slices.Clone(rh.providers[tok])
}

// reload applies a copy of the harness's config changed by edit.
func (rh *reloadHarness) reload(edit func(c *config.Config)) (ReloadResult, error) {
	return rh.m.Reload(func() (*config.Config, error) {
		c := cloneConfig(rh.cfg)
		edit(c)
		return c, nil
	})
}

func cloneConfig(c *config.Config) *config.Config {
	n := *c
	n.Runners = nil
	for _, r := range c.Runners {
		rc := *r
		rc.Environment = slices.Clone(r.Environment)
		if r.Autoscaler != nil {
			a := *r.Autoscaler
			a.Policies = slices.Clone(r.Autoscaler.Policies)
			rc.Autoscaler = &a
		}
		n.Runners = append(n.Runners, &rc)
	}
	return &n
}

// requestsBy counts the job requests made with tok.
func (f *fake) requestsBy(tok string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.requests {
		if r.Token == tok {
			n++
		}
	}
	return n
}

// TestReloadAddsAndRemovesEntries: a new entry starts asking at once; an
// entry gone stops asking and its executor is shut down.
func TestReloadAddsAndRemovesEntries(t *testing.T) {
	rh := newReloadHarness(t, nil)
	rh.start()
	first := rh.cfg.Runners[0].Token
	waitFor(t, "the first entry asking", func() bool { return rh.f.requestsBy(first) > 0 })
	const second = "glrt-t1_secondtoken"
	res, err := rh.reload(func(c *config.Config) {
		c.Runners[0].Token = second
		c.Runners[0].Name = "second"
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Added) != 1 || len(res.Removed) != 1 {
		t.Errorf("reload result %+v, want one added, one removed", res)
	}
	waitFor(t, "the new entry asking", func() bool { return rh.f.requestsBy(second) > 3 })
	waitFor(t, "the old entry's executor shut down", func() bool {
		ps := rh.made(first)
		return len(ps) == 1 && ps[0].shutdowns.Load() == 1
	})
	before := rh.f.requestsBy(first)
	n := rh.f.requestsBy(second)
	waitFor(t, "more requests of the new entry", func() bool { return rh.f.requestsBy(second) > n+3 })
	if after := rh.f.requestsBy(first); after != before {
		t.Errorf("the removed entry asked %d more times", after-before)
	}
	if ps := rh.made(second); len(ps) != 1 || ps[0].shutdowns.Load() != 0 {
		t.Errorf("the new entry's executors: %d", len(ps))
	}
}

// blockingJob runs until its file exists.
func blockingJob(id int64, dir string) (*runnerapi.JobResponse, string) {
	gate := filepath.Join(dir, "gate-"+strings.TrimSpace(time.Now().Format("150405.000000")))
	return fakeJob(id, `echo "concurrent=$CI_CONCURRENT_ID x=$X"`, "while [ ! -e "+gate+" ]; do sleep 0.02; done"), gate
}

func openGate(t *testing.T, gate string) {
	t.Helper()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fake) started(id int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Contains(string(f.traces[id]), "concurrent=")
}

func (f *fake) succeeded(id int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.finals[id]
	return len(fs) > 0 && fs[len(fs)-1].State == "success"
}

// TestReloadRemovedEntryFinishesItsJob: an entry removed while its job
// runs lets the job finish, and only then shuts its executor down.
func TestReloadRemovedEntryFinishesItsJob(t *testing.T) {
	rh := newReloadHarness(t, nil)
	job, gate := blockingJob(1, rh.dir)
	rh.f.add(job)
	rh.start()
	waitFor(t, "the job running", func() bool { return rh.f.started(1) })
	tok := rh.cfg.Runners[0].Token
	if _, err := rh.reload(func(c *config.Config) { c.Runners = nil }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := rh.made(tok)[0].shutdowns.Load(); n != 0 {
		t.Fatal("the executor was shut down under its running job")
	}
	openGate(t, gate)
	waitFor(t, "the job to succeed", func() bool { return rh.f.succeeded(1) })
	waitFor(t, "the executor shut down after the job", func() bool { return rh.made(tok)[0].shutdowns.Load() == 1 })
}

// TestReloadConcurrent: raising concurrent starts a waiting job beside
// a running one at once.
func TestReloadConcurrent(t *testing.T) {
	rh := newReloadHarness(t, func(c *config.Config) { c.Concurrent = 1 })
	j1, g1 := blockingJob(1, rh.dir)
	j2, g2 := blockingJob(2, rh.dir)
	rh.f.add(j1)
	rh.f.add(j2)
	rh.start()
	waitFor(t, "job 1 running", func() bool { return rh.f.started(1) })
	time.Sleep(100 * time.Millisecond)
	if rh.f.started(2) {
		t.Fatal("job 2 started beside job 1 under concurrent = 1")
	}
	res, err := rh.reload(func(c *config.Config) { c.Concurrent = 2 })
	if err != nil || res.Concurrent != 2 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	waitFor(t, "job 2 running beside job 1", func() bool { return rh.f.started(2) })
	if !strings.Contains(rh.f.trace(2), "concurrent=1 ") {
		t.Errorf("job 2 beside job 1 is not in slot 1:\n%s", rh.f.trace(2))
	}
	openGate(t, g1)
	openGate(t, g2)
	waitFor(t, "both jobs to succeed", func() bool { return rh.f.succeeded(1) && rh.f.succeeded(2) })
	if ps := rh.made(rh.cfg.Runners[0].Token); len(ps) != 1 {
		t.Errorf("%d executors made, want 1 (the entry did not change)", len(ps))
	}
}

// TestReloadReplacesChangedEntry: an entry whose settings changed is
// restarted: its running job goes on with the old settings, the next
// job has the new ones and its own slot.
func TestReloadReplacesChangedEntry(t *testing.T) {
	rh := newReloadHarness(t, func(c *config.Config) { c.Runners[0].Environment = []string{"X=old"} })
	j1, g1 := blockingJob(1, rh.dir)
	rh.f.add(j1)
	rh.start()
	waitFor(t, "job 1 running", func() bool { return rh.f.started(1) })
	tok := rh.cfg.Runners[0].Token
	res, err := rh.reload(func(c *config.Config) { c.Runners[0].Environment = []string{"X=new"} })
	if err != nil || len(res.Replaced) != 1 || len(res.Added)+len(res.Removed) != 0 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	j2, g2 := blockingJob(2, rh.dir)
	rh.f.add(j2)
	waitFor(t, "job 2 running", func() bool { return rh.f.started(2) })
	if tr := rh.f.trace(2); !strings.Contains(tr, "concurrent=1 x=new") {
		t.Errorf("job 2 after the change: want slot 1 (job 1 holds 0) and X=new:\n%s", tr)
	}
	if tr := rh.f.trace(1); !strings.Contains(tr, "x=old") {
		t.Errorf("job 1:\n%s", tr)
	}
	ps := rh.made(tok)
	if len(ps) != 2 || ps[0].shutdowns.Load() != 0 {
		t.Fatalf("executors: %d made, the old one shut down %d times; want 2, 0 while its job runs", len(ps), ps[0].shutdowns.Load())
	}
	openGate(t, g1)
	openGate(t, g2)
	waitFor(t, "both jobs to succeed", func() bool { return rh.f.succeeded(1) && rh.f.succeeded(2) })
	waitFor(t, "the old executor shut down", func() bool { return ps[0].shutdowns.Load() == 1 })
	if ps[1].shutdowns.Load() != 0 {
		t.Error("the new executor was shut down")
	}
}

// TestReloadErrorsChangeNothing: a configuration that does not load,
// does not validate, or whose executor cannot be made leaves the
// manager as it was.
func TestReloadErrorsChangeNothing(t *testing.T) {
	rh := newReloadHarness(t, nil)
	rh.start()
	tok := rh.cfg.Runners[0].Token
	waitFor(t, "asking", func() bool { return rh.f.requestsBy(tok) > 0 })
	bad := errors.New("config.toml:3: bad")
	if _, err := rh.m.Reload(func() (*config.Config, error) { return nil, bad }); !errors.Is(err, bad) {
		t.Errorf("a load error: %v", err)
	}
	if _, err := rh.reload(func(c *config.Config) { c.Runners[0].URL = "" }); err == nil {
		t.Error("an invalid config was applied")
	}
	// The added entry's executor fails: the other changes do not apply.
	failing := errors.New("no executor for you")
	rh.m.opts.NewProvider = func(rc *config.Runner) (executor.Provider, error) { return nil, failing }
	if _, err := rh.reload(func(c *config.Config) {
		c.Concurrent = 7
		extra := *c.Runners[0]
		extra.Token = "glrt-t1_extratoken"
		c.Runners = append(c.Runners, &extra)
	}); !errors.Is(err, failing) {
		t.Errorf("an executor that fails: %v", err)
	}
	// (A request in flight holds room: look at the bound, not what is free.)
	rh.m.room.mu.Lock()
	limit := rh.m.room.limit
	rh.m.room.mu.Unlock()
	if limit != rh.cfg.Concurrent || rh.m.config().Concurrent != rh.cfg.Concurrent {
		t.Errorf("concurrent %d (room %d) after failed reloads, want %d", rh.m.config().Concurrent, limit, rh.cfg.Concurrent)
	}
	if ws := rh.m.currentWorkers(); len(ws) != 1 || ws[0].rc.Token != tok || ws[0].retired.Load() {
		t.Errorf("workers after failed reloads: %d", len(ws))
	}
	n := rh.f.requestsBy(tok)
	waitFor(t, "still asking", func() bool { return rh.f.requestsBy(tok) > n+2 })
}

// TestReloadPoliciesInPlace: an autoscaled entry whose policies alone
// changed keeps its executor (instances, jobs) and takes the new
// policies; a policy that does not compile changes nothing.
func TestReloadPoliciesInPlace(t *testing.T) {
	rh := newReloadHarness(t, func(c *config.Config) {
		c.Runners[0].Autoscaler = &taskscaler.Config{Plugin: "fake", Policies: []taskscaler.Policy{{IdleCount: 1, IdleTime: time.Minute}}}
	})
	rh.start()
	tok := rh.cfg.Runners[0].Token
	res, err := rh.reload(func(c *config.Config) { c.Runners[0].Autoscaler.Policies[0].IdleCount = 5 })
	if err != nil || !slices.Equal(res.Retuned, []string{rh.m.currentWorkers()[0].short}) || len(res.Replaced) != 0 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	ps := rh.made(tok)
	if len(ps) != 1 {
		t.Fatalf("%d executors made, want 1", len(ps))
	}
	ps[0].mu.Lock()
	got := slices.Clone(ps[0].policies)
	ps[0].mu.Unlock()
	if len(got) != 1 || got[0][0].IdleCount != 5 {
		t.Errorf("policies set: %+v", got)
	}
	if _, err := rh.reload(func(c *config.Config) { c.Runners[0].Autoscaler.Policies[0].Periods = []string{"not a cron"} }); err == nil {
		t.Error("a policy that does not compile was applied")
	}
	if w := rh.m.currentWorkers()[0]; w.rc.Autoscaler.Policies[0].IdleCount != 5 {
		t.Errorf("the live entry's policies: %+v", w.rc.Autoscaler.Policies)
	}
	// A change beyond the policies restarts the entry (exclusive: once
	// its jobs ended, there are none).
	res, err = rh.reload(func(c *config.Config) {
		c.Runners[0].Autoscaler.Policies[0].IdleCount = 5
		c.Runners[0].Autoscaler.MaxInstances = 9
	})
	if err != nil || len(res.Replaced) != 1 {
		t.Fatalf("reload: %+v %v", res, err)
	}
	waitFor(t, "the restarted entry's new executor", func() bool {
		ps := rh.made(tok)
		return len(ps) == 2 && ps[0].shutdowns.Load() == 1
	})
	waitFor(t, "the restarted entry asking", func() bool {
		ws := rh.m.currentWorkers()
		return len(ws) == 1 && !ws[0].retired.Load() && ws[0].ctx != nil
	})
}

// TestReloadExclusiveEntryWaits: an entry whose executor holds shared
// state (here: the instance executor) is restarted only once its old
// executor's jobs ended and it shut down; reloads meanwhile change what
// the successor gets, not how many there are.
func TestReloadExclusiveEntryWaits(t *testing.T) {
	rh := newReloadHarness(t, func(c *config.Config) {
		c.Runners[0].Executor = "instance"
		c.Runners[0].Autoscaler = &taskscaler.Config{Plugin: "fake"}
		c.Runners[0].Environment = []string{"X=first"}
	})
	j1, g1 := blockingJob(1, rh.dir)
	rh.f.add(j1)
	rh.start()
	waitFor(t, "job 1 running", func() bool { return rh.f.started(1) })
	tok := rh.cfg.Runners[0].Token
	for _, x := range []string{"second", "third"} {
		res, err := rh.reload(func(c *config.Config) { c.Runners[0].Environment = []string{"X=" + x} })
		if err != nil || len(res.Replaced) != 1 {
			t.Fatalf("reload to %s: %+v %v", x, res, err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if ps := rh.made(tok); len(ps) != 1 || ps[0].shutdowns.Load() != 0 {
		t.Fatalf("while the old executor's job runs: %d executors made", len(ps))
	}
	openGate(t, g1)
	waitFor(t, "job 1 to succeed", func() bool { return rh.f.succeeded(1) })
	waitFor(t, "the successor made", func() bool { return len(rh.made(tok)) == 2 })
	if ps := rh.made(tok); ps[0].shutdowns.Load() != 1 {
		t.Error("the old executor was not shut down before its successor was made")
	}
	j2, g2 := blockingJob(2, rh.dir)
	rh.f.add(j2)
	waitFor(t, "job 2 running", func() bool { return rh.f.started(2) })
	if tr := rh.f.trace(2); !strings.Contains(tr, "x=third") {
		t.Errorf("job 2 runs with the last settings? %s", tr)
	}
	openGate(t, g2)
	waitFor(t, "job 2 to succeed", func() bool { return rh.f.succeeded(2) })
	time.Sleep(50 * time.Millisecond)
	if n := len(rh.made(tok)); n != 2 {
		t.Errorf("%d executors made, want 2", n)
	}
	// Removing the entry while its successor is pending leaves none.
	j3, g3 := blockingJob(3, rh.dir)
	rh.f.add(j3)
	waitFor(t, "job 3 running", func() bool { return rh.f.started(3) })
	if _, err := rh.reload(func(c *config.Config) { c.Runners[0].Environment = []string{"X=fourth"} }); err != nil {
		t.Fatal(err)
	}
	if _, err := rh.reload(func(c *config.Config) { c.Runners = nil }); err != nil {
		t.Fatal(err)
	}
	openGate(t, g3)
	waitFor(t, "job 3 to succeed", func() bool { return rh.f.succeeded(3) })
	waitFor(t, "the executor shut down", func() bool { return rh.made(tok)[1].shutdowns.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if n := len(rh.made(tok)); n != 2 || len(rh.m.currentWorkers()) != 0 {
		t.Errorf("after removing a pending entry: %d executors made, %d workers", n, len(rh.m.currentWorkers()))
	}
}
