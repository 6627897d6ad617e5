// Package taskscaler is Berth's autoscaler: it decides how many instances
// an instance group (fleeting) should have and which (instance, slot) each
// job runs on.
//
// It works in three separate steps, repeated by Run every second (Tick):
//
//	observe  the plugin's Update list (every update_interval, or
//	         update_interval_when_expecting while a change is expected),
//	         ready-up results, reservations and acquisitions
//	decide   Decide: a pure function of the observed State, the policies
//	         and the time (decide.go)
//	act      Increase, Decrease, and the ready-up of new instances
//
// The runner manager uses it per job, the way GitLab Runner uses GitLab's
// taskscaler:
//
//	err := s.Reserve(key)         // before asking the coordinator for a job
//	… no job: s.Unreserve(key)
//	a, err := s.Acquire(ctx, key) // while preparing the job: waits for a slot
//	… run the job on a.ConnectInfo, slot a.Slot; watch a.Lost()
//	s.ReportFailure(key, err)     // if the instance could not be used
//	s.Release(key)                // when the job is done
//
// A Scaler is safe for concurrent use. Its clock is injected (Options.Clock)
// so tests and the simulator run it in virtual time.
package taskscaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/taskscaler/ledger"
)

// Errors of the scaler, for errors.Is.
var (
	// ErrNoCapacity: Reserve found no capacity (ready, or potential within
	// max_instances) for one more job.
	ErrNoCapacity = errors.New("no capacity")
	// ErrStopping: the scaler is shutting down.
	ErrStopping = errors.New("taskscaler stopping")
	// ErrNotOwner: another manager holds the instance group's lease.
	ErrNotOwner = errors.New("instance group managed by another manager")
	// ErrAcquireTimeout: no slot within instance_acquire_timeout.
	ErrAcquireTimeout = errors.New("timed out waiting for an instance slot")
	// ErrUnknownKey: the key holds no reservation or slot.
	ErrUnknownKey = errors.New("unknown key")
	// ErrKeyInUse: the key already holds a slot.
	ErrKeyInUse = errors.New("key already holds a slot")
)

// Readier readies a running instance before it gets jobs. Berth's readier
// (taskscaler/readycommand) dials the instance through the connector and
// runs instance_ready_command; tests and the simulator use fakes.
//
// Ready is called once per attempt, never twice at once for one instance,
// with a context bounded by instance_ready_timeout. An error fails the
// attempt; the scaler retries instance_ready_retries times, then removes
// the instance and backs off from creating new ones.
type Readier interface {
	Ready(ctx context.Context, info fleeting.ConnectInfo) error
}

// ReadierFunc adapts a function to Readier.
type ReadierFunc func(ctx context.Context, info fleeting.ConnectInfo) error

// Ready implements Readier.
func (f ReadierFunc) Ready(ctx context.Context, info fleeting.ConnectInfo) error { return f(ctx, info) }

// Options are the scaler's collaborators.
type Options struct {
	// Logger receives the scaler's logs; decisions at debug. Default:
	// discard.
	Logger *slog.Logger
	// Clock is the time source. Default: SystemClock.
	Clock Clock
	// Registerer receives the metrics. nil: not registered.
	Registerer prometheus.Registerer
	// Readier readies new instances. nil: an instance is ready once its
	// ConnectInfo is known.
	Readier Readier
	// Name names this scaler's ledger directory under state_storage.dir
	// (GitLab uses the runner's short token). Default: the group ID.
	Name string
	// Owner names this manager in the group lease. Default:
	// hostname/Name, stable across restarts so a restarted manager takes
	// its own lease back at once (the ledger's lock already keeps a second
	// live process with the same Name out).
	Owner string
	// DefaultLocation is the time zone of policies without a timezone.
	// Default: time.Local.
	DefaultLocation *time.Location
	// TickInterval is how often Run decides. Default 1s.
	TickInterval time.Duration
	// Inline runs ready-up attempts inside Tick, one after another,
	// instead of in goroutines: for a simulator whose fakes return at
	// once, so that a run is deterministic.
	Inline bool
}

