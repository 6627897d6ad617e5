package taskscaler

// Capacity: reservations, slots, acquisitions and releases.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/taskscaler/ledger"
)

func (in *instance) view() InstanceView {
	return InstanceView{ID: in.id, Phase: in.phase, Acquired: in.acquired, Uses: in.uses, Created: in.created, Requested: in.requestedAt,
		IdleSince: in.idleAt, DecreasedAt: in.decreasedAt, ReadyFailed: in.readyFailed}
}

func (s *Scaler) viewOf(in *instance) InstanceView {
	v := in.view()
	v.Unhealthy = in.failures >= s.cfg.FailureThreshold
	return v
}

// account adds (sign 1) or removes (-1) in's share of the aggregates;
// every change to an instance is bracketed by account(in, -1) and
// account(in, 1).
func (s *Scaler) account(in *instance, sign int) {
	if in.gone {
		return
	}
	v := s.viewOf(in)
	f := s.params.free(&v)
	s.phaseCount[in.phase] += sign
	if s.byLoad != nil {
		if sign < 0 && in.listed {
			s.byLoad[in.load].remove(in)
		} else if sign > 0 && in.phase == PhaseReady && f > 0 {
			in.load = in.acquired
			s.byLoad[in.load].pushBack(in)
		}
	}
	if in.phase <= PhaseReady {
		s.liveFree += sign * f
		if in.phase == PhaseReady {
			s.readyFree += sign * f
		}
	}
}

// broadcast wakes Acquire calls waiting for capacity. Called with s.mu held.
func (s *Scaler) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// poke asks Run for a decision now.
func (s *Scaler) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Scaler) activePolicy(now time.Time) Policy {
	if i := ActivePolicy(s.policies, now); i >= 0 {
		return s.policies[i]
	}
	return DefaultPolicy
}

// SetQueued reports the jobs waiting in the coordinator that this runner
// could take and does not hold yet (the coordinator's queue insight), so
// the scaler provisions for demand it cannot see through reservations: in
// preemptive mode, and beyond the runner's request concurrency. The report
// counts for staleAfter; a source that stops reporting stops counting.
func (s *Scaler) SetQueued(n int, staleAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queued, s.queuedUntil = max(0, n), s.clock.Now().Add(staleAfter)
	if n > 0 {
		s.poke()
	}
}

// queuedNow is the queued report if it is still fresh. Called with s.mu
// held.
func (s *Scaler) queuedNow(now time.Time) int {
	if now.After(s.queuedUntil) {
		return 0
	}
	return s.queued
}

// Reserve reserves capacity for one job before the runner asks the
// coordinator for it. It fails with ErrNoCapacity when there is neither a
// free ready slot nor room to create one within max_instances, and — in
// preemptive mode — when no ready slot is free right now (a refused
// reservation is still counted as demand, so the scaler grows for the
// queue it cannot see). Reserving a key that is already reserved succeeds.
//
// A reservation is not demand until it has a job (Claim) or a job asks for
// its slot (Acquire, TryAcquire): the runner holds one through every
// request for a job, most
// of which bring none, so counting it would keep an instance for a runner
// that only polls. In preemptive mode it is demand from the start: the
// ready slot Reserve granted it is no longer idle.
func (s *Scaler) Reserve(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.acquisitions[key]; ok {
		return fmt.Errorf("reserving %s: %w", key, ErrKeyInUse)
	}
	return s.reserveLocked(key)
}

func (s *Scaler) reserveLocked(key string) error {
	if _, ok := s.reservations[key]; ok {
		return nil
	}
	if n, reason, err := s.headroomLocked(); n == 0 {
		if errors.Is(err, ErrNoCapacity) {
			s.refused[key] = struct{}{} // (demand: see Stats.Waiting)
		}
		s.m.reserveRefused.WithLabelValues(reason).Inc()
		return fmt.Errorf("reserving %s: %w", key, err)
	}
	s.reservations[key] = false
	delete(s.refused, key) // counted as reserved now
	return nil
}

// Headroom is how many more reservations Reserve would grant now: the
// ready idle slots not reserved in preemptive mode, what max_instances
// still allows otherwise, -1 when nothing bounds it, 0 while the scaler
// stops or another manager owns the group. A runner that announces its
// room ahead (the job push channel) announces no more than this.
func (s *Scaler) Headroom() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, _, _ := s.headroomLocked()
	return n
}

