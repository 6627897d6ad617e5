package taskscaler

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/taskscaler/forecast"
)

// With prediction on, the scaler measures its own boot latency, and its
// model survives a restart beside the ledger.
func TestPredictionMeasuresBootsAndPersists(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{CapacityPerInstance: 2, Prediction: ptr(true), Policies: []Policy{{IdleCount: 2, IdleTime: time.Minute}},
		StateStorage: StateStorage{Enabled: true, Dir: dir}}
	e := newEnv(t, cfg, func(f *fake.Config, _ *Config, _ *Options) { f.BootLatency = fake.Fixed(20 * time.Second) })
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 2 })
	e.s.mu.Lock()
	boot := e.s.model.BootLatency()
	e.s.mu.Unlock()
	// Requested at a tick, listed and readied on later ticks: 20-23 s.
	if boot < 20*time.Second || boot > 23*time.Second {
		t.Fatalf("measured boot latency %s, want about the fake's 20s", boot)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fake%2Ffake", "forecast")
	m := forecast.New(time.UTC)
	if found, err := m.Load(path); !found || err != nil {
		t.Fatalf("forecast not saved at shutdown: %v %v", found, err)
	}
	if m.BootLatency() != boot {
		t.Fatalf("saved boot latency %s, want %s", m.BootLatency(), boot)
	}
	// A damaged state file does not stop a start: it learns afresh.
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, cfg)
	e2.s.mu.Lock()
	fresh := e2.s.model.BootLatency()
	e2.s.mu.Unlock()
	if fresh != forecast.DefaultBootLatency {
		t.Fatalf("after a damaged state file the boot latency is %s, want a fresh model's %s", fresh, forecast.DefaultBootLatency)
	}
}

// Packing puts a job on the fullest instance with room; without it, on
// the oldest.
func TestPackingRoutesToTheFullestInstance(t *testing.T) {
	for _, packing := range []bool{true, false} {
		t.Run(fmt.Sprint("packing=", packing), func(t *testing.T) {
			e := newEnv(t, Config{CapacityPerInstance: 4, Packing: ptr(packing), ScaleThrottle: ScaleThrottle{Limit: -1},
				Policies: []Policy{{IdleCount: 8, IdleTime: time.Hour, PreemptiveMode: ptr(false)}}})
			e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 8 })
			// Both full, then the oldest keeps 1 job and the newer 3.
			for i := range 8 {
				e.acquire(fmt.Sprint("j", i))
			}
			old := e.s.order[0].id
			freedOld, freedNew := 0, 0
			for i := range 8 {
				k := fmt.Sprint("j", i)
				switch on := e.s.acquisitions[k].InstanceID; {
				case on == old && freedOld < 3:
					freedOld++
				case on != old && freedNew < 1:
					freedNew++
				default:
					continue
				}
				if err := e.s.Release(k); err != nil {
					t.Fatal(err)
				}
			}
			a := e.acquire("probe")
			if got := a.InstanceID != old; got != packing {
				t.Fatalf("packing=%v: the job went to %s; the oldest, %s, holds 1 job, the other 3", packing, a.InstanceID, old)
			}
		})
	}
}

// TestForecastDoesNotLearnPolls: the demand the model learns is jobs, not
// the reservations a runner holds while it asks for them. A burst of 6
// jobs seen yesterday at 12:10 is provisioned today as 6 slots a boot
// ahead, not 7 for the reservation of a runner that polled all day.
func TestForecastDoesNotLearnPolls(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, Prediction: ptr(true), Policies: []Policy{{IdleTime: time.Minute}}})
	p := &poller{e: e, every: 10 * time.Second}
	burst, done := t0.Add(10*time.Minute), t0.Add(15*time.Minute)
	jobs := keys("job", 6)
	// Ten-second steps: every decision sees the runner's reservation.
	for now := e.clock.Now(); now.Before(t0.Add(24*time.Hour + 9*time.Minute + 30*time.Second)); now = e.clock.Now() {
		switch {
		case now.Equal(burst):
			for _, k := range jobs {
				if err := e.s.Reserve(k); err != nil {
					t.Fatal(err)
				}
			}
		case now.After(burst) && now.Before(done):
			for _, k := range jobs {
				e.s.TryAcquire(k) // ErrKeyInUse once it holds a slot
			}
		case now.Equal(done):
			for _, k := range jobs {
				if err := e.s.Release(k); err != nil {
					t.Fatalf("the jobs did not get slots in 5m: %v (stats %+v)", err, e.s.Stats())
				}
			}
		}
		p.poll()
		e.clock.Advance(10 * time.Second)
		e.s.Tick(e.ctx)
	}
	e.s.mu.Lock()
	boot := e.s.model.BootLatency()
	c, _ := e.s.model.Predict(e.clock.Now(), 0, boot, boot)
	e.s.mu.Unlock()
	if c.Rise == 0 || c.Peak != 6 {
		t.Fatalf("Tuesday %s, boot %s: prediction %+v, want yesterday's 6 jobs at 12:10 and nothing for the polls", e.clock.Now().Format("15:04:05"), boot, c)
	}
}

