package taskscaler

// One test per known bug of GitLab's autoscaler (reference §9 and issue 6),
// named after it, showing that here the bug cannot happen.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/taskscaler/ledger"
)

// runJobs reserves and acquires keys, stepping until all have slots.
func (e *env) runJobs(limit time.Duration, keys ...string) []*Acquisition {
	e.t.Helper()
	var out []*Acquisition
	pending := slices.Clone(keys)
	e.stepUntil(limit, "all jobs placed", func() bool {
		pending = slices.DeleteFunc(pending, func(k string) bool {
			if e.s.Reserve(k) != nil {
				return false
			}
			a, ok, err := e.s.TryAcquire(k)
			if err != nil {
				e.t.Fatal(err)
			}
			if ok {
				out = append(out, a)
			}
			return ok
		})
		return len(pending) == 0
	})
	return out
}

func keys(prefix string, n int) []string {
	var ks []string
	for i := range n {
		ks = append(ks, fmt.Sprintf("%s%d", prefix, i))
	}
	return ks
}

// gitlab-runner#37643: with idle_count = 0 and capacity_per_instance > 1
// the fleet never scaled to zero.
func TestGitlabRunner37643_ScaleToZeroWithCapacityAboveOne(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 4, Policies: []Policy{{IdleCount: 0, IdleTime: time.Minute}}})
	jobs := e.runJobs(2*time.Minute, keys("j", 6)...)
	for _, a := range jobs {
		e.s.Release(a.Key)
	}
	e.stepUntil(3*time.Minute, "scaled to zero", func() bool { return len(e.cloud.Instances()) == 0 })
	_, created, _ := e.group.snapshot()
	e.step(600)
	if _, again, _ := e.group.snapshot(); again != created || e.live() != 0 {
		t.Fatalf("after scaling to zero: %d created (was %d), %d live", again, created, e.live())
	}
}

// gitlab-runner#37673: an idle removal immediately created a replacement,
// so idle_count = 1 kept two idle instances.
func TestGitlabRunner37673_IdleRemovalDoesNotCreateReplacement(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 1, Policies: []Policy{{IdleCount: 1, IdleTime: time.Minute, PreemptiveMode: ptr(false)}}})
	jobs := e.runJobs(2*time.Minute, keys("j", 3)...)
	for _, a := range jobs {
		e.s.Release(a.Key)
	}
	_, created, _ := e.group.snapshot()
	if created != 4 {
		t.Fatalf("created %d for 3 jobs + idle_count 1, want 4", created)
	}
	for range 20 * 60 {
		e.step(1)
		if _, c, _ := e.group.snapshot(); c != created {
			t.Fatalf("at %s an instance was created after idle removals", e.clock.Now().Sub(t0))
		}
	}
	if e.live() != 1 || e.s.Stats().ReadyFree != 1 {
		t.Fatalf("%d live instances, stats %+v; want exactly one idle", e.live(), e.s.Stats())
	}
}

// gitlab-runner#38931: preemptive mode accepted jobs with no ready
// capacity, which then waited for a boot.
func TestGitlabRunner38931_PreemptiveRefusesWithoutReadyCapacity(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 1, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.step(1)
	if e.group.increased != 2 {
		t.Fatalf("created %d", e.group.increased)
	}
	if h := e.s.Headroom(); h != 0 {
		t.Errorf("Headroom while instances boot (preemptive): %d, want 0", h)
	}
	if err := e.s.Reserve("early"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("Reserve while instances boot: %v, want ErrNoCapacity", err)
	}
	// The refused reservation counted as demand: a third instance.
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 3 })
	if h := e.s.Headroom(); h != 3 {
		t.Errorf("Headroom with three ready idle slots (preemptive): %d, want 3", h)
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := e.s.Reserve(k); err != nil {
			t.Fatalf("Reserve(%s) with a ready idle slot: %v", k, err)
		}
	}
	e.step(1) // replacements for the idle slots are booting
	if st := e.s.Stats(); st.Requested+st.Instances[PhaseCreating] == 0 {
		t.Fatal("no replacements for the reserved idle slots")
	}
	if err := e.s.Reserve("d"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("fourth Reserve with three ready slots, all reserved: %v", err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, ok, err := e.s.TryAcquire(k); !ok || err != nil {
			t.Fatalf("reserved job %s got no slot at once: %v", k, err)
		}
	}
}

