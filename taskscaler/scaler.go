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
//	… a job: s.Claim(key)         // from here on the reservation is demand
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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/taskscaler/forecast"
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
	// Gone, if set, is called (in a goroutine of its own) with the ID of
	// each instance the scaler forgets because it is gone from the group,
	// so that what callers keep for it (connections) can go too.
	Gone func(id string)
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
	at     time.Time // when it was acquired
}

// Lost is closed if the instance disappears (deleted by someone else,
// reclaimed, timed out) while the job holds the slot; the job should fail.
func (a *Acquisition) Lost() <-chan struct{} { return a.lost }

type instance struct {
	id       string
	seq      uint64 // discovery order
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
	requestedAt  time.Time // when Increase asked for it (zero if unknown)
	removingAt   time.Time // when it was marked removing by a decision
	gone         bool
	wasReady     bool // adopted ready: skip the Readier
	// billedFrom is when this scaler began counting the instance's time
	// (Stats.InstanceSeconds): when it first saw it.
	billedFrom time.Time
	// With packing: its place in byLoad[load] while it can take a job.
	prev, next *instance
	load       int
	listed     bool
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

	mu        sync.Mutex
	instances map[string]*instance
	order     []*instance // discovery order (by seq)
	seq       uint64
	// hint: no instance in order[:hint] can take a job, so Acquire scans
	// from there. Lowered whenever an instance may have become able to.
	hint int
	// byLoad, with packing: ready instances that can take a job, by the
	// number of slots they hold, each list in order of arrival.
	byLoad []loadList
	// reservations are the keys reserved and holding no slot, each true
	// once it has a job (Claim, Acquire, TryAcquire): those, counted
	// in waiting, are demand. The others are the runner's asking the
	// coordinator for a job, which mostly brings none (demand only in
	// preemptive mode, see Decide).
	reservations map[string]bool
	waiting      int
	acquisitions map[string]*Acquisition
	refused      map[string]struct{}
	// queued is the coordinator's count of jobs this runner could take,
	// until queuedUntil (SetQueued).
	queued       int
	queuedUntil  time.Time
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
	lastLogged   [5]int
	// views is the decision's buffer of instance views (decide).
	views []InstanceView
	// warnedIdleTime is the idle_time last warned about (warnSlowBoots).
	warnedIdleTime time.Duration
	polls          peakWindow // polling reservations, for Decide's PollingPeak
	lastReady      time.Time  // when an instance last became ready (Decide's LastReady)
	// aggregates, kept by account()
	readyFree, liveFree int
	phaseCount          [5]int
	// Since the scaler started (Stats): instances it saw appear and go,
	// and the instance time of those gone.
	started     time.Time
	boots, gone int64
	pastSeconds float64

	ledger *ledger.Ledger
	lease  *ledger.Lease

	// model is the demand forecast (nil without prediction), saved to
	// modelPath (beside the ledger) every modelSaveEvery.
	model      *forecast.Model
	modelPath  string
	modelSaved time.Time
	modelMu    sync.Mutex // serialises saves

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
		instances: map[string]*instance{}, reservations: map[string]bool{},
		acquisitions: map[string]*Acquisition{}, refused: map[string]struct{}{},
		policies: pols, changed: make(chan struct{}), owner: true,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), started: opts.Clock.Now(),
	}
	if cfg.PackingOn() {
		s.byLoad = make([]loadList, s.params.Capacity)
	}
	if cfg.PredictionOn() {
		s.model = forecast.New(opts.DefaultLocation)
		spare, _ := cfg.Spare() // validated
		s.model.SetSpare(spare)
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

// CheckPolicies reports what is wrong with policies, as SetPolicies would
// find it, without setting them.
func CheckPolicies(ps []Policy) error {
	_, err := compilePolicies(ps, time.UTC)
	return err
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
	if s.model != nil {
		s.modelPath = filepath.Join(dir, name, "forecast")
		s.modelSaved = s.clock.Now()
		switch found, err := s.model.Load(s.modelPath); {
		case err != nil:
			s.log.Warn("forecast state unreadable: learning afresh", "err", err)
		case found:
			s.log.Info("forecast state loaded", "path", s.modelPath)
		}
	}
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
