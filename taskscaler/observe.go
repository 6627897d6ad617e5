package taskscaler

// Observing the group (Update) and readying new instances.

import (
	"context"
	"slices"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/taskscaler/ledger"
)

type listed struct {
	id    string
	state fleeting.State
}

func (s *Scaler) expecting() bool {
	return len(s.requested) > 0 || s.phaseCount[PhaseCreating]+s.phaseCount[PhaseBooted]+s.phaseCount[PhaseRemoving]+s.phaseCount[PhaseDeleting] > 0
}

// observe asks the plugin for the instance list and applies it.
func (s *Scaler) observe(ctx context.Context) error {
	var got []listed
	err := s.group.Update(ctx, func(id string, st fleeting.State) { got = append(got, listed{id, st}) })
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastUpdate = now
	if err != nil {
		s.log.Warn("instance group update failed; list ignored", "err", err)
		return err
	}
	seen := make(map[string]bool, len(got))
	for _, l := range got {
		seen[l.id] = true
		in := s.instances[l.id]
		if in == nil {
			if l.state.Terminal() {
				continue
			}
			in = s.discover(l.id, l.state, now)
		}
		s.apply(in, l.state, now)
	}
	for _, in := range slices.Clone(s.order) {
		if !seen[in.id] {
			s.prune(in, "no longer listed", now)
		}
	}
	if !s.observed {
		s.observed = true
		for id := range s.adopt {
			s.record(ledger.Event{Op: ledger.OpGone, ID: id}) // in the ledger, gone from the group
		}
		s.adopt = nil
	}
	// Requests the plugin accepted but never listed.
	for len(s.requested) > 0 && now.Sub(s.requested[0]) >= s.cfg.InstanceCreatingTimeout {
		s.log.Warn("requested instance never appeared", "requested_at", s.requested[0])
		s.requested = s.requested[1:]
	}
	return nil
}

// discover adds an instance the scaler did not know. Called with s.mu held.
func (s *Scaler) discover(id string, st fleeting.State, now time.Time) *instance {
	in := &instance{id: id, created: now, billedFrom: now, slots: make([]string, s.params.Capacity)}
	var evs []ledger.Event
	switch old, inLedger := s.adopt[id]; {
	case inLedger:
		delete(s.adopt, id)
		in.cause, in.uses, in.created = "adopted", old.Uses, old.Seen
		switch {
		case old.Removing:
			in.phase, in.removeReason = PhaseRemoving, "removing before restart"
		case len(old.Slots) > 0 && !s.cfg.StateStorage.KeepInstanceWithAcquisitions:
			in.phase, in.removeReason = PhaseRemoving, "held jobs at restart"
			evs = append(evs, ledger.Event{Op: ledger.OpRemoving, ID: id})
		case old.Ready && st == fleeting.StateRunning:
			// It was ready: only its ConnectInfo is fetched again, the
			// ready command is not rerun.
			in.phase, in.wasReady = PhaseBooted, true
		}
		if len(old.Slots) > 0 {
			for slot := range old.Slots {
				evs = append(evs, ledger.Event{Op: ledger.OpRelease, ID: id, Slot: slot})
			}
		}
		s.log.Info("instance adopted from the ledger", "instance", id, "uses", in.uses, "jobs_at_restart", len(old.Slots), "phase", in.phase)
	case len(s.requested) > 0:
		s.boots++
		in.requestedAt = s.requested[0]
		s.requested = s.requested[1:]
		in.cause = "requested"
		evs = append(evs, ledger.Event{Op: ledger.OpSeen, ID: id, At: now})
	case !s.observed:
		in.cause, in.phase, in.removeReason = "preexisted", PhaseRemoving, ReasonPreexisted
		evs = append(evs, ledger.Event{Op: ledger.OpInstance, ID: id, At: now}, ledger.Event{Op: ledger.OpRemoving, ID: id})
		s.m.removals.WithLabelValues(ReasonPreexisted).Inc()
		s.log.Info("instance found at start without saved state: removing", "instance", id)
	default:
		s.boots++
		in.cause = "unexpected"
		evs = append(evs, ledger.Event{Op: ledger.OpInstance, ID: id, At: now})
		s.log.Warn("instance appeared without a request: adopting", "instance", id)
	}
	s.record(evs...)
	s.seq++
	in.seq = s.seq
	s.instances[id] = in
	s.order = append(s.order, in)
	s.account(in, 1)
	return in
}

// apply moves in to the state the plugin reports. Called with s.mu held.
func (s *Scaler) apply(in *instance, st fleeting.State, now time.Time) {
	switch st {
	case fleeting.StateRunning:
		if in.phase == PhaseCreating {
			s.account(in, -1)
			in.phase, in.nextAttempt = PhaseBooted, now
			s.account(in, 1)
		}
	case fleeting.StateDeleting:
		if in.phase != PhaseDeleting {
			if in.acquired > 0 {
				s.loseJobs(in, "deleting")
			}
			s.account(in, -1)
			in.phase = PhaseDeleting
			s.account(in, 1)
		}
	case fleeting.StateDeleted, fleeting.StateTimeout:
		s.prune(in, string(st), now)
	}
}

