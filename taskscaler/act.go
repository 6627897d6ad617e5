package taskscaler

// Deciding (through Decide) and acting on the group.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/berthci/berth/taskscaler/forecast"
	"github.com/berthci/berth/taskscaler/ledger"
)

// Tick runs one round: observe (if due), start ready-ups, decide, act.
// Run calls it every TickInterval; a simulator calls it directly. Errors of
// the plugin are logged and retried on later ticks; Tick returns the first
// for the caller's information.
func (s *Scaler) Tick(ctx context.Context) error {
	now := s.clock.Now()
	var errs []error
	s.renewLease(now)
	s.mu.Lock()
	interval := s.cfg.UpdateInterval
	if s.expecting() {
		interval = s.cfg.UpdateIntervalWhenExpecting
	}
	due := now.Sub(s.lastUpdate) >= interval
	s.mu.Unlock()
	if due {
		if err := s.observe(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.startReadyUps(ctx)
	inc, dec := s.decide()
	if err := s.act(ctx, inc, dec); err != nil {
		errs = append(errs, err)
	}
	s.saveModel(now, false)
	s.gauges()
	return errors.Join(errs...)
}

func (s *Scaler) renewLease(now time.Time) {
	if s.lease == nil {
		return
	}
	err := s.lease.Renew(s.info.ID, now)
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.owner
	s.owner = err == nil
	switch {
	case err != nil && was:
		s.log.Error("lost the instance group lease: no more scaling", "err", err)
	case err == nil && !was:
		s.log.Warn("instance group lease regained")
	}
}

// decide snapshots the state, decides, and applies the decision's marks.
// It returns the instances to ask for and the IDs to Decrease.
func (s *Scaler) decide() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	// The views go into a buffer kept from one decision to the next: at
	// 10,000 instances a new one each second was 1.4 MB of garbage.
	st := State{
		Instances: s.views[:0],
		Requested: s.requested, Reserved: s.waiting, Polling: len(s.reservations) - s.waiting,
		Refused: len(s.refused), Queued: s.queuedNow(now),
		Throttle: s.bucket, BackoffUntil: s.backoffUntil, Stopping: s.stopping || !s.owner,
	}
	for _, in := range s.order {
		st.Instances = append(st.Instances, s.viewOf(in))
	}
	s.views = st.Instances
	demand := len(s.acquisitions) + st.Reserved + max(st.Refused, st.Queued)
	var pred forecast.Prediction
	if s.model != nil {
		idleTime := s.activePolicy(now).IdleTime
		s.model.SetWindow(idleTime)
		s.model.Observe(now, demand)
		boot := s.model.BootLatency()
		s.warnSlowBoots(boot, s.model.Window())
		s.adviseGaps(now, s.model.Window())
		var keep forecast.Prediction
		pred, keep = s.model.Predict(now, demand, boot, boot+s.model.DeleteLatency())
		st.Forecast = &Forecast{Create: forecastSlots(pred.Peak), Keep: forecastSlots(keep.Peak)}
		s.m.gauge(s.m.spare, "poisson").Set(pred.PoissonSpare)
		s.m.gauge(s.m.spare, "measured").Set(pred.MeasuredSpare)
		s.m.riseSkill.Set(s.model.RiseSkill())
		if s.model.BootsMeasured() > 0 {
			st.Overdue, st.LastReady = 2*boot, s.lastReady
		}
		// The runner's own request loop comes back until it stops for
		// good, as GitLab's idle_time assumes.
		st.PollingPeak = s.polls.peak(now, st.Polling, max(boot+s.model.DeleteLatency(), idleTime))
	}
	d := Decide(s.params, s.policies, st, now)
	s.m.overdue.Set(float64(d.Overdue))
	clear(s.refused)
	s.bucket = d.Throttle
	dec := d.Decrease
	for _, r := range d.Remove {
		in := s.instances[r.ID]
		if in == nil || in.acquired != 0 || in.phase >= PhaseRemoving {
			continue // cannot happen under the lock; kept as the invariant's guard
		}
		s.account(in, -1)
		in.phase, in.removeReason, in.removingAt = PhaseRemoving, r.Reason, now
		s.account(in, 1)
		if r.Reason == ReasonCreatingTimeout {
			s.noteFailure(now)
		}
		s.m.removals.WithLabelValues(r.Reason).Inc()
		s.record(ledger.Event{Op: ledger.OpRemoving, ID: in.id})
		dec = append(dec, in.id)
	}
	if !s.owner {
		dec = nil
	}
	for _, id := range dec {
		s.instances[id].decreasedAt = now
	}
	outcome := "hold"
	switch {
	case d.Increase > 0 && len(d.Remove) > 0:
		outcome = "scale_up_and_down"
	case d.Increase > 0:
		outcome = "scale_up"
	case len(d.Remove) > 0:
		outcome = "scale_down"
	}
	s.m.counter(s.m.decisions, outcome).Inc()
	figs := [5]int{d.InUse, st.Polling, d.Need, d.Supply, d.Instances}
	if outcome != "hold" || figs != s.lastLogged {
		s.lastLogged = figs
		attrs := []any{"outcome", outcome, "policy", d.Policy, "in_use", d.InUse, "polling", st.Polling, "idle_target", d.IdleTarget,
			"need", d.Need, "supply", d.Supply, "instances", d.Instances, "increase", d.Increase, "reasons", d.Reasons}
		if len(d.Remove) > 0 {
			attrs = append(attrs, "remove", d.Remove)
		}
		if s.model != nil {
			attrs = append(attrs, "predicted", d.Predicted, "forecast_rise", round2(pred.Rise), "forecast_spare", round2(pred.Spare), "forecast_expert", pred.Expert,
				"forecast_rise_skill", round2(s.model.RiseSkill()), "boot_latency", s.model.BootLatency())
			if s.model.Spare() == forecast.SpareMeasured {
				attrs = append(attrs, "forecast_poisson_spare", pred.PoissonSpare)
			}
			if pred.Consumed > 0 {
				attrs = append(attrs, "forecast_consumed", round2(pred.Consumed))
			}
		}
		s.log.Debug("decision", attrs...)
	}
	return d.Increase, dec
}

// warnSlowBoots warns, once for each idle_time, when the fleet's measured
// boots take longer than idle_time (the forecast's window): the spare
// ends idle_time after the last arrival (what a wrong forecast may cost
// is bounded by it), so each job after a quiet idle_time waits a whole
// boot, and an idle_time at least as long as a boot would keep the spare
// through it.
func (s *Scaler) warnSlowBoots(boot, idleTime time.Duration) {
	if s.model.BootsMeasured() < slowBootSamples || boot <= idleTime || s.warnedIdleTime == idleTime {
		return
	}
	s.warnedIdleTime = idleTime
	s.log.Warn("boots take longer than idle_time: with prediction, a job that comes after idle_time without one waits a whole boot; an idle_time of at least the boot latency keeps capacity for it",
		"boot_latency", boot, "idle_time", idleTime)
}

// slowBootSamples is how many boots are measured before warnSlowBoots
// trusts the latency.
const slowBootSamples = 3

// adviseGaps warns, once a day, when more than 5 % of the day's jobs came
// after idle_time without an arrival: the forecast's spare had ended (a
// wrong forecast may cost no more than idle_time), so unless a floor held
// capacity they waited for a boot, and the p95 wait with them. Sparse
// traffic, a small team's, needs a longer idle_time; the warning says
// which one would have kept all but 1 % of them (the cost of holding an
// instance longer is small when it is used again soon: measured in
// docs/autoscaling.md, "Sparse traffic").
func (s *Scaler) adviseGaps(now time.Time, idleTime time.Duration) {
	a, ok := s.model.GapDay(now)
	if !ok || a.Jobs < gapAdviceJobs || float64(a.Missed) <= gapAdviceShare*float64(a.Jobs) {
		return
	}
	attrs := []any{"jobs", a.Jobs, "after_idle_time", a.Missed, "after_an_hour", a.Long, "idle_time", idleTime}
	if a.IdleTime > idleTime {
		s.log.Warn("jobs arrive further apart than idle_time: with prediction the spare ends idle_time after the last arrival, and a job after a longer gap waits for a boot unless a floor holds capacity; a longer idle_time holds it (after an hour and more, only a floor does)",
			append(attrs, "suggested_idle_time", a.IdleTime)...)
		return
	}
	s.log.Warn("jobs arrive further apart than idle_time: they come after an hour and more without one, and wait for a boot unless a floor holds capacity; no idle_time holds for them, an idle_count floor in the hours they come does",
		attrs...)
}

// A day's requests are diagnosed by adviseGaps when there are at least
// gapAdviceJobs of them, and more than gapAdviceShare came after a gap
// (the share a p95 wait allows).
const (
	gapAdviceJobs  = 50
	gapAdviceShare = 0.05
)

// forecastSlots turns a predicted demand into whole slots (rounded up; the
// model's spare already covers fluctuations).
func forecastSlots(peak float64) int {
	if peak <= 0 {
		return 0
	}
	return int(math.Ceil(peak))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// modelSaveEvery is how often the forecast is saved with state storage.
const modelSaveEvery = 10 * time.Minute

// saveModel writes the forecast beside the ledger, when state storage is
// on and the last save is modelSaveEvery old (or always, with force). The
// file is written outside the scaler's lock; saves are serialised.
func (s *Scaler) saveModel(now time.Time, force bool) {
	s.modelMu.Lock()
	defer s.modelMu.Unlock()
	s.mu.Lock()
	if s.model == nil || s.modelPath == "" || (!force && now.Sub(s.modelSaved) < modelSaveEvery) {
		s.mu.Unlock()
		return
	}
	data, _ := s.model.MarshalBinary()
	path := s.modelPath
	s.modelSaved = now
	s.mu.Unlock()
	if err := forecast.WriteFile(path, data); err != nil {
		s.log.Warn("saving the forecast", "err", err)
	}
}

func (s *Scaler) act(ctx context.Context, n int, dec []string) error {
	var errs []error
	if n > 0 {
		got, err := s.group.Increase(ctx, n)
		now := s.clock.Now()
		s.mu.Lock()
		for range got {
			s.requested = append(s.requested, now)
		}
		if got > 0 {
			s.record(ledger.Event{Op: ledger.OpRequested, N: got, At: now})
			s.m.requested.Add(float64(got))
		}
		s.mu.Unlock()
		if err != nil {
			s.m.increaseErrors.Inc()
			s.log.Warn("increase failed", "n", n, "err", err)
			errs = append(errs, fmt.Errorf("increasing by %d: %w", n, err))
		} else if got < n {
			s.log.Info("increase partly accepted", "asked", n, "accepted", got)
		}
	}
	if len(dec) > 0 {
		ok, err := s.group.Decrease(ctx, dec)
		if err != nil {
			s.log.Warn("decrease failed; retried later", "instances", dec, "err", err)
			errs = append(errs, fmt.Errorf("decreasing %s: %w", strings.Join(dec, ","), err))
		} else {
			s.log.Debug("decrease", "asked", dec, "accepted", ok)
		}
	}
	return errors.Join(errs...)
}

func (s *Scaler) gauges() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, n := range s.phaseCount {
		s.m.gauge(s.m.instances, Phase(p).String()).Set(float64(n))
	}
	s.m.gauge(s.m.slots, "acquired").Set(float64(len(s.acquisitions)))
	s.m.gauge(s.m.slots, "reserved").Set(float64(len(s.reservations)))
	s.m.gauge(s.m.slots, "idle").Set(float64(s.readyFree))
}

// Stats is a snapshot of the scaler, for operators and the simulator.
type Stats struct {
	Instances  [5]int // by Phase
	Requested  int
	Acquired   int
	Reserved   int // reservations holding no slot: a job's waiting for one, or the runner's asking for a job
	Waiting    int // of those, a job's waiting for a slot (demand)
	ReadyFree  int // free slots on ready instances
	ReadySlots int // slots of ready instances, free or not
	IdleReady  int // ready instances with no acquired slot
	Busy       int // instances holding at least one job
	// Since the scaler started (Started): instances that appeared after
	// a request (or unasked), instances gone from the group, and the
	// instance time of every instance, gone or not, counted from when
	// the scaler first saw it — what a cloud bills, give or take its
	// rounding.
	Started         time.Time
	Boots           int64
	Deletions       int64
	InstanceSeconds float64
	// Capacity is the slots per instance; MaxInstances the most
	// instances at once.
	Capacity     int
	MaxInstances int
}

// Stats returns a snapshot.
func (s *Scaler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	st := Stats{Instances: s.phaseCount, Requested: len(s.requested), Acquired: len(s.acquisitions),
		Reserved: len(s.reservations), Waiting: s.waiting, ReadyFree: s.readyFree,
		Started: s.started, Boots: s.boots, Deletions: s.gone, InstanceSeconds: s.pastSeconds,
		Capacity: s.params.Capacity, MaxInstances: s.cfg.MaxInstances}
	for _, in := range s.order {
		st.InstanceSeconds += max(0, now.Sub(in.billedFrom).Seconds())
		if in.acquired > 0 {
			st.Busy++
		}
		if in.phase == PhaseReady {
			st.ReadySlots += s.params.Capacity
			if in.acquired == 0 {
				st.IdleReady++
			}
		}
	}
	return st
}

// peakWindow is the largest of the counts seen within a trailing window:
// a deque of decreasing counts, so adding and reading are amortized O(1)
// and it holds at most one entry per distinct count in the window.
type peakWindow struct {
	q []timedCount
}

type timedCount struct {
	at time.Time
	n  int
}

// peak adds n seen at now and returns the largest count seen since
// now − window.
func (w *peakWindow) peak(now time.Time, n int, window time.Duration) int {
	for len(w.q) > 0 && w.q[len(w.q)-1].n <= n {
		w.q = w.q[:len(w.q)-1]
	}
	w.q = append(w.q, timedCount{now, n})
	i := 0
	for i < len(w.q)-1 && now.Sub(w.q[i].at) > window {
		i++
	}
	w.q = w.q[i:]
	return w.q[0].n
}