// TestPredictionLetsABurstGoWithIdleTime is the instance executor's
// end-to-end test in virtual time: 12 jobs of a few seconds at the end of
// a minute, capacity 2, idle_time 2s. Once they are done the fleet goes
// to zero and stays there: the minute of their arrivals, learned after
// they ended, neither keeps nor makes an instance for arrivals that
// stopped one idle_time before.
func TestPredictionLetsABurstGoWithIdleTime(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, MaxInstances: 6, Prediction: ptr(true), Policies: []Policy{{IdleTime: 2 * time.Second}}},
		withBoot(time.Second))
	e.step(50) // 12:00:50
	jobs := e.runJobs(time.Minute, keys("j", 12)...)
	e.step(3)
	for _, a := range jobs {
		if err := e.s.Release(a.Key); err != nil {
			t.Fatal(err)
		}
	}
	e.stepUntil(10*time.Second, "back to zero", func() bool { return e.live() == 0 })
	_, created, _ := e.group.snapshot()
	e.step(3 * 60)
	if _, again, _ := e.group.snapshot(); again != created || e.live() != 0 {
		t.Fatalf("after the burst: %d instances made (were %d), %d live at %s", again, created, e.live(), e.clock.Now().Format("15:04:05"))
	}
}

// TestPreemptivePollsDoNotChurnInstances: with idle_count 1 (preemptive
// mode) a runner holds a ready slot through each poll and lets it go for
// a second between polls. With prediction on, that dip once removed the
// instance holding the idle slot and the next poll asked for it again: a
// new instance every few seconds with no job at all. The fleet settles
// instead.
func TestPreemptivePollsDoNotChurnInstances(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 1, MaxInstances: 4, Prediction: ptr(true),
		Policies: []Policy{{IdleCount: 1, IdleTime: 10 * time.Minute}}}, withBoot(time.Second))
	poll, n := "", 0
	var settled int // instances made in the first minute
	var removed []string
	for i := 0; i < 600; i++ {
		if i == 60 {
			_, settled, removed = e.group.snapshot()
		}
		switch {
		case i%3 == 0: // a poll starts (refused while no slot is ready)
			n++
			if e.s.Reserve(fmt.Sprintf("poll-%d", n)) == nil {
				poll = fmt.Sprintf("poll-%d", n)
			}
		case i%3 == 2 && poll != "": // it ends without a job
			e.s.Unreserve(poll)
			poll = ""
		}
		e.step(1)
	}
	// Until the first poll holds a slot the polls are refused, and the
	// scaler may let one of its first instances go: a start-up transient.
	// After it the fleet holds the poll's slot and the idle one.
	_, created, decreased := e.group.snapshot()
	if created != settled || len(decreased) != len(removed) || e.live() != 2 {
		t.Fatalf("9 minutes of polls after the first: %d instances made, %d removed, %d live; want none made or removed, 2 live",
			created-settled, len(decreased)-len(removed), e.live())
	}
}

// stuckGroup reports instances it was told to hold back as still creating,
// as a cloud whose instance never comes up.
type stuckGroup struct {
	fleeting.InstanceGroup
	mu    sync.Mutex
	known map[string]bool // seen before holding started
	hold  int             // how many new instances to hold back (-1: all, 0: none)
	held  map[string]bool
	// unlisted: held instances are not listed at all (a request the cloud
	// accepted and never fulfils), rather than listed as creating.
	unlisted bool
}

func (g *stuckGroup) Update(ctx context.Context, fn func(string, fleeting.State)) error {
	return g.InstanceGroup.Update(ctx, func(id string, st fleeting.State) {
		g.mu.Lock()
		if !g.known[id] && !g.held[id] && g.hold != 0 {
			g.held[id] = true
			g.hold--
		}
		held, unlisted := g.held[id], g.unlisted
		g.mu.Unlock()
		switch {
		case held && unlisted:
			return
		case held && st == fleeting.StateRunning:
			st = fleeting.StateCreating
		}
		fn(id, st)
	})
}