// headroomLocked is Headroom, and when it is 0 the refusal's metric label
// and error. Called with s.mu held.
func (s *Scaler) headroomLocked() (n int, reason string, err error) {
	if s.stopping {
		return 0, "stopping", ErrStopping
	}
	if !s.owner {
		return 0, "not_owner", ErrNotOwner
	}
	r := len(s.reservations)
	if s.activePolicy(s.clock.Now()).Preemptive() {
		if n = s.readyFree - r; n <= 0 {
			return 0, "no_idle_capacity", fmt.Errorf("%w: no idle ready slot (preemptive mode)", ErrNoCapacity)
		}
		return n, "", nil
	}
	if s.cfg.MaxInstances > 0 {
		room := s.cfg.MaxInstances - len(s.instances) - len(s.requested)
		if n = s.liveFree + (len(s.requested)+max(0, room))*s.params.perInstance() - r; n <= 0 {
			return 0, "max_instances", fmt.Errorf("%w: max_instances %d reached", ErrNoCapacity, s.cfg.MaxInstances)
		}
		return n, "", nil
	}
	return -1, "", nil
}

// Claim says the runner got a job for key's reservation: it is demand from
// now on, as it becomes anyway when Acquire asks for its slot — which comes
// only after the job is acknowledged and its secrets resolved, time in
// which an idle instance could go. Claim does nothing for a key without a
// reservation.
func (s *Scaler) Claim(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.awaitSlot(key) {
		s.poke()
	}
}

// awaitSlot marks key's reservation as a job's waiting for a slot: demand
// from now on. It reports whether that changed anything. Called with s.mu
// held.
func (s *Scaler) awaitSlot(key string) bool {
	if waiting, ok := s.reservations[key]; ok && !waiting {
		s.reservations[key] = true
		s.waiting++
		if s.model != nil {
			s.model.Requested(s.clock.Now())
		}
		return true
	}
	return false
}

// unreserveLocked drops key's reservation and reports whether there was
// one. Called with s.mu held.
func (s *Scaler) unreserveLocked(key string) bool {
	waiting, ok := s.reservations[key]
	if !ok {
		return false
	}
	delete(s.reservations, key)
	if waiting {
		s.waiting--
	}
	return true
}

// Unreserve drops key's reservation (the coordinator had no job). It does
// nothing for a key without one.
func (s *Scaler) Unreserve(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unreserveLocked(key) {
		s.broadcast()
	}
}

// TryAcquire is Acquire without waiting: it takes the lowest free slot of
// the ready instance nextFree picks, or returns ok false and keeps the
// reservation, counted as demand from now on. A key without a reservation
// is reserved first.
func (s *Scaler) TryAcquire(key string) (a *Acquisition, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tryAcquireLocked(key)
}

func (s *Scaler) tryAcquireLocked(key string) (*Acquisition, bool, error) {
	if _, ok := s.acquisitions[key]; ok {
		return nil, false, fmt.Errorf("acquiring %s: %w", key, ErrKeyInUse)
	}
	if err := s.reserveLocked(key); err != nil {
		return nil, false, err
	}
	s.awaitSlot(key)
	if s.readyFree <= 0 {
		return nil, false, nil
	}
	in := s.nextFree()
	if in == nil {
		return nil, false, nil
	}
	slot := slices.Index(in.slots, "")
	s.account(in, -1)
	in.slots[slot] = key
	in.acquired++
	in.uses++
	s.account(in, 1)
	now := s.clock.Now()
	a := &Acquisition{Key: key, InstanceID: in.id, Slot: slot, ConnectInfo: in.info, Use: in.uses, lost: make(chan struct{}), at: now}
	if err := s.record(ledger.Event{Op: ledger.OpAcquire, ID: in.id, Slot: slot, Key: key}); err != nil {
		s.account(in, -1)
		in.slots[slot] = ""
		in.acquired--
		in.uses--
		s.account(in, 1)
		return nil, false, fmt.Errorf("acquiring %s: %w", key, err)
	}
	s.unreserveLocked(key)
	s.acquisitions[key] = a
	if s.model != nil {
		s.model.Arrived(now)
	}
	return a, true, nil
}

