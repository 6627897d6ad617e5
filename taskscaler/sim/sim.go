// Package sim runs the real taskscaler in virtual time against the fake
// fleeting plugin in-process, for `berth sim`: a day of traffic takes
// seconds, and the same inputs give the same outputs.
//
// The model. Jobs arrive (a built-in workload or a trace) and queue in the
// coordinator. The runner is modelled as long-polling workers without a
// concurrency limit: whenever something changes (an arrival, a release, a
// tick) each queued job, oldest first, asks for a reservation, and a
// reserved job takes a slot as soon as one is ready; a job whose slot does
// not come within instance_acquire_timeout fails (a failed acquisition).
// Once a reservation is refused, the jobs behind it are reported as
// waiting (the coordinator's queue insight) instead of each being refused
// in turn: the same demand, at the cost of one refusal.
// The scaler ticks every virtual second; the fake cloud boots and deletes
// instances with the configured latencies and failures; ready-up is a fake
// that fails with the configured rate. Everything runs on one goroutine:
// the scaler's ready-ups run inline and the fake cloud draws from its
// seeded source in call order.
//
// Cost is instance-seconds: the sum over instances of the time from the
// request to the end of deletion, what a cloud bills. Its clairvoyant lower
// bound is Σ job durations ÷ capacity_per_instance (perfect packing, no
// boot, no idle), with waits of zero.
package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/taskscaler"
)

// Start is the virtual time a run starts at: a Monday, 00:00 UTC.
var Start = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Config is one simulation.
type Config struct {
	// Autoscaler is the [runners.autoscaler] configuration. State storage
	// is ignored (a simulation has nothing to restart).
	Autoscaler taskscaler.Config
	// Cloud is the fake plugin's configuration (boot latency, failures,
	// quota). Its Seed is replaced by Seed.
	Cloud fake.Config
	// Jobs is the workload, sorted by arrival.
	Jobs []Job
	// Seed seeds the cloud and the ready-up failures.
	Seed uint64
	// ReadyFailureRate is the probability that one ready-up attempt fails.
	ReadyFailureRate float64
	// From is when the run starts, after Start: the scaler starts then,
	// and days before it are neither billed nor reported. A trace whose
	// first job comes on a Thursday starts that Thursday at 00:00 (From
	// is 3 days), so a fleet's floors are not billed for the days before
	// it while its times keep their weekday. No job may arrive before it.
	From time.Duration
	// Horizon is how long after Start the run lasts at least (0: until
	// the last arrival); it goes on until every job has finished.
	Horizon time.Duration
	// SampleEvery is the period of the time series (default 1m).
	SampleEvery time.Duration
	// Logger receives the scaler's logs (default: discard).
	Logger *slog.Logger
	// Explain, if set, receives the scaler's decisions made between
	// ExplainFrom and ExplainTo (virtual time since the start), a line
	// each, when one acts or its figures change (Logger then gets the
	// records that are not decisions).
	Explain                io.Writer
	ExplainFrom, ExplainTo time.Duration
}

// Result is what a simulation measured. Durations are in seconds in JSON.
type Result struct {
	Jobs               int `json:"jobs"`
	Completed          int `json:"completed"`
	FailedAcquisitions int `json:"failed_acquisitions"`
	// LostJobs held a slot on an instance that vanished under them.
	LostJobs         int     `json:"lost_jobs"`
	WaitP50          float64 `json:"wait_p50_seconds"`
	WaitP95          float64 `json:"wait_p95_seconds"`
	WaitP99          float64 `json:"wait_p99_seconds"`
	WaitMax          float64 `json:"wait_max_seconds"`
	WaitMean         float64 `json:"wait_mean_seconds"`
	InstanceSeconds  float64 `json:"instance_seconds"`
	IdleInstanceSecs float64 `json:"idle_instance_seconds"`
	InstancesCreated int     `json:"instances_created"`
	PeakInstances    int     `json:"peak_instances"`
	// LowerBound is the clairvoyant cost: Σ durations ÷ capacity.
	LowerBound float64 `json:"lower_bound_instance_seconds"`
	CostRatio  float64 `json:"cost_ratio"`
	// WholeBound is a tighter clairvoyant cost, whole instances that
	// bill their boots and deletions (wholeBound), and WholeCostRatio
	// the cost over it.
	WholeBound     float64 `json:"whole_instance_bound_instance_seconds"`
	WholeCostRatio float64 `json:"whole_instance_cost_ratio"`
	// SimulatedSeconds is the virtual time covered (from Config.From).
	SimulatedSeconds float64 `json:"simulated_seconds"`
	// Days splits the run by day (24 h from Start, Monday 00:00 UTC,
	// from the day of Config.From on): jobs and their waits by the day they arrived, billing by the
	// day it accrued, the lower bound by the day the job time falls in
	// (jobs started on arrival), so a job running past midnight counts
	// in both days.
	Days []Day `json:"days"`
	// Series is sampled every SampleEvery, for plots.
	Series []Sample `json:"-"`
}

