package taskscaler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/plugins/fake"
)

func TestSlotsStableAndReusedLowestFirst(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 3, Policies: []Policy{{IdleCount: 3}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 3 })
	a := e.acquire("a")
	b := e.acquire("b")
	c := e.acquire("c")
	if a.Slot != 0 || b.Slot != 1 || c.Slot != 2 || a.InstanceID != b.InstanceID || b.InstanceID != c.InstanceID {
		t.Fatalf("slots %d %d %d on %s %s %s", a.Slot, b.Slot, c.Slot, a.InstanceID, b.InstanceID, c.InstanceID)
	}
	if a.ConnectInfo.ID != a.InstanceID || a.ConnectInfo.InternalAddr == "" {
		t.Errorf("ConnectInfo %+v", a.ConnectInfo)
	}
	if err := e.s.Release("b"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release("a"); err != nil {
		t.Fatal(err)
	}
	d := e.acquire("d")
	if d.Slot != 0 || d.InstanceID != a.InstanceID || d.Use != 4 {
		t.Errorf("after releasing 1 and 0: slot %d use %d, want slot 0 use 4", d.Slot, d.Use)
	}
	if got := e.acquire("e"); got.Slot != 1 {
		t.Errorf("next slot %d, want 1", got.Slot)
	}
	if _, _, err := e.s.TryAcquire("d"); !errors.Is(err, ErrKeyInUse) {
		t.Errorf("acquiring a held key: %v", err)
	}
	if err := e.s.Release("nope"); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("releasing an unknown key: %v", err)
	}
}

func TestAcquireWaitsForReadyInstance(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2})
	if err := e.s.Reserve("job"); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Acquisition)
	go func() {
		a, err := e.s.Acquire(e.ctx, "job")
		if err != nil {
			t.Error(err)
		}
		got <- a
	}()
	for i := 0; ; i++ {
		select {
		case a := <-got:
			if a == nil || a.Slot != 0 {
				t.Fatalf("acquired %+v", a)
			}
			if e.group.increased != 1 {
				t.Errorf("%d instances created for one job", e.group.increased)
			}
			return
		default:
		}
		if i > 120 {
			t.Fatal("no slot after 120s of virtual time with a 30s boot")
		}
		e.step(1)
		time.Sleep(time.Millisecond) // let the waiting Acquire look
	}
}

func TestAcquireTimeout(t *testing.T) {
	e := newEnv(t, Config{InstanceAcquireTimeout: time.Minute, MaxInstances: 1}, withBoot(time.Hour))
	done := make(chan error)
	go func() {
		_, err := e.s.Acquire(e.ctx, "job")
		done <- err
	}()
	for e.clock.waiters() == 0 {
		time.Sleep(time.Millisecond)
	}
	e.clock.Advance(time.Minute)
	if err := <-done; !errors.Is(err, ErrAcquireTimeout) {
		t.Fatalf("Acquire = %v, want ErrAcquireTimeout", err)
	}
	if st := e.s.Stats(); st.Reserved != 0 {
		t.Errorf("reservation kept after a failed Acquire: %+v", st)
	}
}

func TestAcquireCancelled(t *testing.T) {
	e := newEnv(t, Config{}, withBoot(time.Hour))
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := e.s.Acquire(ctx, "job"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire = %v", err)
	}
}

func TestReserveRespectsMaxInstances(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, MaxInstances: 2})
	for i, k := range []string{"a", "b", "c", "d"} {
		if h := e.s.Headroom(); h != 4-i {
			t.Errorf("Headroom before reservation %d: %d, want %d", i+1, h, 4-i)
		}
		if err := e.s.Reserve(k); err != nil {
			t.Fatalf("Reserve(%s): %v", k, err)
		}
	}
	if h := e.s.Headroom(); h != 0 {
		t.Errorf("Headroom with every slot reserved: %d, want 0", h)
	}
	if err := e.s.Reserve("e"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("fifth reservation with 2×2 slots: %v", err)
	}
	e.s.Unreserve("d")
	if h := e.s.Headroom(); h != 1 {
		t.Errorf("Headroom after an Unreserve: %d, want 1", h)
	}
	if err := e.s.Reserve("e"); err != nil {
		t.Fatalf("after Unreserve: %v", err)
	}
	if err := e.s.Reserve("e"); err != nil {
		t.Fatalf("reserving again is idempotent: %v", err)
	}
}