// Acquisition is a slot held by a job.
type Acquisition struct {
	Key        string
	InstanceID string
	// Slot is the slot number on the instance, 0..capacity_per_instance-1:
	// stable for the job, reused lowest first.
	Slot int
	// ConnectInfo is how to reach the instance.
	ConnectInfo fleeting.ConnectInfo
	// Use is which job this is on the instance (1 for the first).
	Use int

	lost   chan struct{}
	failed bool
}

// Lost is closed if the instance disappears (deleted by someone else,
// reclaimed, timed out) while the job holds the slot; the job should fail.
func (a *Acquisition) Lost() <-chan struct{} { return a.lost }

type instance struct {
	id       string
	phase    Phase
	cause    string // requested, adopted, unexpected, preexisted
	created  time.Time
	readyAt  time.Time
	idleAt   time.Time
	slots    []string // key per slot, "" when free
	acquired int
	uses     int
	failures int // consecutive
	info     fleeting.ConnectInfo

	readying     bool
	attempts     int
	nextAttempt  time.Time
	readyFailed  bool
	removeReason string
	decreasedAt  time.Time
	gone         bool
	wasReady     bool // adopted ready: skip the Readier
}

// Scaler is the autoscaler of one instance group.
type Scaler struct {
	cfg     Config
	params  Params
	group   fleeting.InstanceGroup
	info    fleeting.ProviderInfo
	clock   Clock
	log     *slog.Logger
	m       *metrics
	readier Readier
	opts    Options

	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	mu           sync.Mutex
	instances    map[string]*instance
	order        []*instance // discovery order
	reservations map[string]time.Time
	acquisitions map[string]*Acquisition
	refused      map[string]struct{}
	requested    []time.Time
	bucket       Bucket
	failStreak   int
	backoffUntil time.Time
	policies     []Policy
	lastUpdate   time.Time
	observed     bool
	adopt        map[string]*ledger.Instance
	changed      chan struct{}
	stopping     bool
	owner        bool
	lastLogged   [4]int
	// aggregates, kept by account()
	readyFree, liveFree int
	phaseCount          [5]int

	ledger *ledger.Ledger
	lease  *ledger.Lease

	kick      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
	runMu     sync.Mutex
	running   bool
	runDone   chan struct{}
	runShut   bool // Shutdown has looked at running
	shutdown  bool
	shutdownM sync.Mutex
}

// New initialises group (its Init), takes the group lease and opens the
// ledger when state storage is enabled, observes the group once (adopting
// the instances the ledger lists) and returns a scaler ready for Reserve.
// Call Run to scale and Shutdown to stop; the scaler owns the group from
// here on and calls its Shutdown last. If New fails, the group has been
// shut down.
//
// cfg gets its defaults applied and is validated. max_instances above the
// group's MaxSize is lowered to it.
func New(ctx context.Context, group fleeting.InstanceGroup, cfg Config, opts Options) (s *Scaler, err error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.TickInterval <= 0 {
		opts.TickInterval = time.Second
	}
	if opts.DefaultLocation == nil {
		opts.DefaultLocation = time.Local
	}
	pols, err := compilePolicies(cfg.Policies, opts.DefaultLocation)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer, &cfg)
	if err != nil {
		return nil, fmt.Errorf("taskscaler metrics: %w", err)
	}
	settings, err := cfg.ConnectorConfig.Settings()
	if err != nil {
		return nil, fmt.Errorf("runners.autoscaler.%w", err)
	}
	info, err := group.Init(ctx, opts.Logger.With("component", "plugin"), settings)
	if err != nil {
		return nil, fmt.Errorf("initialising instance group: %w", err)
	}
	defer func() {
		if err != nil {
			group.Shutdown(context.WithoutCancel(ctx))
		}
	}()
	if info.MaxSize > 0 && (cfg.MaxInstances == 0 || cfg.MaxInstances > info.MaxSize) {
		opts.Logger.Warn("max_instances lowered to the group's max size", "max_instances", cfg.MaxInstances, "max_size", info.MaxSize)
		cfg.MaxInstances = info.MaxSize
	}
	s = &Scaler{
		cfg: cfg, params: ParamsOf(&cfg), group: group, info: info, clock: opts.Clock, m: m,
		log: opts.Logger.With("group", info.ID), readier: opts.Readier, opts: opts,
		instances: map[string]*instance{}, reservations: map[string]time.Time{},
		acquisitions: map[string]*Acquisition{}, refused: map[string]struct{}{},
		policies: pols, changed: make(chan struct{}), owner: true,
		kick: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	s.bgCtx, s.bgCancel = context.WithCancel(context.WithoutCancel(ctx))
	if cfg.StateStorage.Enabled {
		if err := s.openState(); err != nil {
			s.bgCancel()
			return nil, err
		}
	}
	if err := s.observe(ctx); err != nil {
		s.closeState()
		s.bgCancel()
		return nil, fmt.Errorf("first observation of instance group %s: %w", info.ID, err)
	}
	return s, nil
}

