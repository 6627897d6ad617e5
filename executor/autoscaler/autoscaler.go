// Package autoscaler is the executor provider of Berth's autoscaled
// executors (instance and docker-autoscaler): it runs the jobs of one
// [[runners]] entry on the instances of a fleeting instance group that
// taskscaler scales, one slot of one instance per job, the way GitLab's
// runner uses taskscaler:
//
//	runner:  Reserve(key) ──► jobs/request ──► no job: Unreserve(key)
//	                                  │
//	                                  ▼ a job: Claim(key)
//	executor: Prepare: Acquire(key) ──► (instance, slot) ──► Instances.Executor ──► its Prepare
//	          Run:     the instance executor's Run, stopped if the instance is lost
//	          Cleanup: its Cleanup, then Release(key)
//
// What runs a job on an acquired slot is an Instances (executor/instance:
// stages over SSH; executor/dockerautoscaler: containers through the
// instance's Docker engine). The provider owns the scaler and, through it,
// the instance group: Shutdown stops both.
//
// Besides reservations, the scaler sees demand through the coordinator's
// queue insight, which the runner reports (executor.DemandSink): jobs
// waiting that this runner could take, so that instances are started for a
// burst before requests fail for lack of capacity.
package autoscaler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/taskscaler"
	"github.com/berthci/berth/taskscaler/readycommand"
)

// ErrInstanceLost is the cause of a stage stopped because its instance
// disappeared (deleted by someone else, reclaimed, timed out).
var ErrInstanceLost = errors.New("instance removed while the job ran")

// Instance is an acquired slot of an instance: what an Instances runs one
// job on.
type Instance struct {
	ID string
	// Slot is the job's slot on the instance, 0..capacity_per_instance-1.
	Slot int
	// Use is which job this is on the instance (1 for the first).
	Use int
	// ConnectInfo is how to reach the instance.
	ConnectInfo fleeting.ConnectInfo
}

// Instances runs jobs on acquired instance slots.
type Instances interface {
	// Executor returns a new executor, in the created state, for one job
	// on inst. Its Prepare gets the job's PrepareOptions with
	// ConcurrencyID set to the slot.
	Executor(ctx context.Context, inst Instance) (executor.Executor, error)
	// Describe fills in what the runner advertises (executor name,
	// shell, features).
	Describe(info *runnerapi.Info)
	// IsolationLevels are the levels of a job sharing an instance with
	// others (the provider reports IsolationInstance on its own when
	// every job gets an instance of its own).
	IsolationLevels() []executor.Isolation
}

// InstanceReadier is an optional capability of an Instances: it readies a
// new instance after instance_ready_command (docker-autoscaler checks the
// Docker engine); an error fails the ready-up attempt.
type InstanceReadier interface {
	Ready(ctx context.Context, info fleeting.ConnectInfo) error
}

// Forgetter is an optional capability of an Instances: Forget drops what
// it keeps for an instance that is gone (connections, clients).
type Forgetter interface {
	Forget(id string)
}