// nextFree is the instance the next job goes to: with packing the fullest
// ready instance with room (the longest there among equals), otherwise
// the oldest ready instance with room. nil if none. Called with s.mu held.
func (s *Scaler) nextFree() *instance {
	if s.byLoad != nil {
		for load := len(s.byLoad) - 1; load >= 0; load-- {
			if in := s.byLoad[load].head; in != nil {
				return in
			}
		}
		return nil
	}
	for ; s.hint < len(s.order); s.hint++ {
		if in := s.order[s.hint]; s.canTake(in) {
			return in
		}
	}
	return nil
}

// loadList is one list of byLoad, linked through the instances themselves
// so that moving an instance between lists allocates nothing.
type loadList struct{ head, tail *instance }

func (l *loadList) pushBack(in *instance) {
	in.prev, in.next, in.listed = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = in
	} else {
		l.head = in
	}
	l.tail = in
}

func (l *loadList) remove(in *instance) {
	if in.prev != nil {
		in.prev.next = in.next
	} else {
		l.head = in.next
	}
	if in.next != nil {
		in.next.prev = in.prev
	} else {
		l.tail = in.prev
	}
	in.prev, in.next, in.listed = nil, nil, false
}

// canTake reports whether in can take one more job now.
func (s *Scaler) canTake(in *instance) bool {
	return in.phase == PhaseReady && in.acquired < s.params.Capacity && !in.readyFailed &&
		in.failures < s.cfg.FailureThreshold && (s.cfg.MaxUseCount == 0 || in.uses < s.cfg.MaxUseCount)
}

// mayTake lowers the scan hint to in: it may have become able to take a
// job. With packing there is no scan (account keeps the lists). Called
// with s.mu held.
func (s *Scaler) mayTake(in *instance) {
	if s.byLoad != nil {
		return
	}
	i, found := slices.BinarySearchFunc(s.order, in.seq, func(x *instance, seq uint64) int { return cmp.Compare(x.seq, seq) })
	if found && i < s.hint {
		s.hint = i
	}
}

// Acquire gives key a slot: the lowest free slot of the instance nextFree
// picks (the fullest with room when packing, else the oldest), waiting up
// to instance_acquire_timeout for one to be ready. A key without a reservation is reserved first (and may fail with
// ErrNoCapacity). On timeout (ErrAcquireTimeout), cancellation or shutdown
// the reservation is dropped. With acquire_heartbeats the instance is
// checked with the plugin's Heartbeat first; a failing instance counts a
// failure and another slot is sought.
func (s *Scaler) Acquire(ctx context.Context, key string) (*Acquisition, error) {
	start := s.clock.Now()
	timeout := s.clock.After(s.cfg.InstanceAcquireTimeout)
	fail := func(reason string, err error) (*Acquisition, error) {
		s.m.acquireFailed.WithLabelValues(reason).Inc()
		s.Unreserve(key)
		return nil, err
	}
	for {
		s.mu.Lock()
		a, ok, err := s.tryAcquireLocked(key)
		changed := s.changed
		stopping := s.stopping
		s.mu.Unlock()
		if err != nil {
			reason := "error"
			if errors.Is(err, ErrNoCapacity) {
				reason = "no_capacity"
			}
			return fail(reason, err)
		}
		if ok {
			if a, err := s.checkAcquired(ctx, a); err != nil || a != nil {
				if a != nil {
					s.m.acquireWait.Observe(s.clock.Now().Sub(start).Seconds())
				}
				return a, err
			}
			continue // the instance failed its heartbeat: look again
		}
		if stopping {
			return fail("stopping", fmt.Errorf("acquiring %s: %w", key, ErrStopping))
		}
		s.poke()
		select {
		case <-ctx.Done():
			return fail("canceled", fmt.Errorf("acquiring %s: %w", key, ctx.Err()))
		case <-timeout:
			return fail("timeout", fmt.Errorf("acquiring %s after %s: %w", key, s.cfg.InstanceAcquireTimeout, ErrAcquireTimeout))
		case <-changed:
		}
	}
}