func compilePolicies(in []Policy, loc *time.Location) ([]Policy, error) {
	out := make([]Policy, len(in))
	for i, p := range in {
		p.Periods = slices.Clone(p.Periods)
		p.schedules = nil
		p.setDefaults()
		if err := p.validate(); err != nil {
			return nil, fmt.Errorf("runners.autoscaler.policy[%d]: %w", i, err)
		}
		if err := p.compile(loc); err != nil {
			return nil, fmt.Errorf("runners.autoscaler.policy[%d]: %w", i, err)
		}
		out[i] = p
	}
	return out, nil
}

func (s *Scaler) openState() error {
	name := s.opts.Name
	if name == "" {
		name = url.PathEscape(s.info.ID)
	}
	owner := s.opts.Owner
	if owner == "" {
		host, _ := os.Hostname()
		owner = host + "/" + name
	}
	dir := s.cfg.StateStorage.Dir
	l, st, err := ledger.Open(filepath.Join(dir, name), s.info.ID)
	if err != nil {
		return err
	}
	lease, err := ledger.TakeLease(dir, s.info.ID, owner, s.clock.Now(), s.cfg.StateStorage.LeaseDuration)
	if err != nil {
		l.Close()
		return fmt.Errorf("taking the instance group lease: %w", err)
	}
	s.lease, s.ledger = lease, l
	s.adopt = st.Instances
	now := s.clock.Now()
	for _, at := range st.Requested {
		if now.Sub(at) < s.cfg.InstanceCreatingTimeout {
			s.requested = append(s.requested, at)
		}
	}
	s.log.Info("state storage opened", "dir", filepath.Join(dir, name), "instances", len(st.Instances), "requested", len(s.requested))
	return nil
}

func (s *Scaler) closeState() {
	if s.ledger != nil {
		s.ledger.Close()
	}
	if s.lease != nil {
		if err := s.lease.Release(); err != nil {
			s.log.Warn("releasing the group lease", "err", err)
		}
	}
}

// record appends to the ledger, if any. Called with s.mu held.
func (s *Scaler) record(evs ...ledger.Event) error {
	if s.ledger == nil {
		return nil
	}
	if err := s.ledger.Append(evs...); err != nil {
		s.log.Error("writing the ledger", "err", err)
		return err
	}
	return nil
}

// SetPolicies replaces the policies (hot reload). On error the old ones
// stay.
func (s *Scaler) SetPolicies(ps []Policy) error {
	pols, err := compilePolicies(ps, s.opts.DefaultLocation)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.policies = pols
	s.mu.Unlock()
	s.log.Info("policies reloaded", "policies", len(pols))
	s.poke()
	return nil
}

// Group describes the instance group.
func (s *Scaler) Group() fleeting.ProviderInfo { return s.info }

// Config returns the configuration in use, defaults applied.
func (s *Scaler) Config() Config { return s.cfg }

// ---- capacity: Reserve, Acquire, Release ----