// holdNext makes the next n new instances (-1: every one) never run.
func (g *stuckGroup) holdNext(n int, cloud *fake.Group) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, in := range cloud.Instances() {
		g.known[in.ID] = true
	}
	g.hold = n
}

// stuckEnv is a prediction scaler (capacity 1, boots of 20 s) whose cloud
// can be told to hold instances back, after a first boot measured.
func stuckEnv(t *testing.T) (*env, *stuckGroup) {
	e := newEnv(t, Config{CapacityPerInstance: 1, Prediction: ptr(true), Policies: []Policy{{IdleTime: time.Minute}}},
		withBoot(20*time.Second))
	sg := &stuckGroup{InstanceGroup: e.group.InstanceGroup, known: map[string]bool{}, held: map[string]bool{}}
	e.group.InstanceGroup = sg
	for _, a := range e.runJobs(time.Minute, "first") {
		if err := e.s.Release(a.Key); err != nil {
			t.Fatal(err)
		}
	}
	e.stepUntil(2*time.Minute, "back to zero", func() bool { return e.live() == 0 })
	return e, sg
}

// With prediction, an instance still not ready twice the measured boot
// latency after its request stops counting as supply: a job waiting for
// it gets a replacement a minute on, not after instance_creating_timeout
// (10 minutes) and the backoff. The same when the cloud accepted the
// request and never lists the instance (an autoscaling group out of
// capacity).
func TestPredictionReplacesAStuckInstance(t *testing.T) {
	for _, unlisted := range []bool{false, true} {
		t.Run(fmt.Sprint("unlisted=", unlisted), func(t *testing.T) {
			e, sg := stuckEnv(t)
			sg.unlisted = unlisted
			sg.holdNext(-1, e.cloud)
			start := e.clock.Now()
			if err := e.s.Reserve("job"); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := e.s.TryAcquire("job"); ok || err != nil { // waits: demand
				t.Fatalf("TryAcquire: %v %v, want a wait", ok, err)
			}
			e.step(40) // what is asked for now never runs (or is never listed)
			if st := e.s.Stats(); unlisted && st.Requested == 0 {
				t.Fatalf("no request pending: %+v", st)
			}
			sg.holdNext(0, e.cloud)
			e.stepUntil(3*time.Minute, "placed", func() bool {
				_, ok, err := e.s.TryAcquire("job")
				if err != nil {
					t.Fatal(err)
				}
				return ok
			})
			if waited := e.clock.Now().Sub(start); waited > 2*time.Minute {
				t.Fatalf("the job waited %s for a slot", waited)
			}
		})
	}
}