// gitlab-runner#38326: in preemptive mode a long queue stalled: the runner
// only took as many jobs as there were idle slots, one boot at a time.
// Here refused reservations are demand.
func TestGitlabRunner38326_PreemptiveLongQueueScalesOut(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	queue := keys("q", 40)
	start := e.clock.Now()
	placed := 0
	e.stepUntil(5*time.Minute, "queue drained", func() bool {
		// The runner's workers: each queued job asks for a reservation.
		queue = slices.DeleteFunc(queue, func(k string) bool {
			if e.s.Reserve(k) != nil {
				return false
			}
			if _, ok, _ := e.s.TryAcquire(k); !ok {
				t.Fatalf("preemptive reservation without a slot for %s", k)
			}
			placed++
			return true
		})
		return len(queue) == 0
	})
	// One boot (30s) plus update and decision latency, not 20 boots.
	if took := e.clock.Now().Sub(start); took > 90*time.Second {
		t.Fatalf("40 queued jobs took %s of virtual time with a 30s boot", took)
	}
}

// gitlab#552226: an instance running a job was removed as idle, notably
// when policy periods left a gap and the default policy applied.
func TestGitlab552226_BusyInstanceNeverRemovedAcrossPolicyGap(t *testing.T) {
	// 12:00-12:59 keeps one idle slot; from 13:00 nothing matches.
	e := newEnv(t, Config{CapacityPerInstance: 2, Policies: []Policy{{Periods: []string{"* 12 * * *"}, IdleCount: 1, IdleTime: time.Minute}}})
	jobs := e.runJobs(2*time.Minute, "long", "short")
	if jobs[0].InstanceID != jobs[1].InstanceID {
		t.Fatal("jobs spread over two instances")
	}
	busy := jobs[0].InstanceID
	e.s.Release("short")
	for e.clock.Now().Before(t0.Add(2 * time.Hour)) { // into the gap, well past idle_time
		e.step(1)
		if _, _, dec := e.group.snapshot(); slices.Contains(dec, busy) {
			t.Fatalf("at %s: instance %s with a running job asked to be deleted", e.clock.Now().Format("15:04:05"), busy)
		}
		select {
		case <-jobs[0].Lost():
			t.Fatal("job lost its instance")
		default:
		}
	}
	e.s.Release("long")
	e.stepUntil(DefaultIdleTime+time.Minute, "idle instance removed", func() bool { return len(e.cloud.Instances()) == 0 })
}

// gitlab-runner#38355: jobs queued on a full instance instead of the
// scaler growing to max_instances.
func TestGitlabRunner38355_ScalesToMaxInstancesInsteadOfQueueing(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, MaxInstances: 3})
	jobs := e.runJobs(90*time.Second, keys("j", 6)...)
	if _, created, _ := e.group.snapshot(); created != 3 {
		t.Fatalf("created %d instances for 6 jobs at 2 per instance, want 3", created)
	}
	seen := map[string]bool{}
	per := map[string]int{}
	for _, a := range jobs {
		k := fmt.Sprintf("%s/%d", a.InstanceID, a.Slot)
		if seen[k] {
			t.Fatalf("slot %s given twice", k)
		}
		seen[k] = true
		per[a.InstanceID]++
	}
	for id, n := range per {
		if n > 2 {
			t.Fatalf("%d jobs on %s", n, id)
		}
	}
	if err := e.s.Reserve("seventh"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("seventh job at max_instances: %v", err)
	}
}

// taskscaler#26 and #38: a failing instance_ready_command (run once, no
// timeout, no backoff) made a create/delete storm.
func TestTaskscaler26And38_FailingReadyUpDoesNotStorm(t *testing.T) {
	var mu sync.Mutex
	attempts := 0
	failing := ReadierFunc(func(ctx context.Context, info fleeting.ConnectInfo) error {
		mu.Lock()
		attempts++
		mu.Unlock()
		return errors.New("ready command exited with status 1")
	})
	e := newEnv(t, Config{CapacityPerInstance: 1, InstanceReadyRetries: 2, Policies: []Policy{{IdleCount: 2}}}, withReadier(failing))
	e.step(60 * 60)
	calls, created, _ := e.group.snapshot()
	// Without backoff: 2 instances every ~50s (30s boot + 5s + 10s
	// retries) — over 140 an hour. With it the pace halves each time.
	if created > 20 {
		t.Fatalf("%d instances created in an hour of failing ready-ups", created)
	}
	t.Logf("failing ready-up for an hour: %d instances created, %d attempts", created, attempts)
	// Each instance that came up got 3 attempts (1 + 2 retries); the last
	// ones may still be booting or retrying.
	if attempts < 3*(created-2) || attempts > 3*created {
		t.Errorf("%d ready attempts for %d instances: want 3 each (1 + 2 retries)", attempts, created)
	}
	var times []int
	for i, c := range calls {
		if strings.HasPrefix(c, "increase") && c != "increase 0" {
			times = append(times, i)
		}
	}
	if len(times) < 3 {
		t.Fatalf("no retries at all: %v", calls)
	}
	// Recovery: the command starts working; the fleet comes back.
	mu.Lock()
	e.s.readier = nil
	mu.Unlock()
	e.stepUntil(15*time.Minute, "recovered", func() bool { return e.s.Stats().ReadyFree == 2 })
}