// Day is one day of a run.
type Day struct {
	Day              int     `json:"day"` // since Start: 0 is a Monday
	Jobs             int     `json:"jobs"`
	WaitP50          float64 `json:"wait_p50_seconds"`
	WaitP95          float64 `json:"wait_p95_seconds"`
	WaitMax          float64 `json:"wait_max_seconds"`
	InstanceSeconds  float64 `json:"instance_seconds"`
	IdleInstanceSecs float64 `json:"idle_instance_seconds"`
	LowerBound       float64 `json:"lower_bound_instance_seconds"`
	CostRatio        float64 `json:"cost_ratio"`
	WholeBound       float64 `json:"whole_instance_bound_instance_seconds"`
	WholeCostRatio   float64 `json:"whole_instance_cost_ratio"`
}

// Weekday names a day of a run (day 0 is a Monday).
func (d Day) Weekday() time.Weekday { return time.Weekday((d.Day + 1) % 7) }

// Sample is one point of the time series.
type Sample struct {
	At         time.Duration
	Demand     int // jobs running or waiting
	SlotsReady int // slots of ready instances
	Instances  int // instances billed (creating, running, deleting)
}

// clock is the virtual clock. After is never fired: the simulation calls
// only non-blocking scaler methods.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time                       { return c.now }
func (c *clock) After(time.Duration) <-chan time.Time { return nil }

type job struct {
	Job
	key      string
	acq      *taskscaler.Acquisition
	reserved time.Time
	acquired bool
	wait     time.Duration
}