// When nothing comes up at all, one replacement is made once the first
// instances are overdue, then none until instance_creating_timeout: not
// one per decision.
func TestPredictionOverdueInstancesInAnOutage(t *testing.T) {
	e, sg := stuckEnv(t)
	sg.holdNext(-1, e.cloud)
	if err := e.s.Reserve("job"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.s.TryAcquire("job"); ok || err != nil { // waits: demand
		t.Fatalf("TryAcquire: %v %v, want a wait", ok, err)
	}
	e.step(40) // the job's instance, and the forecast's spare, asked for
	_, asked, _ := e.group.snapshot()
	e.step(80)
	_, replaced, _ := e.group.snapshot()
	if n := value(t, e.s.m.overdue); n != 3 {
		t.Errorf("berth_taskscaler_instances_overdue %v, want 3 (the job's instance, the spare and the replacement)", n)
	}
	e.step(7 * 60)
	_, later, _ := e.group.snapshot()
	if replaced > asked+1 || later != replaced {
		t.Fatalf("with nothing coming up: %d instances asked in 40 s, %d in 2 minutes, %d in 9; want at most one more, then none",
			asked, replaced, later)
	}
}

// prediction_spare = "measured" sizes the spare the decisions use; both
// sizings are shown (berth_taskscaler_forecast_spare_slots) whichever is
// in use, so jobs that come 8 at a time show a measured spare above the
// Poisson one under either key.
func TestMeasuredSpareIsUsedAndShown(t *testing.T) {
	for _, spare := range []string{"", "measured"} {
		cfg := Config{CapacityPerInstance: 4, Prediction: ptr(true), PredictionSpare: spare,
			Policies: []Policy{{IdleTime: 5 * time.Minute}}}
		e := newEnv(t, cfg, func(f *fake.Config, _ *Config, _ *Options) { f.BootLatency = fake.Fixed(20 * time.Second) })
		// 8 jobs at once, at random moments a minute apart on average, for
		// 40 minutes; each for 2 minutes.
		r := rand.New(rand.NewPCG(1, 2))
		type job struct {
			key string
			end time.Time
		}
		var held []job
		next := e.clock.Now()
		for end := e.clock.Now().Add(40 * time.Minute); e.clock.Now().Before(end); {
			if now := e.clock.Now(); !now.Before(next) {
				for i := range 8 {
					key := fmt.Sprintf("job-%d-%d", now.Unix(), i)
					if err := e.s.Reserve(key); err != nil {
						t.Fatal(err)
					}
					held = append(held, job{key, now.Add(2 * time.Minute)})
				}
				next = now.Add(time.Duration(r.ExpFloat64() * float64(time.Minute)))
			}
			e.step(1)
			held = slices.DeleteFunc(held, func(j job) bool {
				if e.clock.Now().Before(j.end) {
					e.s.TryAcquire(j.key) // a waiting one takes a slot when one is ready
					return false
				}
				if err := e.s.Release(j.key); err != nil {
					t.Fatal(err)
				}
				return true
			})
		}
		poisson := value(t, e.s.m.spare.WithLabelValues("poisson"))
		measured := value(t, e.s.m.spare.WithLabelValues("measured"))
		if skill := value(t, e.s.m.riseSkill); skill != 1 { // no profile learned in 40 minutes: no rise judged
			t.Fatalf("berth_taskscaler_forecast_rise_skill %v, want 1", skill)
		}
		e.s.mu.Lock()
		p, _ := e.s.model.Predict(e.clock.Now(), len(held), e.s.model.BootLatency(), e.s.model.BootLatency())
		e.s.mu.Unlock()
		t.Logf("prediction_spare %q: Poisson %v, measured %v, used %v", spare, poisson, measured, p.Spare)
		want := poisson
		if spare == "measured" {
			want = measured
		}
		if measured <= poisson || measured < 8 || p.Spare != want || p.PoissonSpare != poisson || p.MeasuredSpare != measured {
			t.Fatalf("prediction_spare %q: gauges Poisson %v, measured %v; prediction %+v: want a measured spare of a group of 8 at least, used as configured",
				spare, poisson, measured, p)
		}
	}
}

// A job that ends on an instance that can take no more jobs
// (max_use_count) takes its slot with it, and the forecast counts it: of
// three jobs on an instance of 2 slots and 3 uses, the first gives its
// slot back (a use is left), the other two do not.
func TestReleaseCountsConsumedSlots(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 2, MaxUseCount: 3, Prediction: ptr(true), Policies: []Policy{{IdleCount: 2, IdleTime: time.Hour}}})
	e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree == 2 })
	// Start a fresh minute so that the three jobs fall in one.
	e.step(60 - e.clock.Now().Second())
	a, b := e.acquire("a"), e.acquire("b")
	if err := e.s.Release("a"); err != nil {
		t.Fatal(err)
	}
	if c := e.acquire("c"); c.InstanceID != a.InstanceID || b.InstanceID != a.InstanceID {
		t.Fatal("the three jobs are not on one instance")
	}
	for _, k := range []string{"b", "c"} {
		if err := e.s.Release(k); err != nil {
			t.Fatal(err)
		}
	}
	e.step(60) // the minute is learned
	e.s.mu.Lock()
	p, _ := e.s.model.Predict(e.clock.Now(), 0, time.Minute, time.Minute)
	e.s.mu.Unlock()
	// 3 arrivals and 2 slots consumed over the rate's window (idle_time,
	// an hour): 2/60 of a slot within a minute.
	if want := 2.0 / 60; math.Abs(p.Consumed-want) > 1e-9 {
		t.Fatalf("consumed %.4f slots within a minute, want %.4f (2 of 3 endings)", p.Consumed, want)
	}
}