// Options configure a Provider.
type Options struct {
	// Config is [runners.autoscaler]; New applies its defaults.
	Config taskscaler.Config
	// Group is the instance group (a started fleeting plugin). The
	// provider owns it from New on, also when New fails.
	Group fleeting.InstanceGroup
	// Instances runs the jobs. Required.
	Instances Instances
	// Name names the scaler's state directory (the runner's short token).
	Name string
	// Connector are the connector's options for ready-up (external
	// addresses, host keys).
	Connector connector.Options
	// Logger and Registerer (metrics; nil: not registered).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Provider is the executor provider of one autoscaled [[runners]] entry.
type Provider struct {
	opts   Options
	scaler *taskscaler.Scaler
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

var (
	_ executor.Provider   = (*Provider)(nil)
	_ executor.Reserver   = (*Provider)(nil)
	_ executor.Claimer    = (*Provider)(nil)
	_ executor.Describer  = (*Provider)(nil)
	_ executor.Isolator   = (*Provider)(nil)
	_ executor.Shutdowner = (*Provider)(nil)
	_ executor.DemandSink = (*Provider)(nil)
)

// New starts the scaler on opts.Group (Init, state storage, a first
// Update) and its loop. ctx bounds the start only.
func New(ctx context.Context, opts Options) (*Provider, error) {
	if opts.Instances == nil || opts.Group == nil {
		return nil, errors.New("autoscaler: Options.Instances and Options.Group are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	log := opts.Logger
	readier := readiers{&readycommand.Readier{Command: opts.Config.InstanceReadyCommand, Options: opts.Connector, Logger: log}}
	if r, ok := opts.Instances.(InstanceReadier); ok {
		readier = append(readier, r)
	}
	var gone func(string)
	if f, ok := opts.Instances.(Forgetter); ok {
		gone = f.Forget
	}
	s, err := taskscaler.New(ctx, opts.Group, opts.Config, taskscaler.Options{
		Logger: log.With("component", "taskscaler"), Registerer: opts.Registerer, Readier: readier, Name: opts.Name, Gone: gone,
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p := &Provider{opts: opts, scaler: s, log: log, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = s.Run(runCtx)
	}()
	cfg := s.Config()
	log.Info("autoscaler started", "group", s.Group().ID, "max_instances", cfg.MaxInstances,
		"capacity_per_instance", cfg.CapacityPerInstance, "max_use_count", cfg.MaxUseCount)
	return p, nil
}

// readiers ready an instance with each in turn.
type readiers []interface {
	Ready(ctx context.Context, info fleeting.ConnectInfo) error
}

func (r readiers) Ready(ctx context.Context, info fleeting.ConnectInfo) error {
	for _, x := range r {
		if err := x.Ready(ctx, info); err != nil {
			return err
		}
	}
	return nil
}

// demandFreshness is how long a demand report counts: the runner reports
// every few seconds.
const demandFreshness = 10 * time.Second

// SetDemand implements executor.DemandSink: jobs waiting in the
// coordinator that this runner could take count as demand for a while.
func (p *Provider) SetDemand(waiting int) { p.scaler.SetQueued(waiting, demandFreshness) }

// Scaler is the provider's scaler (its statistics, for berth up and tests).
func (p *Provider) Scaler() *taskscaler.Scaler { return p.scaler }

// SetPolicies replaces the scaler's policies in place (a reload of
// config.toml that changed them alone): instances and jobs stay.
func (p *Provider) SetPolicies(ps []taskscaler.Policy) error { return p.scaler.SetPolicies(ps) }

// Fleet implements executor.FleetReporter from the scaler's statistics.
func (p *Provider) Fleet() runnerapi.Fleet {
	st := p.scaler.Stats()
	return runnerapi.Fleet{
		Creating: st.Instances[taskscaler.PhaseCreating], Booted: st.Instances[taskscaler.PhaseBooted],
		Ready: st.Instances[taskscaler.PhaseReady], Removing: st.Instances[taskscaler.PhaseRemoving],
		Deleting: st.Instances[taskscaler.PhaseDeleting], MaxInstances: st.MaxInstances, Capacity: st.Capacity,
		SlotsInUse: st.Acquired, SlotsIdle: st.ReadyFree, IdleInstances: st.IdleReady, Waiting: st.Waiting,
		Since: st.Started.UTC(), Boots: st.Boots, Deletions: st.Deletions, InstanceSeconds: st.InstanceSeconds,
		Plugin: p.scaler.Config().Plugin,
	}
}

// Reserve implements executor.Reserver.
func (p *Provider) Reserve(_ context.Context, key string) error {
	err := p.scaler.Reserve(key)
	if errors.Is(err, taskscaler.ErrNoCapacity) || errors.Is(err, taskscaler.ErrStopping) || errors.Is(err, taskscaler.ErrNotOwner) {
		return fmt.Errorf("%w: %w", executor.ErrNoCapacity, err)
	}
	return err
}

// Headroom implements executor.HeadroomReporter.
func (p *Provider) Headroom() int { return p.scaler.Headroom() }

// Unreserve implements executor.Reserver: it drops a reservation that
// holds no slot (a slot is released by the executor's Cleanup).
func (p *Provider) Unreserve(key string) { p.scaler.Unreserve(key) }

// Claim implements executor.Claimer: the reservation has a job, which the
// scaler counts as demand from now on.
func (p *Provider) Claim(key string) { p.scaler.Claim(key) }

// Create implements executor.Provider.
func (p *Provider) Create(context.Context) (executor.Executor, error) {
	return &Executor{p: p}, nil
}

// Describe implements executor.Describer.
func (p *Provider) Describe(info *runnerapi.Info) { p.opts.Instances.Describe(info) }

// IsolationLevels implements executor.Isolator: a whole instance per job
// (capacity_per_instance = 1 and max_use_count = 1) is the instance level;
// otherwise what the Instances gives a job sharing an instance.
func (p *Provider) IsolationLevels() []executor.Isolation {
	cfg := p.scaler.Config()
	if cfg.CapacityPerInstance == 1 && cfg.MaxUseCount == 1 {
		return []executor.Isolation{executor.IsolationInstance}
	}
	return p.opts.Instances.IsolationLevels()
}

// Shutdown implements executor.Shutdowner: the scaler waits (bounded by
// ctx) for jobs to release their slots, deletes the instances if
// delete_instances_on_shutdown, and shuts the instance group down.
func (p *Provider) Shutdown(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		err = p.scaler.Shutdown(ctx)
		p.cancel()
		<-p.done
		if s, ok := p.opts.Instances.(executor.Shutdowner); ok {
			err = errors.Join(err, s.Shutdown(ctx))
		}
	})
	return err
}

// Executor is one job on an instance slot.
type Executor struct {
	p *Provider

	mu      sync.Mutex
	key     string
	acq     *taskscaler.Acquisition
	inner   executor.Executor
	cleaned bool
}

var _ executor.Executor = (*Executor)(nil)

// Prepare implements executor.Executor: it waits for a slot
// (instance_acquire_timeout), then prepares the job's environment on the
// instance. A failure to use the instance counts towards its
// failure_threshold.
func (e *Executor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	if e.key != "" || e.cleaned {
		e.mu.Unlock()
		return executor.Environment{}, errors.New("prepare: executor already prepared or cleaned up")
	}
	key := o.Reservation
	if key == "" {
		key = "job-" + randomHex(8)
	}
	e.key = key
	e.mu.Unlock()
	out := o.Output
	if out == nil {
		out = discard{}
	}
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing: %w", err)
	}
	fmt.Fprintf(out, "Preparing instance...\n")
	began := time.Now()
	acq, err := e.p.scaler.Acquire(ctx, key)
	if err != nil {
		return executor.Environment{}, fmt.Errorf("acquiring an instance slot: %w", err)
	}
	e.mu.Lock()
	e.acq = acq
	e.mu.Unlock()
	cfg := e.p.scaler.Config()
	var addrs []string
	if cfg.LogInternalIP && acq.ConnectInfo.InternalAddr != "" {
		addrs = append(addrs, "internal IP "+acq.ConnectInfo.InternalAddr)
	}
	if cfg.LogExternalIP && acq.ConnectInfo.ExternalAddr != "" {
		addrs = append(addrs, "external IP "+acq.ConnectInfo.ExternalAddr)
	}
	where := ""
	if len(addrs) > 0 {
		where = " (" + strings.Join(addrs, ", ") + ")"
	}
	fmt.Fprintf(out, "Using instance %s%s, slot %d, job %d on it, after %s\n", acq.InstanceID, where, acq.Slot, acq.Use, time.Since(began).Round(time.Millisecond))
	inner, err := e.p.opts.Instances.Executor(ctx, Instance{ID: acq.InstanceID, Slot: acq.Slot, Use: acq.Use, ConnectInfo: acq.ConnectInfo})
	if err != nil {
		e.failed(err)
		return executor.Environment{}, fmt.Errorf("instance %s: %w", acq.InstanceID, err)
	}
	e.mu.Lock()
	e.inner = inner
	e.mu.Unlock()
	o.ConcurrencyID = acq.Slot
	o.Reservation = key
	sctx, stop := e.stageContext(ctx)
	defer stop()
	env, err := inner.Prepare(sctx, o)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, executor.ErrImagePull) && !errors.Is(err, executor.ErrNotAllowed) {
			e.failed(err)
		}
		return executor.Environment{}, fmt.Errorf("instance %s: %w", acq.InstanceID, e.lostOr(sctx, err))
	}
	return env, nil
}

// failed reports that the job could not use its instance.
func (e *Executor) failed(err error) {
	if rerr := e.p.scaler.ReportFailure(e.key, err); rerr != nil {
		e.p.log.Debug("reporting an instance failure", "err", rerr)
	}
}

// stageContext is ctx, also canceled (with ErrInstanceLost) when the
// instance is lost.
func (e *Executor) stageContext(ctx context.Context) (context.Context, func()) {
	e.mu.Lock()
	acq := e.acq
	e.mu.Unlock()
	sctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-acq.Lost():
			cancel(fmt.Errorf("%w: instance %s", ErrInstanceLost, acq.InstanceID))
		case <-stop:
		case <-sctx.Done():
		}
	}()
	return sctx, func() {
		close(stop)
		cancel(nil)
	}
}