func (in *instance) view() InstanceView {
	return InstanceView{ID: in.id, Phase: in.phase, Acquired: in.acquired, Uses: in.uses, Created: in.created,
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

// Reserve reserves capacity for one job before the runner asks the
// coordinator for it. It fails with ErrNoCapacity when there is neither a
// free ready slot nor room to create one within max_instances, and — in
// preemptive mode — when no ready slot is free right now (a refused
// reservation is still counted as demand, so the scaler grows for the
// queue it cannot see). Reserving a key that is already reserved succeeds.
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
	if s.stopping {
		s.m.reserveRefused.WithLabelValues("stopping").Inc()
		return fmt.Errorf("reserving %s: %w", key, ErrStopping)
	}
	if !s.owner {
		s.m.reserveRefused.WithLabelValues("not_owner").Inc()
		return fmt.Errorf("reserving %s: %w", key, ErrNotOwner)
	}
	now := s.clock.Now()
	r := len(s.reservations)
	if s.activePolicy(now).Preemptive() {
		if s.readyFree-r <= 0 {
			s.refused[key] = struct{}{}
			s.m.reserveRefused.WithLabelValues("no_idle_capacity").Inc()
			return fmt.Errorf("reserving %s: %w: no idle ready slot (preemptive mode)", key, ErrNoCapacity)
		}
	} else if s.cfg.MaxInstances > 0 {
		room := s.cfg.MaxInstances - len(s.instances) - len(s.requested)
		potential := s.liveFree + (len(s.requested)+max(0, room))*s.params.perInstance() - r
		if potential <= 0 {
			s.refused[key] = struct{}{}
			s.m.reserveRefused.WithLabelValues("max_instances").Inc()
			return fmt.Errorf("reserving %s: %w: max_instances %d reached", key, ErrNoCapacity, s.cfg.MaxInstances)
		}
	}
	s.reservations[key] = now
	return nil
}

// Unreserve drops key's reservation (the coordinator had no job). It does
// nothing for a key without one.
func (s *Scaler) Unreserve(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.reservations[key]; ok {
		delete(s.reservations, key)
		s.broadcast()
	}
}

// TryAcquire is Acquire without waiting: it takes the lowest free slot of
// the oldest ready instance that has one, or returns ok false and keeps the
// reservation (so the demand stays counted). A key without a reservation is
// reserved first.
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
	if s.readyFree <= 0 {
		return nil, false, nil
	}
	for _, in := range s.order {
		if in.phase != PhaseReady {
			continue
		}
		v := s.viewOf(in)
		if s.params.free(&v) <= 0 {
			continue
		}
		slot := slices.Index(in.slots, "")
		s.account(in, -1)
		in.slots[slot] = key
		in.acquired++
		in.uses++
		s.account(in, 1)
		a := &Acquisition{Key: key, InstanceID: in.id, Slot: slot, ConnectInfo: in.info, Use: in.uses, lost: make(chan struct{})}
		if err := s.record(ledger.Event{Op: ledger.OpAcquire, ID: in.id, Slot: slot, Key: key}); err != nil {
			s.account(in, -1)
			in.slots[slot] = ""
			in.acquired--
			in.uses--
			s.account(in, 1)
			return nil, false, fmt.Errorf("acquiring %s: %w", key, err)
		}
		delete(s.reservations, key)
		s.acquisitions[key] = a
		return a, true, nil
	}
	return nil, false, nil
}

// Acquire gives key a slot: the lowest free slot of the oldest ready
// instance with one, waiting up to instance_acquire_timeout for one to be
// ready. A key without a reservation is reserved first (and may fail with
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
// counts a failure. The key keeps its reservation.
func (s *Scaler) giveBack(a *Acquisition, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.acquisitions, a.Key)
	s.reservations[a.Key] = s.clock.Now()
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
		if _, ok := s.reservations[key]; ok {
			delete(s.reservations, key)
			s.broadcast()
			return nil
		}
		return fmt.Errorf("releasing %s: %w", key, ErrUnknownKey)
	}
	delete(s.acquisitions, key)
	in := s.instances[a.InstanceID]
	if in == nil || in.gone || in.slots[a.Slot] != key {
		return nil
	}
	s.account(in, -1)
	in.slots[a.Slot] = ""
	in.acquired--
	if !a.failed {
		in.failures = 0
	}
	if in.acquired == 0 {
		in.idleAt = s.clock.Now()
	}
	s.account(in, 1)
	s.record(ledger.Event{Op: ledger.OpRelease, ID: in.id, Slot: a.Slot})
	s.broadcast()
	if in.acquired == 0 && (s.viewOf(in).Unhealthy || (s.cfg.MaxUseCount > 0 && in.uses >= s.cfg.MaxUseCount)) {
		s.poke()
	}
	return nil
}