// Boots longer than idle_time are warned about once (and not when
// idle_time covers them): with prediction the spare ends idle_time after
// the last arrival, so a job after a quiet spell waits a whole boot.
func TestWarnsWhenBootsOutlastIdleTime(t *testing.T) {
	for _, idle := range []time.Duration{10 * time.Second, time.Hour} {
		var logs bytes.Buffer
		var mu sync.Mutex
		e := newEnv(t, Config{CapacityPerInstance: 1, MaxUseCount: 1, Prediction: ptr(true), Policies: []Policy{{IdleCount: 1, IdleTime: idle}}},
			func(_ *fake.Config, _ *Config, o *Options) {
				o.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
			})
		for i := range 4 { // four instances booted (30 s each), each used once
			e.stepUntil(2*time.Minute, "ready", func() bool { return e.s.Stats().ReadyFree >= 1 })
			k := fmt.Sprint("j", i)
			e.acquire(k)
			if err := e.s.Release(k); err != nil {
				t.Fatal(err)
			}
		}
		e.step(120)
		mu.Lock()
		n := strings.Count(logs.String(), "boots take longer than idle_time")
		mu.Unlock()
		if want := map[bool]int{true: 1, false: 0}[idle < 30*time.Second]; n != want {
			t.Errorf("idle_time %s, boots of 30 s: warned %d times, want %d:\n%s", idle, n, want, logs.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The scaler tells the forecast how long each job held its slot, so the
// spare follows the jobs' length: 6 jobs a minute of 10 s each need less
// of one than 6 a minute of 10 minutes, which get the spare of jobs that
// outlast the boot.
func TestSpareFollowsTheJobsLength(t *testing.T) {
	spare := func(hold time.Duration) float64 {
		cfg := Config{CapacityPerInstance: 4, Prediction: ptr(true), Policies: []Policy{{IdleTime: 5 * time.Minute}}}
		e := newEnv(t, cfg, func(f *fake.Config, _ *Config, _ *Options) { f.BootLatency = fake.Fixed(45 * time.Second) })
		ends := map[string]time.Time{} // acquired: when it releases; zero: waiting
		for i := range 40 * 60 {
			if i%10 == 0 {
				key := fmt.Sprintf("job-%d", i)
				if err := e.s.Reserve(key); err != nil {
					t.Fatal(err)
				}
				ends[key] = time.Time{}
			}
			e.step(1)
			for key, end := range ends {
				switch {
				case end.IsZero():
					if a, ok, _ := e.s.TryAcquire(key); ok && a != nil {
						ends[key] = e.clock.Now().Add(hold)
					}
				case !e.clock.Now().Before(end):
					if err := e.s.Release(key); err != nil {
						t.Fatal(err)
					}
					delete(ends, key)
				}
			}
		}
		return value(t, e.s.m.spare.WithLabelValues("poisson"))
	}
	short, long := spare(10*time.Second), spare(10*time.Minute)
	boot := (45 * time.Second).Minutes()
	if want := math.Round(1.65 * math.Sqrt(2*6*boot)); long != want || short >= long {
		t.Fatalf("Poisson spare %v for 10 s jobs, %v for 10 min jobs: want %v for the long ones, less for the short", short, long, want)
	}
}

// The rise-skill gauge shows the model's skill: after
// a day of bursts at some minutes and a day of bursts at others, the
// profiles' rises have not been coming and the gauge says so.
func TestRiseSkillIsShown(t *testing.T) {
	cfg := Config{CapacityPerInstance: 4, Prediction: ptr(true), Policies: []Policy{{IdleTime: 5 * time.Minute}}}
	e := newEnv(t, cfg)
	start := e.clock.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour) // a midnight: the profiles' days
	bursts := func(minutes ...int) func(int) int {
		return func(m int) int {
			for _, b := range minutes {
				if m >= b && m < b+3 {
					return 32
				}
			}
			return 2
		}
	}
	days := []func(int) int{bursts(547, 631, 673, 772, 861), bursts(580, 605, 710, 810)}
	var now time.Time
	e.s.mu.Lock()
	for day, demand := range days {
		for sec := 0; sec < 24*3600; sec += 10 {
			if day == 1 && sec > 14*3600+20*60 {
				break
			}
			now = start.Add(time.Duration(day*24*3600+sec) * time.Second)
			e.s.model.Observe(now, demand(sec/60))
		}
	}
	skill := e.s.model.RiseSkill()
	e.s.mu.Unlock()
	e.clock.Advance(now.Sub(e.clock.Now()) + time.Second)
	e.s.Tick(e.ctx)
	if got := value(t, e.s.m.riseSkill); skill >= 0.5 || got != skill {
		t.Fatalf("berth_taskscaler_forecast_rise_skill %v, the model's skill %v: want it shown, under a half", got, skill)
	}
}