// lostOr is err, or the loss of the instance when that stopped the work.
func (e *Executor) lostOr(sctx context.Context, err error) error {
	if cause := context.Cause(sctx); errors.Is(cause, ErrInstanceLost) {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// Run implements executor.Executor.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	inner, cleaned := e.inner, e.cleaned
	e.mu.Unlock()
	if inner == nil || cleaned {
		return fmt.Errorf("stage %s: %w", cmd.Stage, executor.ErrNotPrepared)
	}
	sctx, stop := e.stageContext(ctx)
	defer stop()
	err := inner.Run(sctx, cmd)
	if err != nil && ctx.Err() == nil {
		return e.lostOr(sctx, err)
	}
	return err
}

// Snapshot implements executor.Snapshotter when the environment on the
// instance can be saved (a VM of vm_isolation).
func (e *Executor) Snapshot(ctx context.Context, o executor.SnapshotOptions, w io.Writer) error {
	e.mu.Lock()
	inner, cleaned := e.inner, e.cleaned
	e.mu.Unlock()
	if inner == nil || cleaned {
		return fmt.Errorf("snapshot: %w", executor.ErrNotPrepared)
	}
	sn, ok := inner.(executor.Snapshotter)
	if !ok {
		return executor.ErrNoSnapshots
	}
	return sn.Snapshot(ctx, o, w)
}

// Cleanup implements executor.Executor: the environment on the instance,
// then the slot.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	if e.cleaned {
		e.mu.Unlock()
		return nil
	}
	e.cleaned = true
	inner, key := e.inner, e.key
	e.mu.Unlock()
	var err error
	if inner != nil {
		err = inner.Cleanup(ctx)
	}
	if key != "" {
		if rerr := e.p.scaler.Release(key); rerr != nil && !errors.Is(rerr, taskscaler.ErrUnknownKey) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