func TestReadyUpTimeout(t *testing.T) {
	hang := ReadierFunc(func(ctx context.Context, info fleeting.ConnectInfo) error {
		<-ctx.Done()
		return ctx.Err()
	})
	e := newEnv(t, Config{InstanceReadyTimeout: 10 * time.Millisecond, InstanceReadyRetries: -1, Policies: []Policy{{IdleCount: 1}}}, withReadier(hang))
	e.stepUntil(2*time.Minute, "removed", func() bool { _, _, dec := e.group.snapshot(); return len(dec) == 1 })
}

// gitlab-runner#37642: delete_instances_on_shutdown did nothing. Here the
// instances are deleted after the jobs release and before the plugin
// stops.
func TestGitlabRunner37642_DeleteInstancesOnShutdown(t *testing.T) {
	for _, del := range []bool{true, false} {
		t.Run(fmt.Sprint("delete=", del), func(t *testing.T) {
			e := newEnv(t, Config{DeleteInstancesOnShutdown: del, Policies: []Policy{{IdleCount: 3, IdleTime: time.Hour}}})
			e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 3 })
			e.acquire("job")
			defer e.passTimeForWaiters()()
			go func() {
				time.Sleep(5 * time.Millisecond)
				e.group.note("job released")
				e.s.Release("job")
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.s.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			calls, _, dec := e.group.snapshot()
			last := calls[len(calls)-1]
			if last != "shutdown" {
				t.Fatalf("calls %v: the plugin was not stopped last", calls)
			}
			if !del {
				if len(dec) != 0 || e.live() != 3 {
					t.Fatalf("instances deleted without delete_instances_on_shutdown: %v", dec)
				}
				return
			}
			rel := slices.Index(calls, "job released")
			firstDec := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "decrease") })
			if rel < 0 || firstDec < rel {
				t.Fatalf("calls %v: deleted before the job released", calls)
			}
			if len(e.cloud.Instances()) != 0 {
				t.Fatalf("instances left: %+v", e.cloud.Instances())
			}
		})
	}
}

// gitlab-runner#38716: a restarted manager orphaned (or deleted) the
// instances of the previous process. With state storage it adopts them,
// keeps their use counts, and removes those that held jobs at the crash.
func TestGitlabRunner38716_RestartAdoptsInstances(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep_instance_with_acquisitions=", keep), func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{CapacityPerInstance: 2, MaxUseCount: 10, Policies: []Policy{{IdleCount: 6, IdleTime: time.Hour}},
				StateStorage: StateStorage{Enabled: true, Dir: dir, KeepInstanceWithAcquisitions: keep}, Prediction: ptr(false)}
			e := newEnv(t, cfg)
			e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 6 })
			a := e.acquire("done")
			e.s.Release("done")
			held := e.acquire("running-at-crash")
			if held.InstanceID != a.InstanceID {
				t.Fatal("jobs on different instances")
			}
			e.step(1) // one more requested for idle_count, not yet listed
			before := e.cloud.Instances()
			crash(e.s)

			_, _, decBefore := e.group.snapshot()
			s2, err := New(e.ctx, e.group, cfg, Options{Clock: e.clock, Inline: true, DefaultLocation: time.UTC, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			e.s = s2
			e.step(3)
			_, _, dec := e.group.snapshot()
			dec = dec[len(decBefore):]
			if keep {
				if len(dec) != 0 {
					t.Fatalf("deleted %v after restart", dec)
				}
				in := s2.instances[held.InstanceID]
				if in == nil || in.uses != 2 || in.acquired != 0 {
					t.Fatalf("adopted instance %+v: want 2 uses kept, slots freed", in)
				}
			} else if len(dec) != 1 || dec[0] != held.InstanceID {
				t.Fatalf("deleted %v after restart, want only %s (it held a job at the crash)", dec, held.InstanceID)
			}
			for _, in := range before {
				if in.ID != held.InstanceID && s2.instances[in.ID] == nil {
					t.Errorf("instance %s not adopted", in.ID)
				}
			}
			if s2.instances[before[len(before)-1].ID].cause != "adopted" && s2.instances[before[len(before)-1].ID].cause != "requested" {
				t.Errorf("instance requested before the crash: cause %q", s2.instances[before[len(before)-1].ID].cause)
			}
			e.stepUntil(2*time.Minute, "ready again", func() bool { return e.s.Stats().ReadyFree >= 6 })
		})
	}
}