// loseJobs tells the jobs on in that their instance is gone.
func (s *Scaler) loseJobs(in *instance, why string) {
	s.log.Error("instance unexpectedly removed while running jobs", "instance", in.id, "state", why, "jobs", in.acquired)
	s.m.lost.Inc()
	for _, key := range in.slots {
		if a := s.acquisitions[key]; key != "" && a != nil {
			close(a.lost)
		}
	}
}

// prune forgets a gone instance. Called with s.mu held.
func (s *Scaler) prune(in *instance, why string, now time.Time) {
	if in.gone {
		return
	}
	if in.acquired > 0 && in.phase != PhaseDeleting {
		s.loseJobs(in, why)
	}
	if in.phase < PhaseRemoving {
		s.log.Warn("instance disappeared", "instance", in.id, "phase", in.phase, "why", why)
	}
	if s.model != nil && !in.removingAt.IsZero() {
		s.model.ObserveDelete(now.Sub(in.removingAt))
	}
	s.account(in, -1)
	in.gone = true
	s.gone++
	s.pastSeconds += now.Sub(in.billedFrom).Seconds()
	delete(s.instances, in.id)
	s.order = slices.DeleteFunc(s.order, func(x *instance) bool { return x == in })
	s.hint = 0
	s.m.life.Observe(now.Sub(in.created).Seconds())
	s.record(ledger.Event{Op: ledger.OpGone, ID: in.id})
	s.broadcast()
	if gone := s.opts.Gone; gone != nil {
		go gone(in.id)
	}
}

// ---- ready-up ----

func (s *Scaler) startReadyUps(ctx context.Context) {
	now := s.clock.Now()
	s.mu.Lock()
	var todo []*instance
	for _, in := range s.order {
		if in.phase == PhaseBooted && !in.readying && !in.readyFailed && !now.Before(in.nextAttempt) {
			in.readying = true
			todo = append(todo, in)
		}
	}
	s.mu.Unlock()
	for _, in := range todo {
		if s.opts.Inline {
			s.readyUp(ctx, in)
			continue
		}
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.readyUp(s.bgCtx, in)
		}()
	}
}

// readyUp makes one attempt: ConnectInfo, then the Readier.
func (s *Scaler) readyUp(ctx context.Context, in *instance) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.InstanceReadyTimeout)
	info, err := s.group.ConnectInfo(actx, in.id)
	if err == nil && s.readier != nil && !in.wasReady {
		err = s.readier.Ready(actx, info)
	}
	cancel()
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	in.readying = false
	if in.gone || in.phase != PhaseBooted {
		return
	}
	s.account(in, -1)
	defer s.account(in, 1)
	if err == nil {
		in.phase, in.info, in.readyAt, in.idleAt = PhaseReady, info, now, now
		s.lastReady = now
		s.mayTake(in)
		s.failStreak = 0
		s.m.readyUp.Observe(now.Sub(in.created).Seconds())
		if s.model != nil && !in.requestedAt.IsZero() {
			s.model.ObserveBoot(now.Sub(in.requestedAt))
		}
		s.record(ledger.Event{Op: ledger.OpReady, ID: in.id})
		s.log.Debug("instance ready", "instance", in.id, "after", now.Sub(in.created))
		defer s.broadcast()
		return
	}
	in.attempts++
	s.m.readyUpFailed.Inc()
	if in.attempts > max(0, s.cfg.InstanceReadyRetries) {
		in.readyFailed = true
		s.noteFailure(now)
		s.log.Warn("instance failed ready-up: removing", "instance", in.id, "attempts", in.attempts, "err", err,
			"new_instances_held_until", s.backoffUntil)
		return
	}
	in.nextAttempt = now.Add(retryDelay(in.attempts))
	s.log.Info("instance ready-up attempt failed: retrying", "instance", in.id, "attempt", in.attempts, "err", err, "retry_at", in.nextAttempt)
}

// retryDelay is the pause before ready-up attempt n+1 on one instance.
func retryDelay(n int) time.Duration { return min(5*time.Second<<(n-1), time.Minute) }

// backoff is how long new instances are held after the k-th instance in
// a row failed to become ready: 15s doubling, at most 10m.
func backoff(k int) time.Duration {
	if k <= 0 {
		return 0
	}
	if k > 10 {
		return 10 * time.Minute
	}
	return min(15*time.Second<<(k-1), 10*time.Minute)
}

// noteFailure records an instance that never became ready. Called with
// s.mu held.
func (s *Scaler) noteFailure(now time.Time) {
	s.failStreak++
	s.backoffUntil = now.Add(backoff(s.failStreak))
}
