package taskscaler

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Phase is where an instance is in the scaler's life cycle.
//
//	Increase accepted ──► (requested: counted, no ID yet)
//	                          │ listed by Update
//	                          ▼
//	                      creating ──running──► booted ──ready-up ok──► ready ◄─┐
//	                          │                   │                     │  │    │ jobs acquire
//	                          │ creating timeout  │ ready-up failed      │  └────┘ and release slots
//	                          ▼                   ▼                     ▼
//	                      removing ◄──────────────┴──── idle / max_use_count / unhealthy
//	                          │ Decrease (retried every deletion_retry_interval)
//	                          ▼
//	                      deleting ──► gone (not listed, deleted or timeout: pruned)
//
// Only an instance with no acquired slot ever enters removing, and a
// removing instance never gets a slot.
type Phase int

// The phases, in life order.
const (
	PhaseCreating Phase = iota
	PhaseBooted
	PhaseReady
	PhaseRemoving
	PhaseDeleting
)

var phaseNames = [...]string{"creating", "booted", "ready", "removing", "deleting"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// Params are the fixed inputs of the decision, from Config.
type Params struct {
	Capacity        int           // slots per instance (≥1)
	MaxUseCount     int           // 0: unlimited
	MaxInstances    int           // 0: unlimited
	ThrottleLimit   float64       // new instances per second; -1: unlimited
	ThrottleBurst   int           // bucket size
	CreatingTimeout time.Duration // creating longer than this: removed
	DeletionRetry   time.Duration // Decrease again after this
}

// ParamsOf derives the decision parameters from a defaulted Config.
func ParamsOf(c *Config) Params {
	return Params{
		Capacity: max(1, c.CapacityPerInstance), MaxUseCount: c.MaxUseCount, MaxInstances: c.MaxInstances,
		ThrottleLimit: c.ScaleThrottle.Limit, ThrottleBurst: c.ScaleThrottle.Burst,
		CreatingTimeout: c.InstanceCreatingTimeout, DeletionRetry: c.DeletionRetryInterval,
	}
}

// perInstance is the free slots a fresh instance brings.
func (p Params) perInstance() int {
	if p.MaxUseCount > 0 {
		return min(p.Capacity, p.MaxUseCount)
	}
	return p.Capacity
}

// free is how many more jobs instance v can take: its free slots, bounded
// by the uses it has left. 0 when it can take none (unhealthy, failed,
// leaving).
func (p Params) free(v *InstanceView) int {
	if v.Unhealthy || v.ReadyFailed || v.Phase > PhaseReady {
		return 0
	}
	f := p.Capacity - v.Acquired
	if p.MaxUseCount > 0 {
		f = min(f, p.MaxUseCount-v.Uses)
	}
	return max(0, f)
}

// InstanceView is one instance as the decision sees it.
type InstanceView struct {
	ID       string
	Phase    Phase
	Acquired int // slots held by jobs
	Uses     int // jobs ever acquired on it
	// Unhealthy: consecutive failures reached failure_threshold.
	Unhealthy bool
	// ReadyFailed: ready-up failed for good.
	ReadyFailed bool
	// Created is when the scaler first saw it.
	Created time.Time
	// Requested is when Increase asked for it; zero when unknown (an
	// instance adopted at start or appeared unasked).
	Requested time.Time
	// IdleSince is when its last job released, or when it became ready.
	IdleSince time.Time
	// DecreasedAt is when Decrease was last asked for it (removing only).
	DecreasedAt time.Time
}

// State is everything the decision looks at, observed under the scaler's
// lock.
type State struct {
	// Instances in discovery order (oldest first).
	Instances []InstanceView
	// Requested is the instances Increase accepted that Update has not
	// listed yet, by when each was asked for, oldest first (zero when
	// unknown); with a forecast an unlisted request can be overdue too (a
	// cloud that accepted and cannot deliver).
	Requested []time.Time
	// Reserved is reservations with a job that holds no slot yet (the
	// runner claimed it, Acquire is waiting, TryAcquire was refused):
	// demand.
	Reserved int
	// Polling is reservations held while the runner asks the coordinator
	// for a job, no job known yet. Not demand: most requests bring none,
	// and a runner asks all the time — except in preemptive mode, where
	// Reserve granted each a ready slot that is then no longer idle.
	Polling int
	// PollingPeak is the most polling reservations held at once lately: within
	// idle_time, or until an instance removed now could be back if that is
	// longer (with a forecast only). A runner in preemptive mode polls
	// again a moment after each poll ends, so the dip between two polls is
	// no reason to remove the instance that holds its slot, only to ask
	// for it again at the next poll.
	PollingPeak int
	// Refused is Reserve calls refused for lack of capacity since the last
	// decision: work waiting in the coordinator that the runner could not
	// take.
	Refused int
	// Queued is jobs waiting in the coordinator that the runner could take
	// (the coordinator's queue insight), as last reported; it overlaps
	// Refused, which sees the same jobs from the runner's side, so the
	// decision counts the larger of the two.
	Queued int
	// Throttle is the scale_throttle bucket.
	Throttle Bucket
	// BackoffUntil holds off new instances after ready-up failures.
	BackoffUntil time.Time
	// Stopping: shutting down; neither scale up nor remove idle.
	Stopping bool
	// Forecast is the demand model's opinion; nil when prediction is off.
	Forecast *Forecast
	// Overdue, with a forecast, is how long after its request an instance
	// that is not ready yet stops counting as supply (twice the measured
	// boot latency; 0: never). Only an instance asked for before LastReady
	// — the cloud has delivered since, so this one is stuck, not the cloud
	// slow — and one more, the oldest, stop counting: a lone stuck
	// instance is replaced at once rather than after
	// instance_creating_timeout, and a cloud where nothing comes up gets
	// one replacement, not one per decision.
	Overdue time.Duration
	// LastReady is when an instance last became ready.
	LastReady time.Time
}

// Forecast is what the demand model predicts, in slots of demand (held by
// jobs, reserved, or wanted by waiting jobs).
type Forecast struct {
	// Create is the peak demand predicted until an instance asked for now
	// would be ready (the measured boot latency).
	Create int
	// Keep is the peak predicted until an instance removed now could be
	// back (boot plus deletion latency): an idle instance needed within it
	// costs less kept than removed and made again.
	Keep int
}

// Removal is an instance to remove and why.
type Removal struct {
	ID     string
	Reason string
}

// Removal reasons.
const (
	ReasonIdle            = "idle"
	ReasonMaxUseCount     = "max_use_count"
	ReasonUnhealthy       = "unhealthy"
	ReasonReadyFailed     = "ready_up_failed"
	ReasonCreatingTimeout = "creating_timeout"
	ReasonPreexisted      = "preexisted"
)

// Decision is what to do now, and why.
type Decision struct {
	// Policy is the index of the active policy, -1 for DefaultPolicy.
	Policy int
	// Increase is how many instances to ask for.
	Increase int
	// Remove are instances to mark removing (then Decrease them).
	Remove []Removal
	// Decrease are instances already removing whose Decrease is due: not
	// yet asked, or asked deletion_retry_interval ago without effect.
	Decrease []string
	// Throttle is the bucket after Increase was taken from it.
	Throttle Bucket

	// The figures behind it, in slots.
	InUse      int // acquired + reserved (polling reservations only in preemptive mode)
	IdleTarget int // idle slots the policy wants
	Need       int // free slots wanted: reserved + max(refused, queued) + idle target, or the forecast's if more
	Supply     int // free slots on instances ready, booting and requested
	// ReadySupply is the part of Supply on ready instances.
	ReadySupply int
	Overdue     int // instances still booting State.Overdue after their request
	Uncounted   int // of those, the ones not counted in Supply
	Instances   int // instances counted against max_instances
	// Predicted is the forecast's demand until new instances would be
	// ready (0 without prediction).
	Predicted int
	// Reasons explain the decision in words, for the debug log.
	Reasons []string
}

// ActivePolicy returns the index of the last policy whose period contains
// now, or -1. Policies must be compiled (Config.Validate + New or
// SetPolicies do it).
func ActivePolicy(policies []Policy, now time.Time) int {
	for i := len(policies) - 1; i >= 0; i-- {
		if policies[i].matches(now) {
			return i
		}
	}
	return -1
}

// Decide is the autoscaler's decision: a pure function of the parameters,
// the policies, the observed state and the time. It does nothing itself.
//
// The rules, in slots:
//
//	in use      = acquired + reserved
//	idle target = max(idle_count, min(⌈scale_factor × in use⌉, scale_factor_limit))
//	need        = reserved + max(refused, queued) + idle target
//	supply      = free slots of instances that can still take jobs
//	              (ready, booted, creating, requested), each bounded by its
//	              remaining max_use_count uses
//
// reserved counts the reservations that have a job. Those the runner
// holds while it asks the coordinator for a job (polling) are not
// demand — a runner asks all the time, mostly for nothing — except in
// preemptive mode, where Reserve granted each of them a ready slot; with
// a forecast, removals then keep room for the most polls held at once
// lately (PollingPeak), as the runner polls again after each poll.
//
// need > supply: ask for ⌈(need − supply) / per instance⌉ instances, within
// max_instances (counting every instance not yet gone), the ready-up backoff
// and the scale_throttle bucket.
// need < supply: remove ready instances with no acquired slot that have been
// idle for the policy's idle_time, longest idle first, only while the supply
// left still covers need — so a removal never causes a replacement.
// Whatever need is, instances with no acquired slot are removed when they
// reached max_use_count, are unhealthy, failed ready-up or stayed creating
// too long. An instance with an acquired slot is never removed.
//
// With a forecast (prediction): need is at least the demand forecast
// within a boot, less what jobs hold; supply leaves out instances overdue
// (State.Overdue); and idle ready instances go at once, longest idle
// first, while the slots left on ready instances still cover what the
// forecast wants until a replacement could be back (keep) — booting
// capacity never makes a ready instance surplus.
func Decide(p Params, policies []Policy, st State, now time.Time) Decision {
	d := Decision{Policy: ActivePolicy(policies, now), Throttle: st.Throttle}
	pol := DefaultPolicy
	if d.Policy >= 0 {
		pol = policies[d.Policy]
	}
	per := p.perInstance()

	acquired := 0
	// Instances asked for at or before overdueAt and still booting are
	// overdue (with a forecast); probed: one asked for since LastReady is
	// not counted already.
	var overdueAt time.Time
	if st.Forecast != nil && st.Overdue > 0 {
		overdueAt = now.Add(-st.Overdue)
	}
	probed := false
	// isOverdue counts an instance (or request) asked for at at, still not
	// ready, and says whether it is left out of the supply.
	isOverdue := func(at time.Time) bool {
		if overdueAt.IsZero() || at.IsZero() || at.After(overdueAt) {
			return false
		}
		d.Overdue++
		stuck := at.Before(st.LastReady)
		if stuck || !probed {
			probed = probed || !stuck
			d.Uncounted++
			return true
		}
		return false
	}
	for i := range st.Instances {
		v := &st.Instances[i]
		acquired += v.Acquired
		d.Instances++
		switch v.Phase {
		case PhaseRemoving:
			if v.DecreasedAt.IsZero() || now.Sub(v.DecreasedAt) >= p.DeletionRetry {
				d.Decrease = append(d.Decrease, v.ID)
			}
			continue
		case PhaseDeleting:
			continue
		}
		if v.Acquired == 0 {
			if r := mustRemove(p, v, now); r != "" {
				d.Remove = append(d.Remove, Removal{v.ID, r})
				continue
			}
		}
		if v.Phase <= PhaseBooted && isOverdue(v.Requested) {
			continue
		}
		f := p.free(v)
		d.Supply += f
		if v.Phase == PhaseReady {
			d.ReadySupply += f
		}
	}
	d.Instances += len(st.Requested)
	for _, at := range st.Requested {
		if !isOverdue(at) {
			d.Supply += per
		}
	}
	if d.Overdue > 0 {
		d.Reasons = append(d.Reasons, fmt.Sprintf("%d instances not ready %s after their request, %d not counted", d.Overdue, st.Overdue, d.Uncounted))
	}

	reserved := st.Reserved
	if pol.Preemptive() {
		reserved += st.Polling
	}
	d.InUse = acquired + reserved
	d.IdleTarget = pol.IdleCount
	if pol.ScaleFactor > 0 {
		f := int(math.Ceil(pol.ScaleFactor * float64(d.InUse)))
		if pol.ScaleFactorLimit > 0 {
			f = min(f, pol.ScaleFactorLimit)
		}
		d.IdleTarget = max(d.IdleTarget, f)
	}
	d.Need = reserved + max(st.Refused, st.Queued) + d.IdleTarget
	if st.Stopping {
		d.Reasons = append(d.Reasons, "stopping: no scaling")
		return d
	}
	keep := d.Need
	if f := st.Forecast; f != nil {
		d.Predicted = f.Create
		if n := f.Create - acquired; n > d.Need {
			d.Reasons = append(d.Reasons, fmt.Sprintf("forecast: %d slots of demand within a boot, %d held", f.Create, acquired))
			d.Need = n
		}
		keep = max(d.Need, f.Keep-acquired)
		if lack := st.PollingPeak - st.Polling - max(st.Refused, st.Queued); pol.Preemptive() && lack > 0 {
			keep += lack
		}
	}

	switch {
	case d.Need > d.Supply:
		want := ceilDiv(d.Need-d.Supply, per)
		n := want
		if p.MaxInstances > 0 {
			n = min(n, max(0, p.MaxInstances-d.Instances))
		}
		d.Reasons = append(d.Reasons, fmt.Sprintf("need %d free slots, have %d: want %d instances", d.Need, d.Supply, want))
		if n < want {
			d.Reasons = append(d.Reasons, fmt.Sprintf("max_instances %d allows %d", p.MaxInstances, n))
		}
		if n > 0 && now.Before(st.BackoffUntil) {
			d.Reasons = append(d.Reasons, fmt.Sprintf("ready-up backoff for %s", st.BackoffUntil.Sub(now)))
			n = 0
		}
		if n > 0 && countReason(d.Remove, ReasonCreatingTimeout) > 0 {
			// The scaler backs off when it applies this removal.
			d.Reasons = append(d.Reasons, "an instance never ran: no replacement before the backoff")
			n = 0
		}
		if n > 0 {
			got, b := st.Throttle.Take(now, n, p.ThrottleLimit, p.ThrottleBurst)
			if got < n {
				d.Reasons = append(d.Reasons, fmt.Sprintf("scale_throttle allows %d", got))
			}
			n, d.Throttle = got, b
		}
		d.Increase = n
	case d.Need < d.Supply && st.Forecast != nil:
		// idle_time is not waited for: keeping an instance the forecast
		// does not need until a replacement could be back costs more than
		// making one again when it is. Only ready slots make a ready
		// instance surplus: capacity still booting serves no job before
		// it is ready, so a ready instance is never given back for it
		// (it goes once what was booting is ready, if still not needed).
		d.Remove = idleRemovals(p, 0, st.Instances, d.ReadySupply-keep, now, d.Remove)
		if k := countReason(d.Remove, ReasonIdle); k > 0 {
			d.Reasons = append(d.Reasons, fmt.Sprintf("need %d free slots, %d until a replacement could be back, have %d ready: remove %d idle", d.Need, keep, d.ReadySupply, k))
		}
	case d.Need < d.Supply:
		d.Remove = idleRemovals(p, pol.IdleTime, st.Instances, d.Supply-d.Need, now, d.Remove)
		if k := countReason(d.Remove, ReasonIdle); k > 0 {
			d.Reasons = append(d.Reasons, fmt.Sprintf("need %d free slots, have %d: remove %d idle", d.Need, d.Supply, k))
		}
	}
	for _, r := range d.Remove {
		if r.Reason != ReasonIdle {
			d.Reasons = append(d.Reasons, fmt.Sprintf("remove %s: %s", r.ID, r.Reason))
		}
	}
	return d
}

// mustRemove says why an instance with no acquired slot has to go, or "".
func mustRemove(p Params, v *InstanceView, now time.Time) string {
	switch {
	case v.ReadyFailed:
		return ReasonReadyFailed
	case v.Unhealthy:
		return ReasonUnhealthy
	case p.MaxUseCount > 0 && v.Uses >= p.MaxUseCount:
		return ReasonMaxUseCount
	case v.Phase == PhaseCreating && p.CreatingTimeout > 0 && now.Sub(v.Created) >= p.CreatingTimeout:
		return ReasonCreatingTimeout
	}
	return ""
}

// idleRemovals picks ready instances idle for at least minIdle to remove
// while surplus free slots remain, longest idle first (then oldest).
func idleRemovals(p Params, minIdle time.Duration, vs []InstanceView, surplus int, now time.Time, out []Removal) []Removal {
	var cands []*InstanceView
	for i := range vs {
		v := &vs[i]
		if v.Phase != PhaseReady || v.Acquired != 0 || p.free(v) == 0 || now.Sub(v.IdleSince) < minIdle {
			continue
		}
		cands = append(cands, v)
	}
	slices.SortStableFunc(cands, func(a, b *InstanceView) int { return a.IdleSince.Compare(b.IdleSince) })
	for _, v := range cands {
		if f := p.free(v); f <= surplus {
			out = append(out, Removal{v.ID, ReasonIdle})
			surplus -= f
		}
	}
	return out
}

func countReason(rs []Removal, reason string) int {
	n := 0
	for _, r := range rs {
		if r.Reason == reason {
			n++
		}
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Bucket is the scale_throttle token bucket, as a value: Take returns the
// bucket after taking, so the decision stays pure.
type Bucket struct {
	Tokens float64
	At     time.Time // when Tokens was computed; zero: a full bucket
}

// Take takes up to n tokens at now from a bucket refilled at limit per
// second up to burst; limit -1 is unlimited. It returns how many it took.
func (b Bucket) Take(now time.Time, n int, limit float64, burst int) (int, Bucket) {
	if limit < 0 {
		return n, b
	}
	tokens := float64(burst)
	if !b.At.IsZero() {
		tokens = min(float64(burst), b.Tokens+limit*now.Sub(b.At).Seconds())
	}
	got := min(n, int(math.Floor(tokens)))
	got = max(got, 0)
	return got, Bucket{Tokens: tokens - float64(got), At: now}
}