type event struct {
	at  time.Time
	seq int
	job *job // finishing job
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if !e[i].at.Equal(e[j].at) {
		return e[i].at.Before(e[j].at)
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// Run simulates cfg.
func Run(ctx context.Context, cfg Config) (Result, error) {
	as := cfg.Autoscaler
	as.StateStorage.Enabled = false
	as.SetDefaults()
	if err := as.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if !(cfg.ReadyFailureRate >= 0 && cfg.ReadyFailureRate <= 1) {
		return Result{}, fmt.Errorf("ready failure rate %v is not a probability", cfg.ReadyFailureRate)
	}
	if !slices.IsSortedFunc(cfg.Jobs, func(a, b Job) int { return int(a.Arrival - b.Arrival) }) {
		return Result{}, errors.New("jobs not sorted by arrival")
	}
	if cfg.From < 0 {
		return Result{}, fmt.Errorf("the run starts at %v, before Start", cfg.From)
	}
	if len(cfg.Jobs) > 0 && cfg.Jobs[0].Arrival < cfg.From {
		return Result{}, fmt.Errorf("the run starts at %v, after its first job (%v)", cfg.From, cfg.Jobs[0].Arrival)
	}
	clk := &clock{now: Start.Add(cfg.From)}
	cloudCfg := cfg.Cloud
	cloudCfg.Seed = cfg.Seed
	if cloudCfg.Name == "" {
		cloudCfg.Name = "sim"
	}
	cloud := fake.New(cloudCfg, clk)
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0xda942042e4dd58b5))
	readier := taskscaler.ReadierFunc(func(context.Context, fleeting.ConnectInfo) error {
		if cfg.ReadyFailureRate > 0 && rng.Float64() < cfg.ReadyFailureRate {
			return errors.New("simulated ready-up failure")
		}
		return nil
	})
	logger := cfg.Logger
	if cfg.Explain != nil {
		logger = slog.New(&explainHandler{clk: clk, from: cfg.ExplainFrom, to: cfg.ExplainTo, w: cfg.Explain, next: cfg.Logger.Handler()})
	}
	s, err := taskscaler.New(ctx, cloud, as, taskscaler.Options{
		Clock: clk, Inline: true, Readier: readier, DefaultLocation: time.UTC, Logger: logger, Name: "sim",
	})
	if err != nil {
		return Result{}, err
	}

	var (
		res      = Result{Jobs: len(cfg.Jobs)}
		queue    []*job // arrived, waiting for a slot, oldest first
		fin      events
		seq      int
		next     int // next arrival
		waits    []time.Duration
		days     = map[int]*dayAcc{}
		lastAcct = clk.now
		nextTick = clk.now
		nextSamp = clk.now
	)
	timeout := as.InstanceAcquireTimeout
	// dispatch lets the queued jobs, oldest first, reserve and take slots.
	// The reserved jobs always come before the unreserved ones (reservations
	// are asked for in queue order, and a refusal is followed by refusals
	// until one is given back, which only reserved jobs do), so a pass
	// stops at the first refusal: the jobs behind it would be refused too.
	// What waits behind it is reported as the coordinator's queue insight
	// would (Scaler.SetQueued), the count a refusal of each would have
	// made; a pass costs the reserved jobs and one refusal, not the queue,
	// which a fleet too small for its load grows without end.
	queued := 0
	dispatch := func() {
		now := clk.now
		kept, i := 0, 0
		waiting := 0
		for ; i < len(queue); i++ {
			j := queue[i]
			if j.reserved.IsZero() {
				if s.Reserve(j.key) != nil {
					waiting = len(queue) - i
					break
				}
				j.reserved = now
			}
			a, ok, err := s.TryAcquire(j.key)
			if err == nil && ok {
				j.acquired, j.wait, j.acq = true, now.Sub(Start)-j.Arrival, a
				waits = append(waits, j.wait)
				dayOf(days, j.Arrival).waits = append(dayOf(days, j.Arrival).waits, j.wait)
				seq++
				heap.Push(&fin, event{at: now.Add(j.Duration), seq: seq, job: j})
				continue
			}
			if err != nil || now.Sub(j.reserved) >= timeout {
				s.Unreserve(j.key)
				res.FailedAcquisitions++
				continue
			}
			queue[kept] = j
			kept++
		}
		queue = dropVisited(queue, kept, i)
		if waiting > 0 || queued > 0 { // (a report goes stale: renewed while jobs wait)
			queued = waiting
			s.SetQueued(waiting, 2*time.Second)
		}
	}
	// account adds the billing of [lastAcct, now).
	account := func() {
		from := lastAcct
		dt := clk.now.Sub(lastAcct).Seconds()
		lastAcct = clk.now
		if dt <= 0 {
			return
		}
		billed, _ := cloud.Billed()
		busy := s.Stats().Busy
		res.InstanceSeconds += float64(billed) * dt
		res.IdleInstanceSecs += float64(max(0, billed-busy)) * dt
		res.PeakInstances = max(res.PeakInstances, billed)
		splitByDay(from.Sub(Start), clk.now.Sub(Start), func(at time.Duration, span float64) {
			d := dayOf(days, at)
			d.billed += float64(billed) * span
			d.idle += float64(max(0, billed-busy)) * span
		})
	}
	horizon := cfg.Horizon
	for _, j := range cfg.Jobs {
		horizon = max(horizon, j.Arrival)
	}
	end := Start.Add(horizon)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// The next moment: an arrival, a finish or a tick.
		t := nextTick
		if next < len(cfg.Jobs) {
			if at := Start.Add(cfg.Jobs[next].Arrival); at.Before(t) {
				t = at
			}
		}
		if fin.Len() > 0 && fin[0].at.Before(t) {
			t = fin[0].at
		}
		if !t.Before(end) && next >= len(cfg.Jobs) && fin.Len() == 0 && len(queue) == 0 {
			break
		}
		account()
		clk.now = t
		switch {
		case next < len(cfg.Jobs) && Start.Add(cfg.Jobs[next].Arrival).Equal(t):
			j := &job{Job: cfg.Jobs[next], key: fmt.Sprintf("job-%d", next)}
			next++
			queue = append(queue, j)
			dispatch()
		case fin.Len() > 0 && fin[0].at.Equal(t):
			e := heap.Pop(&fin).(event)
			select {
			case <-e.job.acq.Lost():
				res.LostJobs++
			default:
				res.Completed++
			}
			s.Release(e.job.key)
			dispatch()
		default:
			s.Tick(ctx)
			dispatch()
			nextTick = nextTick.Add(time.Second)
			if !t.Before(nextSamp) {
				st := s.Stats()
				billed, _ := cloud.Billed()
				res.Series = append(res.Series, Sample{At: t.Sub(Start), Demand: st.Acquired + len(queue),
					SlotsReady: st.ReadySlots, Instances: billed})
				nextSamp = nextSamp.Add(cfg.SampleEvery)
			}
		}
	}
	account()
	res.SimulatedSeconds = clk.now.Sub(Start.Add(cfg.From)).Seconds()
	_, res.InstancesCreated = cloud.Billed()
	sum := 0.0
	for _, j := range cfg.Jobs {
		sum += j.Duration.Seconds()
	}
	res.LowerBound = sum / float64(as.CapacityPerInstance)
	if res.LowerBound > 0 {
		res.CostRatio = res.InstanceSeconds / res.LowerBound
	}
	for _, j := range cfg.Jobs {
		dayOf(days, j.Arrival).jobs++
		// The bound's job time falls in the days the job would run,
		// started on arrival, as billing falls in the days it accrues:
		// a job that runs past midnight, or for days, counts in each.
		splitByDay(j.Arrival, j.Arrival+j.Duration, func(at time.Duration, span float64) { dayOf(days, at).work += span })
	}
	for a := FirstDay(cfg.From); a < clk.now.Sub(Start); a += day {
		dayOf(days, a) // quiet days too
	}
	whole, wholeDays := wholeBound(cfg.Jobs, as.CapacityPerInstance, shortest(cfg.Cloud.BootLatency), shortest(cfg.Cloud.DeleteLatency))
	res.WholeBound = whole
	if whole > 0 {
		res.WholeCostRatio = res.InstanceSeconds / whole
	}
	res.Days = dayResults(days, as.CapacityPerInstance)
	for i := range res.Days {
		d := &res.Days[i]
		if d.WholeBound = wholeDays[d.Day]; d.WholeBound > 0 {
			d.WholeCostRatio = d.InstanceSeconds / d.WholeBound
		}
	}
	slices.Sort(waits)
	if n := len(waits); n > 0 {
		res.WaitP50, res.WaitP95, res.WaitP99, res.WaitMax = quantile(waits, 0.50), quantile(waits, 0.95), quantile(waits, 0.99), waits[n-1].Seconds()
		total := 0.0
		for _, w := range waits {
			total += w.Seconds()
		}
		res.WaitMean = total / float64(n)
	}
	return res, nil
}