// TestHeadroomUnbounded: without max_instances nor a preemptive policy
// nothing bounds the reservations.
func TestHeadroomUnbounded(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2})
	if h := e.s.Headroom(); h != -1 {
		t.Fatalf("Headroom without bounds: %d, want -1", h)
	}
}

func TestMaxUseCountRemovedWhenLastJobReleases(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, MaxUseCount: 2, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 2 })
	a, b := e.acquire("a"), e.acquire("b")
	if a.InstanceID != b.InstanceID {
		t.Fatal("two jobs on two instances")
	}
	e.s.Release("a")
	e.step(3)
	if _, _, dec := e.group.snapshot(); len(dec) != 0 {
		t.Fatalf("removed with a job still running: %v", dec)
	}
	e.s.Release("b")
	e.step(1)
	if _, _, dec := e.group.snapshot(); len(dec) != 1 || dec[0] != a.InstanceID {
		t.Fatalf("decreased %v one tick after the last release, want [%s]", dec, a.InstanceID)
	}
}

func TestFailureThresholdReplacesInstance(t *testing.T) {
	e := newEnv(t, Config{FailureThreshold: 2, Policies: []Policy{{IdleCount: 1, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 1 })
	first := ""
	for i, k := range []string{"a", "b"} {
		a := e.acquire(k)
		first = a.InstanceID
		e.s.ReportFailure(k, errors.New("ssh: connection refused"))
		e.s.Release(k)
		if i == 0 && e.s.Stats().ReadyFree != 1 {
			t.Fatal("one failure made the instance unusable")
		}
	}
	if st := e.s.Stats(); st.ReadyFree != 0 {
		t.Fatalf("unhealthy instance still offers slots: %+v", st)
	}
	e.step(1)
	if _, _, dec := e.group.snapshot(); len(dec) != 1 || dec[0] != first {
		t.Fatalf("decreased %v, want the unhealthy %s", dec, first)
	}
	e.stepUntil(2*time.Minute, "replaced", func() bool { return e.s.Stats().ReadyFree == 1 })
	if a := e.acquire("c"); a.InstanceID == first {
		t.Fatal("job placed on the unhealthy instance")
	}
}

func TestSuccessResetsFailures(t *testing.T) {
	e := newEnv(t, Config{FailureThreshold: 2, Policies: []Policy{{IdleCount: 1, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 1 })
	for i, k := range []string{"a", "b", "c", "d"} {
		e.acquire(k)
		if i%2 == 0 {
			e.s.ReportFailure(k, errors.New("flaky"))
		}
		e.s.Release(k)
	}
	if e.s.Stats().ReadyFree != 1 {
		t.Fatal("non-consecutive failures made the instance unhealthy")
	}
}

func TestAcquireHeartbeatSkipsUnhealthyInstance(t *testing.T) {
	e := newEnv(t, Config{AcquireHeartbeats: true, FailureThreshold: 1, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 2 })
	bad := e.s.order[0].id
	if err := e.cloud.SetUnhealthy(bad, true); err != nil {
		t.Fatal(err)
	}
	a, err := e.s.Acquire(e.ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if a.InstanceID == bad || a.Use != 1 {
		t.Fatalf("acquired %s (use %d); %s failed its heartbeat", a.InstanceID, a.Use, bad)
	}
	if e.s.instances[bad].uses != 0 {
		t.Error("failed heartbeat counted as a use")
	}
}

func TestLostInstanceTellsItsJobs(t *testing.T) {
	e := newEnv(t, Config{Policies: []Policy{{IdleCount: 1}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 1 })
	a := e.acquire("a")
	e.cloud.Vanish(a.InstanceID)
	e.clock.Advance(time.Minute) // an Update is due
	e.s.Tick(e.ctx)
	select {
	case <-a.Lost():
	default:
		t.Fatal("job not told its instance vanished")
	}
	if err := e.s.Release("a"); err != nil {
		t.Fatalf("releasing a lost slot: %v", err)
	}
}

func TestReadyUpRetriesThenSucceeds(t *testing.T) {
	var calls atomic.Int32
	r := ReadierFunc(func(ctx context.Context, info fleeting.ConnectInfo) error {
		if calls.Add(1) <= 2 {
			return errors.New("cloud-init not done")
		}
		return nil
	})
	e := newEnv(t, Config{InstanceReadyRetries: 2, Policies: []Policy{{IdleCount: 1}}}, withReadier(r))
	e.stepUntil(3*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 1 })
	if calls.Load() != 3 {
		t.Errorf("ready command ran %d times, want 3", calls.Load())
	}
	if _, inc, dec := e.group.snapshot(); inc != 1 || len(dec) != 0 {
		t.Errorf("retries churned instances: created %d, deleted %v", inc, dec)
	}
}

func TestReadyUpBackoffGrows(t *testing.T) {
	var prev time.Duration
	for k := 1; k <= 12; k++ {
		b := backoff(k)
		if b < prev || b > 10*time.Minute {
			t.Fatalf("backoff(%d) = %s after %s", k, b, prev)
		}
		prev = b
	}
	if backoff(1) != 15*time.Second || backoff(2) != 30*time.Second || backoff(0) != 0 {
		t.Errorf("backoff(1), (2), (0) = %s %s %s", backoff(1), backoff(2), backoff(0))
	}
}

func TestScaleThrottle(t *testing.T) {
	e := newEnv(t, Config{ScaleThrottle: ScaleThrottle{Limit: 0.5, Burst: 2}, Policies: []Policy{{IdleCount: 10}}})
	e.step(1)
	if _, inc, _ := e.group.snapshot(); inc != 2 {
		t.Fatalf("first tick created %d, want the burst 2", inc)
	}
	e.step(4)
	if _, inc, _ := e.group.snapshot(); inc != 4 {
		t.Fatalf("after 4 more seconds at 0.5/s: %d, want 4", inc)
	}
	e.step(30)
	if _, inc, _ := e.group.snapshot(); inc != 10 {
		t.Fatalf("eventually %d, want 10", inc)
	}
}

func TestDeletionRetried(t *testing.T) {
	e := newEnv(t, Config{DeletionRetryInterval: time.Minute, Policies: []Policy{{IdleCount: 0, IdleTime: time.Second}}})
	e.s.TryAcquire("a") // a job waits for a slot
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 1 })
	e.acquire("a")
	e.group.decreaseNone = true
	e.s.Release("a")
	e.step(3)
	if _, _, dec := e.group.snapshot(); len(dec) != 1 {
		t.Fatalf("decreased %v, want one call", dec)
	}
	e.step(30)
	if _, _, dec := e.group.snapshot(); len(dec) != 1 {
		t.Fatalf("retried before deletion_retry_interval: %v", dec)
	}
	e.group.decreaseNone = false
	e.step(35)
	if _, _, dec := e.group.snapshot(); len(dec) != 2 {
		t.Fatalf("not retried after deletion_retry_interval: %v", dec)
	}
	e.stepUntil(2*time.Minute, "deleted", func() bool { return len(e.cloud.Instances()) == 0 })
}

func TestCreatingTimeout(t *testing.T) {
	e := newEnv(t, Config{InstanceCreatingTimeout: 5 * time.Minute, Policies: []Policy{{IdleCount: 1}}}, withBoot(time.Hour))
	e.step(5*60 + 2)
	_, inc, dec := e.group.snapshot()
	if len(dec) != 1 {
		t.Fatalf("instance stuck creating not removed: decreased %v", dec)
	}
	if inc != 1 {
		t.Fatalf("replaced at once (created %d): the backoff should hold", inc)
	}
	e.step(20)
	if _, inc, _ := e.group.snapshot(); inc != 2 {
		t.Fatalf("not replaced after the backoff: created %d", inc)
	}
}

func TestHotReloadPolicies(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, Policies: []Policy{{IdleCount: 2}}})
	e.step(2)
	if _, inc, _ := e.group.snapshot(); inc != 1 {
		t.Fatalf("created %d, want 1", inc)
	}
	if err := e.s.SetPolicies([]Policy{{Periods: []string{"not cron"}}}); err == nil {
		t.Fatal("invalid policy accepted")
	}
	if err := e.s.SetPolicies([]Policy{{IdleCount: 6}}); err != nil {
		t.Fatal(err)
	}
	e.step(1)
	if _, inc, _ := e.group.snapshot(); inc != 3 {
		t.Fatalf("after reload: created %d, want 3", inc)
	}
}

func TestPreexistingInstancesRemovedWithoutState(t *testing.T) {
	e := newEnv(t, Config{})
	e.cloud.Increase(e.ctx, 2)
	// A new scaler on the same cloud: it has no state, so the instances
	// are not its own.
	s, err := New(e.ctx, e.group, Config{}, Options{Clock: e.clock, Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Tick(e.ctx)
	if _, _, dec := e.group.snapshot(); len(dec) != 2 {
		t.Fatalf("decreased %v, want both pre-existing instances", dec)
	}
}

func TestDecisionsLoggedAndCounted(t *testing.T) {
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	clockEnv := newEnv(t, Config{}) // only for its clock and cloud
	s, err := New(context.Background(), clockEnv.group, Config{Policies: []Policy{{IdleCount: 1}}}, Options{
		Clock: clockEnv.clock, Inline: true, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	clockEnv.s = s
	clockEnv.step(1)
	out := buf.String()
	if !strings.Contains(out, "msg=decision") || !strings.Contains(out, "outcome=scale_up") || !strings.Contains(out, "need 1 free slots, have 0") {
		t.Errorf("decision not logged with reasons:\n%s", out)
	}
	if n := value(t, s.m.decisions.WithLabelValues("scale_up")); n != 1 {
		t.Errorf("scale_up decisions %v", n)
	}
	if n := value(t, s.m.requested); n != 1 {
		t.Errorf("scale_ups_total %v", n)
	}
	clockEnv.stepUntil(2*time.Minute, "ready", func() bool { return s.Stats().ReadyFree == 1 })
	var m dto.Metric
	if err := s.m.readyUp.Write(&m); err != nil || m.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("ready-up histogram %v, %v", m.GetHistogram(), err)
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) == 0 {
		t.Errorf("registry gathers %d families, %v", len(mfs), err)
	}
	if g := value(t, s.m.instances.WithLabelValues("ready")); g != 1 {
		t.Errorf("ready instances gauge %v", g)
	}
	// A second scaler on the same registry needs its own label.
	if _, err := New(context.Background(), clockEnv.group, Config{}, Options{Clock: clockEnv.clock, Registerer: reg}); err == nil {
		t.Error("duplicate registration not reported")
	}
}

func TestRunAndShutdown(t *testing.T) {
	e := newEnv(t, Config{Policies: []Policy{{IdleCount: 1}}})
	done := make(chan error)
	go func() { done <- e.s.Run(e.ctx) }()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := e.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if err := e.s.Reserve("x"); !errors.Is(err, ErrStopping) {
		t.Fatalf("Reserve after Shutdown: %v", err)
	}
	if calls, _, _ := e.group.snapshot(); calls[len(calls)-1] != "shutdown" {
		t.Fatalf("calls %v", calls)
	}
}

func TestDecodeConfig(t *testing.T) {
	c, unknown, err := DecodeConfig(`
plugin = "fleeting-plugin-aws"
capacity_per_instance = 4
max_use_count = 10
max_instances = 20
instance_acquire_timeout = "2m"
update_interval = "30s"
typo_key = 1
[plugin_config]
region = "eu-west-1"
[connector_config]
username = "ec2-user"
timeout = "10s"
[scale_throttle]
limit = 2
[state_storage]
enabled = true
[[policy]]
idle_count = 8
idle_time = "20m"
[[policy]]
periods = ["* 0-7,19-23 * * mon-fri", "* * * * sat,sun"]
timezone = "Europe/Berlin"
idle_count = 0
scale_factor = 0.5
scale_factor_limit = 4
preemptive_mode = true
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 1 || unknown[0] != "runners.autoscaler.typo_key" {
		t.Errorf("unknown keys %v", unknown)
	}
	if c.CapacityPerInstance != 4 || c.MaxUseCount != 10 || c.InstanceAcquireTimeout != 2*time.Minute ||
		c.UpdateInterval != 30*time.Second || c.UpdateIntervalWhenExpecting != DefaultUpdateIntervalWhenExpecting ||
		c.ConnectorConfig.Timeout != 10*time.Second || c.ScaleThrottle.Limit != 2 || c.ScaleThrottle.Burst != 20 ||
		!c.StateStorage.Enabled || c.StateStorage.Dir != ".taskscaler" || c.FailureThreshold != 3 {
		t.Errorf("decoded %+v", c)
	}
	if len(c.Policies) != 2 || c.Policies[0].IdleTime != 20*time.Minute || !c.Policies[0].Preemptive() ||
		c.Policies[1].IdleTime != DefaultIdleTime || !c.Policies[1].Preemptive() || c.Policies[1].ScaleFactor != 0.5 {
		t.Errorf("policies %+v", c.Policies)
	}
	if c.PluginConfig["region"] != "eu-west-1" {
		t.Errorf("plugin_config %v", c.PluginConfig)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		toml, key string
	}{
		{"max_use_count = -1", "max_use_count"},
		{"max_instances = -2", "max_instances"},
		{"[scale_throttle]\nlimit = -2", "scale_throttle.limit"},
		{"[connector_config]\nprotocol = \"telnet\"", "connector_config.protocol"},
		{"[[policy]]\nperiods = [\"* * *\"]", "policy[0]"},
		{"[[policy]]\ntimezone = \"Mars/Olympus\"", "policy[0]"},
		{"[[policy]]\nidle_count = -1", "policy[0]"},
		{"[[policy]]\nscale_factor = -1.0", "policy[0]"},
		{"prediction_spare = \"lots\"", "prediction_spare"},
	} {
		_, _, err := DecodeConfig(tc.toml)
		if err == nil || !strings.Contains(err.Error(), "runners.autoscaler."+tc.key) {
			t.Errorf("%q: error %v, want one naming %s", tc.toml, err, tc.key)
		}
	}
	for _, spare := range []string{"", "poisson", "measured"} {
		if _, _, err := DecodeConfig("prediction_spare = \"" + spare + "\""); err != nil {
			t.Errorf("prediction_spare %q: %v", spare, err)
		}
	}
	if _, _, err := DecodeConfig("[[policy]]\nidle_time = \"10ms\""); err != nil {
		t.Errorf("short idle_time is raised to 1s, not refused: %v", err)
	}
}

func TestPreemptiveDefault(t *testing.T) {
	if (Policy{IdleCount: 1}).Preemptive() != true || (Policy{}).Preemptive() != false ||
		(Policy{IdleCount: 3, PreemptiveMode: ptr(false)}).Preemptive() != false || (Policy{PreemptiveMode: ptr(true)}).Preemptive() != true {
		t.Error("preemptive_mode default is not 'idle_count > 0'")
	}
}

// value reads a counter or gauge.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// TestAcquireOldestInstanceFirst checks the placement rule after any
// release: the lowest free slot of the oldest instance with one.
func TestAcquireOldestInstanceFirst(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, Policies: []Policy{{IdleCount: 6, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 6 })
	var ids []string
	for _, in := range e.s.order {
		ids = append(ids, in.id)
	}
	place := map[string]string{}
	for i := range 6 {
		a := e.acquire(fmt.Sprint("j", i))
		place[a.Key] = fmt.Sprintf("%s/%d", a.InstanceID, a.Slot)
		if want := fmt.Sprintf("%s/%d", ids[i/2], i%2); place[a.Key] != want {
			t.Fatalf("job %d on %s, want %s", i, place[a.Key], want)
		}
	}
	for _, step := range []struct{ release, want string }{
		{"j3", ids[1] + "/1"}, // the middle instance's slot 1
		{"j0", ids[0] + "/0"}, // then the oldest's slot 0
		{"j5", ids[2] + "/1"},
	} {
		e.s.Release(step.release)
		a := e.acquire("again-" + step.release)
		if got := fmt.Sprintf("%s/%d", a.InstanceID, a.Slot); got != step.want {
			t.Fatalf("after releasing %s: placed on %s, want %s", step.release, got, step.want)
		}
	}
}

func TestUnhealthyStaysUnhealthy(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, FailureThreshold: 1, Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 2 })
	e.acquire("good")
	bad := e.acquire("bad")
	e.s.ReportFailure("bad", errors.New("docker daemon gone"))
	e.s.Release("bad")
	e.s.Release("good") // a job that went well does not make it healthy again
	e.step(1)
	if _, _, dec := e.group.snapshot(); len(dec) != 1 || dec[0] != bad.InstanceID {
		t.Fatalf("decreased %v, want the unhealthy %s", dec, bad.InstanceID)
	}
}

// TestRunWithGoroutines runs the scaler as the runner will: Run in its own
// goroutine, ready-ups in goroutines, a blocking Acquire.
func TestRunWithGoroutines(t *testing.T) {
	var readied atomic.Int32
	e := newEnv(t, Config{CapacityPerInstance: 2}, withReadier(ReadierFunc(func(ctx context.Context, info fleeting.ConnectInfo) error {
		readied.Add(1)
		return nil
	})), func(_ *fake.Config, _ *Config, o *Options) { o.Inline = false })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runDone := make(chan error)
	go func() { runDone <- e.s.Run(ctx) }()
	got := make(chan error, 2)
	for _, k := range []string{"a", "b"} {
		go func() {
			a, err := e.s.Acquire(ctx, k)
			if err == nil && a.Slot > 1 {
				err = fmt.Errorf("slot %d", a.Slot)
			}
			got <- err
		}()
	}
	for done := 0; done < 2; {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			done++
		case <-ctx.Done():
			t.Fatal("no slots (real-time bound hit)")
		default:
			if e.clock.waiters() > 0 {
				e.clock.Advance(time.Second)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	if readied.Load() != 1 {
		t.Errorf("%d ready-ups for one instance", readied.Load())
	}
	e.s.Release("a")
	e.s.Release("b")
	if err := e.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
}

// TestQueuedDemandScalesAndGoesStale: jobs the coordinator reports waiting
// make the scaler provision before any reservation exists; a report that
// is not renewed stops counting, and the idle instances go after idle_time.
func TestQueuedDemandScalesAndGoesStale(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, Policies: []Policy{{IdleTime: time.Minute}}})
	e.s.SetQueued(5, 10*time.Second)
	e.step(1)
	if n := e.live(); n != 3 {
		t.Fatalf("%d instances for 5 queued jobs at 2 slots each, want 3", n)
	}
	e.step(15) // the report is stale now; nothing more is asked
	if n := e.live(); n != 3 {
		t.Fatalf("%d instances after the report went stale, want the 3 asked", n)
	}
	e.stepUntil(5*time.Minute, "scaled back to zero", func() bool { return e.live() == 0 })
}

// poller is one request loop of a runner against a coordinator that has
// no job for it: it reserves before each long poll of every, gives the
// reservation back when the poll ends empty and polls again at once, as
// runner.Manager does against a long-polling coordinator.
type poller struct {
	e     *env
	every time.Duration
	n     int
	key   string
	until time.Time
}

// poll ends the current poll when it is over and starts the next.
func (p *poller) poll() {
	p.e.t.Helper()
	now := p.e.clock.Now()
	if p.key != "" && now.Before(p.until) {
		return
	}
	if p.key != "" {
		p.e.s.Unreserve(p.key)
	}
	p.n++
	p.key = fmt.Sprintf("poll-%d", p.n)
	if err := p.e.s.Reserve(p.key); err != nil {
		p.e.t.Fatalf("Reserve(%s): %v", p.key, err)
	}
	p.until = now.Add(p.every)
}

// TestPollingRunnerLetsTheFleetGoToZero: a runner holds a reservation
// through each long poll for a job. That reservation is not demand: with
// idle_count 0 no instance is made for it, and once the jobs that came are
// done the fleet goes back to zero after idle_time while the runner keeps
// polling, with prediction on and off.
func TestPollingRunnerLetsTheFleetGoToZero(t *testing.T) {
	for _, prediction := range []bool{false, true} {
		t.Run(fmt.Sprint("prediction=", prediction), func(t *testing.T) {
			e := newEnv(t, Config{CapacityPerInstance: 2, Prediction: ptr(prediction), Policies: []Policy{{IdleTime: time.Minute}}})
			p := &poller{e: e, every: 10 * time.Second}
			tick := func() {
				t.Helper()
				p.poll()
				e.step(1)
			}
			for range 5 * 60 {
				tick()
			}
			if _, created, _ := e.group.snapshot(); created != 0 {
				t.Fatalf("%d instances made for a runner polling without a job (stats %+v)", created, e.s.Stats())
			}
			// Four jobs come; the runner's other request loops got them.
			jobs := keys("job", 4)
			for _, k := range jobs {
				if err := e.s.Reserve(k); err != nil {
					t.Fatal(err)
				}
			}
			for placed, i := 0, 0; placed < len(jobs); i++ {
				if i > 2*60 {
					t.Fatalf("jobs not placed after 2m (stats %+v)", e.s.Stats())
				}
				placed = 0
				for _, k := range jobs {
					if _, ok, err := e.s.TryAcquire(k); err == nil && ok {
						placed++
					} else if errors.Is(err, ErrKeyInUse) {
						placed++
					}
				}
				tick()
			}
			for range 2 * 60 {
				tick()
			}
			for _, k := range jobs {
				if err := e.s.Release(k); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; e.live() > 0; i++ {
				if i > 2*60 {
					t.Fatalf("2m after the jobs, idle_time 1m: %d instances left while the runner polls (stats %+v)", e.live(), e.s.Stats())
				}
				tick()
			}
			_, created, _ := e.group.snapshot()
			for range 10 * 60 {
				tick()
			}
			if _, again, _ := e.group.snapshot(); again != created || e.live() != 0 {
				t.Fatalf("10m of polling after scaling to zero: %d instances made (were %d), %d live", again, created, e.live())
			}
		})
	}
}

// TestClaimedReservationKeepsItsInstance: once the runner has a job for a
// reservation (Claim) it is demand, before the job asks for its slot: the
// idle instance it will run on does not go while the job is acknowledged
// and its secrets resolved, however long that takes. Unclaimed, the same
// reservation lets the instance go after idle_time.
func TestClaimedReservationKeepsItsInstance(t *testing.T) {
	for _, claim := range []bool{false, true} {
		t.Run(fmt.Sprint("claim=", claim), func(t *testing.T) {
			e := newEnv(t, Config{CapacityPerInstance: 1, Policies: []Policy{{IdleTime: time.Minute}}})
			jobs := e.runJobs(2*time.Minute, "first")
			if err := e.s.Release(jobs[0].Key); err != nil {
				t.Fatal(err)
			}
			if err := e.s.Reserve("next"); err != nil { // the runner asks for the next job
				t.Fatal(err)
			}
			e.step(30)
			if claim {
				e.s.Claim("next") // and gets one
			}
			e.step(60) // idle_time passes before the job asks for its slot
			_, ok, err := e.s.TryAcquire("next")
			if err != nil || ok != claim {
				t.Fatalf("claimed %v: TryAcquire after idle_time = %v, %v (stats %+v)", claim, ok, err, e.s.Stats())
			}
		})
	}
}

func TestPeakWindow(t *testing.T) {
	var w peakWindow
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []struct{ s, n, want int }{
		{0, 1, 1}, {1, 0, 1}, {5, 3, 3}, {6, 2, 3}, {9, 0, 3},
		{16, 0, 2}, // 3 (at 5 s) left the 10 s window, 2 (at 6 s) is in it
		{17, 0, 0}, {18, 4, 4}, {30, 1, 1},
	}
	for _, st := range steps {
		if got := w.peak(at(st.s), st.n, 10*time.Second); got != st.want {
			t.Fatalf("at %d s adding %d: peak %d, want %d", st.s, st.n, got, st.want)
		}
	}
	if len(w.q) > 2 {
		t.Errorf("the window holds %d entries for 2 distinct recent counts", len(w.q))
	}
}