// ---- observe ----

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
	in := &instance{id: id, created: now, slots: make([]string, s.params.Capacity)}
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
		s.requested = s.requested[1:]
		in.cause = "requested"
		evs = append(evs, ledger.Event{Op: ledger.OpSeen, ID: id, At: now})
	case !s.observed:
		in.cause, in.phase, in.removeReason = "preexisted", PhaseRemoving, ReasonPreexisted
		evs = append(evs, ledger.Event{Op: ledger.OpInstance, ID: id, At: now}, ledger.Event{Op: ledger.OpRemoving, ID: id})
		s.m.removals.WithLabelValues(ReasonPreexisted).Inc()
		s.log.Info("instance found at start without saved state: removing", "instance", id)
	default:
		in.cause = "unexpected"
		evs = append(evs, ledger.Event{Op: ledger.OpInstance, ID: id, At: now})
		s.log.Warn("instance appeared without a request: adopting", "instance", id)
	}
	s.record(evs...)
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
	s.account(in, -1)
	in.gone = true
	delete(s.instances, in.id)
	s.order = slices.DeleteFunc(s.order, func(x *instance) bool { return x == in })
	s.m.life.Observe(now.Sub(in.created).Seconds())
	s.record(ledger.Event{Op: ledger.OpGone, ID: in.id})
	s.broadcast()
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
		s.failStreak = 0
		s.m.readyUp.Observe(now.Sub(in.created).Seconds())
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

// ---- decide and act ----

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
	st := State{
		Instances: make([]InstanceView, 0, len(s.order)),
		Requested: len(s.requested), Reserved: len(s.reservations), Refused: len(s.refused),
		Throttle: s.bucket, BackoffUntil: s.backoffUntil, Stopping: s.stopping || !s.owner,
	}
	for _, in := range s.order {
		st.Instances = append(st.Instances, s.viewOf(in))
	}
	d := Decide(s.params, s.policies, st, now)
	clear(s.refused)
	s.bucket = d.Throttle
	dec := d.Decrease
	for _, r := range d.Remove {
		in := s.instances[r.ID]
		if in == nil || in.acquired != 0 || in.phase >= PhaseRemoving {
			continue // cannot happen under the lock; kept as the invariant's guard
		}
		s.account(in, -1)
		in.phase, in.removeReason = PhaseRemoving, r.Reason
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
	s.m.decisions.WithLabelValues(outcome).Inc()
	figs := [4]int{d.InUse, d.Need, d.Supply, d.Instances}
	if outcome != "hold" || figs != s.lastLogged {
		s.lastLogged = figs
		attrs := []any{"outcome", outcome, "policy", d.Policy, "in_use", d.InUse, "idle_target", d.IdleTarget,
			"need", d.Need, "supply", d.Supply, "instances", d.Instances, "increase", d.Increase, "reasons", d.Reasons}
		if len(d.Remove) > 0 {
			attrs = append(attrs, "remove", d.Remove)
		}
		s.log.Debug("decision", attrs...)
	}
	return d.Increase, dec
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
		s.m.instances.WithLabelValues(Phase(p).String()).Set(float64(n))
	}
	s.m.slots.WithLabelValues("acquired").Set(float64(len(s.acquisitions)))
	s.m.slots.WithLabelValues("reserved").Set(float64(len(s.reservations)))
	s.m.slots.WithLabelValues("idle").Set(float64(s.readyFree))
}

// Stats is a snapshot of the scaler, for operators and the simulator.
type Stats struct {
	Instances  [5]int // by Phase
	Requested  int
	Acquired   int
	Reserved   int
	ReadyFree  int // free slots on ready instances
	ReadySlots int // slots of ready instances, free or not
	IdleReady  int // ready instances with no acquired slot
	Busy       int // instances holding at least one job
}