// DefaultAutoscaler is the [runners.autoscaler] table `berth sim` uses
// without --config: four jobs per instance, four idle slots on weekdays
// 07:00-18:59 UTC, none at night and at weekends, idle instances removed
// after five minutes.
const DefaultAutoscaler = `
capacity_per_instance = 4

[[policy]]
idle_count = 0
idle_time = "5m"

[[policy]]
periods = ["* 7-18 * * mon-fri"]
timezone = "UTC"
idle_count = 4
idle_time = "5m"
`

// day is a day of a run.
const day = 24 * time.Hour

// FirstDay is 00:00 of the day of t (t since Start): where a run of a
// trace whose first job arrives at t starts (Config.From).
func FirstDay(t time.Duration) time.Duration { return max(0, t) / day * day }

// dayAcc accumulates one day of a run.
type dayAcc struct {
	jobs         int
	waits        []time.Duration
	work         float64 // job seconds in the day, jobs started on arrival
	billed, idle float64
}

// splitByDay calls f for each day's part of [from, to), split at
// midnight: a moment of that part and its length in seconds.
func splitByDay(from, to time.Duration, f func(at time.Duration, seconds float64)) {
	for from < to {
		end := min(to, (from/day+1)*day)
		f(from, (end - from).Seconds())
		from = end
	}
}

func dayOf(days map[int]*dayAcc, at time.Duration) *dayAcc {
	i := int(at / day)
	d := days[i]
	if d == nil {
		d = &dayAcc{}
		days[i] = d
	}
	return d
}

func dayResults(days map[int]*dayAcc, capacity int) []Day {
	var out []Day
	for i, d := range days {
		r := Day{Day: i, Jobs: d.jobs, InstanceSeconds: d.billed, IdleInstanceSecs: d.idle,
			LowerBound: d.work / float64(capacity)}
		if r.LowerBound > 0 {
			r.CostRatio = r.InstanceSeconds / r.LowerBound
		}
		w := slices.Clone(d.waits)
		slices.Sort(w)
		if n := len(w); n > 0 {
			r.WaitP50, r.WaitP95, r.WaitMax = quantile(w, 0.50), quantile(w, 0.95), w[n-1].Seconds()
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Day) int { return a.Day - b.Day })
	return out
}

// explainHandler writes the scaler's decision log records made within a
// window of virtual time, stamped with the virtual time, and hands the
// other records to next.
type explainHandler struct {
	clk      *clock
	from, to time.Duration
	w        io.Writer
	next     slog.Handler
}

func (h *explainHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *explainHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != "decision" {
		if h.next.Enabled(ctx, r.Level) {
			return h.next.Handle(ctx, r)
		}
		return nil
	}
	if at := h.clk.now.Sub(Start); at < h.from || at >= h.to {
		return nil
	}
	var b strings.Builder
	b.WriteString(h.clk.now.Format("Mon 15:04:05"))
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	b.WriteByte('\n')
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *explainHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *explainHandler) WithGroup(string) slog.Handler      { return h }

// quantile is the p-quantile (nearest rank) of sorted, in seconds.
func quantile(sorted []time.Duration, p float64) float64 {
	n := len(sorted)
	return sorted[min(n-1, max(0, int(math.Ceil(p*float64(n)))-1))].Seconds()
}

// dropVisited closes the gap the jobs gone from the first visited entries
// of q left: dispatch moved the kept ones, in order, to q[:kept]; they go
// just before q[visited:], so the few kept move up to the rest of the
// queue rather than the rest down to them.
func dropVisited(q []*job, kept, visited int) []*job {
	copy(q[visited-kept:visited], q[:kept])
	clear(q[:visited-kept])
	return q[visited-kept:]
}