// checkAcquired runs the acquire heartbeat and refreshes expiring
// credentials. It returns a nil acquisition (and nil error) when the
// instance failed and the slot was given back.
func (s *Scaler) checkAcquired(ctx context.Context, a *Acquisition) (*Acquisition, error) {
	if s.cfg.AcquireHeartbeats {
		if err := s.group.Heartbeat(ctx, a.InstanceID); err != nil {
			if ctx.Err() != nil {
				s.Release(a.Key)
				return nil, fmt.Errorf("acquiring %s: %w", a.Key, ctx.Err())
			}
			s.log.Warn("instance failed its heartbeat", "instance", a.InstanceID, "err", err)
			s.giveBack(a, err)
			return nil, nil
		}
	}
	if exp := a.ConnectInfo.Expires; !exp.IsZero() && exp.Sub(s.clock.Now()) < 10*time.Second {
		info, err := s.group.ConnectInfo(ctx, a.InstanceID)
		if err != nil {
			s.log.Warn("refreshing connect info", "instance", a.InstanceID, "err", err)
			s.giveBack(a, err)
			return nil, nil
		}
		s.mu.Lock()
		if in := s.instances[a.InstanceID]; in != nil {
			in.info = info
		}
		s.mu.Unlock()
		a.ConnectInfo = info
	}
	return a, nil
}

// giveBack undoes an acquisition whose instance failed before the job
// started: the slot is free again, the use is not counted, the instance
// counts a failure. The key keeps its reservation, a job's waiting for a
// slot.
func (s *Scaler) giveBack(a *Acquisition, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.acquisitions, a.Key)
	s.reservations[a.Key] = false
	s.awaitSlot(a.Key)
	in := s.instances[a.InstanceID]
	if in == nil || in.slots[a.Slot] != a.Key {
		return
	}
	s.account(in, -1)
	in.slots[a.Slot] = ""
	in.acquired--
	in.uses--
	in.failures++
	if errors.Is(cause, fleeting.ErrInstanceNotFound) {
		in.failures = max(in.failures, s.cfg.FailureThreshold)
	}
	if in.acquired == 0 {
		in.idleAt = s.clock.Now()
	}
	s.account(in, 1)
	s.mayTake(in)
	s.record(ledger.Event{Op: ledger.OpUnacquire, ID: in.id, Slot: a.Slot})
	s.poke()
}

// ReportFailure says the job holding key could not use its instance (it
// could not connect, the executor failed to prepare). Consecutive failures
// reaching failure_threshold make the instance unhealthy: it gets no more
// jobs and is replaced once its slots are released. A job released without
// a reported failure resets the count.
func (s *Scaler) ReportFailure(key string, cause error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.acquisitions[key]
	if a == nil {
		return fmt.Errorf("reporting failure of %s: %w", key, ErrUnknownKey)
	}
	in := s.instances[a.InstanceID]
	if a.failed || in == nil {
		return nil
	}
	a.failed = true
	s.account(in, -1)
	in.failures++
	s.account(in, 1)
	s.log.Warn("instance failure reported", "instance", in.id, "key", key, "failures", in.failures, "err", cause)
	s.poke()
	return nil
}

// Release frees key's slot (or drops its reservation). An instance that
// reached max_use_count is removed as soon as its last job releases.
func (s *Scaler) Release(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.acquisitions[key]
	if a == nil {
		if s.unreserveLocked(key) {
			s.broadcast()
			return nil
		}
		return fmt.Errorf("releasing %s: %w", key, ErrUnknownKey)
	}
	delete(s.acquisitions, key)
	now := s.clock.Now()
	if s.model != nil {
		s.model.Held(now.Sub(a.at))
	}
	in := s.instances[a.InstanceID]
	if in == nil || in.gone || in.slots[a.Slot] != key {
		return nil
	}
	var freeBefore int
	if s.model != nil {
		v := s.viewOf(in)
		freeBefore = s.params.free(&v)
	}
	s.account(in, -1)
	in.slots[a.Slot] = ""
	in.acquired--
	if s.model != nil {
		if v := s.viewOf(in); s.params.free(&v) <= freeBefore {
			// The slot went with the job (max_use_count, or the instance
			// is leaving): the next job needs a new one.
			s.model.Consumed()
		}
	}
	if !a.failed && in.failures < s.cfg.FailureThreshold {
		in.failures = 0 // consecutive failures only; unhealthy stays unhealthy
	}
	if in.acquired == 0 {
		in.idleAt = now
	}
	s.account(in, 1)
	s.mayTake(in)
	s.record(ledger.Event{Op: ledger.OpRelease, ID: in.id, Slot: a.Slot})
	s.broadcast()
	if in.acquired == 0 && (s.viewOf(in).Unhealthy || (s.cfg.MaxUseCount > 0 && in.uses >= s.cfg.MaxUseCount)) {
		s.poke()
	}
	return nil
}