// crash abandons a scaler as a killed process would: its ledger lock goes,
// nothing else happens.
func crash(s *Scaler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ledger.Close()
	s.stopping = true
}

func TestRequestedBeforeCrashAdopted(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Policies: []Policy{{IdleCount: 2}}, StateStorage: StateStorage{Enabled: true, Dir: dir}}
	e := newEnv(t, cfg)
	e.step(1) // Increase accepted; Update has not listed them yet
	if e.group.increased != 2 || len(e.s.instances) != 0 {
		t.Fatalf("setup: increased %d, known %d", e.group.increased, len(e.s.instances))
	}
	crash(e.s)
	s2, err := New(e.ctx, e.group, cfg, Options{Clock: e.clock, Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	e.s = s2
	e.step(60)
	if _, inc, dec := e.group.snapshot(); inc != 2 || len(dec) != 0 || s2.Stats().ReadyFree != 2 {
		t.Fatalf("after restart: created %d, deleted %v, stats %+v", inc, dec, s2.Stats())
	}
}

func TestTwoManagersCannotShareGroup(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Policies: []Policy{{IdleCount: 1}}, StateStorage: StateStorage{Enabled: true, Dir: dir, LeaseDuration: time.Minute}}
	e := newEnv(t, cfg, func(_ *fake.Config, _ *Config, o *Options) { o.Name, o.Owner = "runner-a", "host/a" })
	e.step(1)
	optsB := Options{Clock: e.clock, Inline: true, Name: "runner-b", Owner: "host/b"}
	if _, err := New(e.ctx, e.group, cfg, optsB); !errors.Is(err, ledger.ErrLeaseHeld) {
		t.Fatalf("second manager on the same group: %v", err)
	}
	// a stops renewing (hung, or crashed); after the lease b takes over.
	e.clock.Advance(61 * time.Second)
	b, err := New(e.ctx, e.group, cfg, optsB)
	if err != nil {
		t.Fatalf("after the lease expired: %v", err)
	}
	_, createdBefore, _ := e.group.snapshot()
	// a wakes up: it must not scale any more.
	e.s.SetPolicies([]Policy{{IdleCount: 5}})
	e.s.Tick(e.ctx)
	if err := e.s.Reserve("x"); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Reserve on a manager that lost the lease: %v", err)
	}
	if _, created, dec := e.group.snapshot(); created != createdBefore || len(dec) != 0 {
		t.Fatalf("manager without the lease scaled: created %d (was %d), deleted %v", created, createdBefore, dec)
	}
	if err := b.Reserve("y"); errors.Is(err, ErrNotOwner) {
		t.Fatalf("the manager holding the lease refuses: %v", err)
	}
}

// An instance asked for just before a shutdown, not listed yet, is
// deleted too (berth up stopped right after its start left one running).
func TestShutdownDeletesInstancesAskedForButNotListed(t *testing.T) {
	e := newEnv(t, Config{DeleteInstancesOnShutdown: true, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.s.Tick(e.ctx) // decides and asks for an instance; nothing listed yet
	if st := e.s.Stats(); st.Requested == 0 {
		t.Fatalf("no instance asked for: %+v", st)
	}
	defer e.passTimeForWaiters()()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.live(); n != 0 {
		_, _, dec := e.group.snapshot()
		t.Fatalf("%d instances left after shutdown (decreased %v)", n, dec)
	}
}

// passTimeForWaiters advances the clock a second whenever something waits
// on it (a shutdown's pauses), until the returned stop is called.
func (e *env) passTimeForWaiters() (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if e.clock.waiters() > 0 {
				e.clock.Advance(time.Second)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	return func() { close(done) }
}