// Stats returns a snapshot.
func (s *Scaler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Instances: s.phaseCount, Requested: len(s.requested), Acquired: len(s.acquisitions),
		Reserved: len(s.reservations), ReadyFree: s.readyFree}
	for _, in := range s.order {
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

// ---- run and shutdown ----

// Run ticks every TickInterval (sooner when a release or a waiting Acquire
// asks for it) until ctx ends or Shutdown is called. It returns nil after
// Shutdown, ctx's error otherwise. Call it once.
func (s *Scaler) Run(ctx context.Context) error {
	s.runMu.Lock()
	if s.runShut {
		s.runMu.Unlock()
		return nil
	}
	if s.running {
		s.runMu.Unlock()
		return errors.New("taskscaler: Run called twice")
	}
	s.running = true
	s.runDone = make(chan struct{})
	s.runMu.Unlock()
	defer close(s.runDone)
	for {
		s.Tick(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return nil
		case <-s.kick:
		case <-s.clock.After(s.opts.TickInterval):
		}
	}
}

// Shutdown stops the scaler: it stops scaling and refuses new
// reservations, waits (bounded by ctx) for acquired slots to be released,
// deletes every instance if delete_instances_on_shutdown — before the
// plugin is stopped — and finally calls the group's Shutdown. Deletion runs
// up to shutdown_deletion_retries rounds of Decrease, a pause of
// shutdown_deletion_interval and an Update, even when ctx has ended (its
// deadline bounds the wait for jobs, not the clean-up). Without deletion,
// the instances stay for the next start to adopt (with state storage).
func (s *Scaler) Shutdown(ctx context.Context) error {
	s.shutdownM.Lock()
	defer s.shutdownM.Unlock()
	if s.shutdown {
		return nil
	}
	s.shutdown = true
	s.mu.Lock()
	s.stopping = true
	for k := range s.reservations {
		delete(s.reservations, k)
	}
	s.broadcast()
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
	s.runMu.Lock()
	running, done := s.running, s.runDone
	s.runShut = true
	s.runMu.Unlock()
	if running {
		<-done
	}
	s.waitReleased(ctx)
	s.bgCancel()
	s.bg.Wait()

	var errs []error
	clean := context.WithoutCancel(ctx)
	if s.cfg.DeleteInstancesOnShutdown {
		if err := s.deleteAll(clean); err != nil {
			errs = append(errs, err)
		}
	}
	sctx, cancel := context.WithTimeout(clean, 30*time.Second)
	if err := s.group.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shutting down the instance group: %w", err))
	}
	cancel()
	s.mu.Lock()
	s.closeState()
	s.mu.Unlock()
	return errors.Join(errs...)
}

func (s *Scaler) waitReleased(ctx context.Context) {
	for {
		s.mu.Lock()
		n, ch := len(s.acquisitions), s.changed
		s.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.log.Warn("shutdown: jobs still hold slots", "slots", n)
			return
		case <-ch:
		}
	}
}

func (s *Scaler) deleteAll(ctx context.Context) error {
	if s.lease != nil && !s.owner {
		return fmt.Errorf("delete_instances_on_shutdown: %w", ErrNotOwner)
	}
	for round := 1; ; round++ {
		s.mu.Lock()
		var ids []string
		for _, in := range s.order {
			if in.phase != PhaseDeleting {
				if in.phase != PhaseRemoving {
					s.account(in, -1)
					in.phase, in.removeReason = PhaseRemoving, "shutdown"
					s.account(in, 1)
					s.record(ledger.Event{Op: ledger.OpRemoving, ID: in.id})
				}
				ids = append(ids, in.id)
			}
		}
		left := len(s.order)
		s.mu.Unlock()
		if left == 0 {
			s.log.Info("shutdown: all instances deleted")
			return nil
		}
		if round > s.cfg.ShutdownDeletionRetries {
			return fmt.Errorf("delete_instances_on_shutdown: %d instances still listed after %d rounds", left, s.cfg.ShutdownDeletionRetries)
		}
		if len(ids) > 0 {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			ok, err := s.group.Decrease(cctx, ids)
			cancel()
			s.log.Info("shutdown: deleting instances", "round", round, "asked", len(ids), "accepted", len(ok), "err", err)
		}
		<-s.clock.After(s.cfg.ShutdownDeletionInterval)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.observe(cctx)
		cancel()
	}
}
