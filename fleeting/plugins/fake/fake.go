// Package fake is a simulated cloud behind the fleeting contract: instances
// that take a while to boot, requests that fail, instances that never come
// up or vanish, a quota. It runs in-process with an injected clock (the
// autoscaler's simulator drives it in virtual time) or as the plugin binary
// fleeting-plugin-fake.
//
// Time only moves when the clock says so: every state is computed from
// Clock.Now() when asked, so the group needs no timers and a virtual clock
// needs only Now. Randomness comes from one source seeded by Config.Seed,
// drawn in call order, so a run is reproducible.
package fake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/berthci/berth/fleeting"
)

// Clock tells the time. A simulator's virtual clock satisfies it.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// ErrInjected is wrapped by every failure the fake injects.
var ErrInjected = errors.New("injected failure")

// Group is a simulated instance group. Its exported fields are the plugin
// configuration (decoded from plugin_config by the SDK); use New in-process.
type Group struct {
	Config

	mu          sync.Mutex
	clock       Clock
	rng         *rand.Rand
	initialized bool
	settings    fleeting.Settings
	logger      *slog.Logger
	next        int
	instances   map[string]*instance
	order       []string // creation order
	failNext    []error
}

type instance struct {
	id        string
	n         int
	created   time.Time
	runningAt time.Time
	neverRuns bool
	vanishAt  time.Time
	vanishes  bool
	deleteAt  time.Time
	deleting  bool
	unhealthy bool
}

var _ fleeting.InstanceGroup = (*Group)(nil)

// New returns a simulated group with cfg and clock (nil: the real clock).
func New(cfg Config, clock Clock) *Group {
	return &Group{Config: cfg, clock: clock}
}

// Init implements fleeting.InstanceGroup.
func (g *Group) Init(ctx context.Context, logger *slog.Logger, settings fleeting.Settings) (fleeting.ProviderInfo, error) {
	if err := ctx.Err(); err != nil {
		return fleeting.ProviderInfo{}, err
	}
	if err := g.Config.Validate(); err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("fake plugin config: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.clock == nil {
		g.clock = realClock{}
	}
	if g.Name == "" {
		g.Name = "fake"
	}
	if !g.initialized {
		g.rng = rand.New(rand.NewPCG(g.Seed, g.Seed^0x9e3779b97f4a7c15))
		g.instances = map[string]*instance{}
		g.initialized = true
	}
	if settings.Protocol == "" {
		settings.Protocol = fleeting.ProtocolSSH
	}
	if settings.OS == "" {
		settings.OS = "linux"
	}
	if settings.Arch == "" {
		settings.Arch = "amd64"
	}
	g.settings = settings
	g.logger = logger
	return fleeting.ProviderInfo{ID: "fake/" + g.Name, MaxSize: g.MaxSize}, nil
}

func (g *Group) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !g.initialized {
		return fleeting.ErrNotInitialized
	}
	return nil
}

// state returns the state of in at now, and whether it is still listed.
func (in *instance) state(now time.Time) (fleeting.State, bool) {
	switch {
	case in.deleting:
		if !now.Before(in.deleteAt) {
			return fleeting.StateDeleted, false
		}
		return fleeting.StateDeleting, true
	case in.vanishes && !now.Before(in.vanishAt):
		return "", false
	case in.neverRuns || now.Before(in.runningAt):
		return fleeting.StateCreating, true
	default:
		return fleeting.StateRunning, true
	}
}

// Update implements fleeting.InstanceGroup. An instance whose deletion
// completed is reported deleted once, then forgotten; one that vanished is
// forgotten without a word.
func (g *Group) Update(ctx context.Context, fn func(string, fleeting.State)) error {
	g.mu.Lock()
	if err := g.check(ctx); err != nil {
		g.mu.Unlock()
		return err
	}
	now := g.clock.Now()
	type report struct {
		id    string
		state fleeting.State
	}
	var out []report
	for _, id := range slices.Clone(g.order) {
		in := g.instances[id]
		st, listed := in.state(now)
		if !listed {
			g.forget(id)
			if st == "" {
				g.logger.Info("instance vanished", "instance", id)
				continue
			}
		}
		out = append(out, report{id, st})
	}
	g.mu.Unlock()
	for _, r := range out {
		fn(r.id, r.state)
	}
	return nil
}

func (g *Group) forget(id string) {
	delete(g.instances, id)
	g.order = slices.DeleteFunc(g.order, func(s string) bool { return s == id })
}

// Increase implements fleeting.InstanceGroup.
func (g *Group) Increase(ctx context.Context, n int) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, nil
	}
	if len(g.failNext) > 0 {
		err := g.failNext[0]
		g.failNext = g.failNext[1:]
		return 0, fmt.Errorf("fake: increase by %d: %w", n, err)
	}
	if g.IncreaseErrorRate > 0 && g.rng.Float64() < g.IncreaseErrorRate {
		return 0, fmt.Errorf("fake: increase by %d: %w", n, ErrInjected)
	}
	now := g.clock.Now()
	g.dropFinished(now)
	fit := n
	if g.MaxSize > 0 {
		fit = min(n, g.MaxSize-len(g.instances))
	}
	if fit <= 0 {
		return 0, fmt.Errorf("fake: increase by %d with %d of %d instances: %w", n, len(g.instances), g.MaxSize, fleeting.ErrQuotaExceeded)
	}
	for range fit {
		g.next++
		in := &instance{id: fmt.Sprintf("%s-%d", g.Name, g.next), n: g.next, created: now}
		in.runningAt = now.Add(g.BootLatency.Sample(g.rng))
		in.neverRuns = g.NeverRunningRate > 0 && g.rng.Float64() < g.NeverRunningRate
		if g.VanishRate > 0 && g.rng.Float64() < g.VanishRate {
			in.vanishes = true
			in.vanishAt = in.runningAt.Add(g.VanishAfter.Sample(g.rng))
		}
		g.instances[in.id] = in
		g.order = append(g.order, in.id)
	}
	return fit, nil
}

// dropFinished forgets instances whose deletion completed, so they free
// quota even if no Update ran in between.
func (g *Group) dropFinished(now time.Time) {
	for _, id := range slices.Clone(g.order) {
		if _, listed := g.instances[id].state(now); !listed {
			g.forget(id)
		}
	}
}

// Decrease implements fleeting.InstanceGroup.
func (g *Group) Decrease(ctx context.Context, ids []string) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return nil, err
	}
	now := g.clock.Now()
	var ok []string
	for _, id := range ids {
		in, found := g.instances[id]
		if !found || in.deleting {
			continue
		}
		if _, listed := in.state(now); !listed {
			continue
		}
		in.deleting = true
		in.deleteAt = now.Add(g.DeleteLatency.Sample(g.rng))
		ok = append(ok, id)
	}
	return ok, nil
}

func (g *Group) lookup(id string) (*instance, error) {
	in, ok := g.instances[id]
	if ok {
		if _, listed := in.state(g.clock.Now()); listed {
			return in, nil
		}
	}
	return nil, &fleeting.InstanceError{ID: id, Err: fleeting.ErrInstanceNotFound}
}

// ConnectInfo implements fleeting.InstanceGroup. Addresses are in
// 198.18.0.0/15 (reserved for benchmarks): nothing answers there.
func (g *Group) ConnectInfo(ctx context.Context, id string) (fleeting.ConnectInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return fleeting.ConnectInfo{}, err
	}
	in, err := g.lookup(id)
	if err != nil {
		return fleeting.ConnectInfo{}, err
	}
	addr := fmt.Sprintf("198.%d.%d.%d", 18+(in.n>>16)%2, (in.n>>8)&0xff, in.n&0xff)
	return fleeting.ConnectInfo{
		ConnectorConfig: g.settings.ConnectorConfig,
		ID:              id,
		InternalAddr:    addr,
	}, nil
}

// Heartbeat implements fleeting.InstanceGroup.
func (g *Group) Heartbeat(ctx context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return err
	}
	in, err := g.lookup(id)
	if err != nil {
		return err
	}
	if in.unhealthy {
		return &fleeting.InstanceError{ID: id, Err: fleeting.ErrInstanceUnhealthy}
	}
	return nil
}

// Shutdown implements fleeting.InstanceGroup. Instances stay.
func (g *Group) Shutdown(ctx context.Context) error { return ctx.Err() }

// Scripting, for simulators and tests.

// FailIncrease makes the next len(errs) Increase calls fail with these
// errors, in order, before any random failure is drawn.
func (g *Group) FailIncrease(errs ...error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failNext = append(g.failNext, errs...)
}

// Vanish makes instance id disappear now, as a reclaimed spot instance.
func (g *Group) Vanish(id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	in, err := g.lookup(id)
	if err != nil {
		return err
	}
	in.vanishes, in.vanishAt = true, g.clock.Now()
	in.deleting = false
	return nil
}

// SetUnhealthy makes Heartbeat report instance id unhealthy (or healthy
// again).
func (g *Group) SetUnhealthy(id string, unhealthy bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	in, err := g.lookup(id)
	if err != nil {
		return err
	}
	in.unhealthy = unhealthy
	return nil
}

// SetMaxSize changes the quota; instances above it are kept.
func (g *Group) SetMaxSize(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.MaxSize = n
}

// Instance is a snapshot of one simulated instance.
type Instance struct {
	ID      string
	State   fleeting.State
	Created time.Time
	// RunningAt is when it is (or was) running, unless NeverRuns.
	RunningAt time.Time
	NeverRuns bool
}

// Billed is how many instances the cloud bills now — from their request
// to the end of their deletion: not those deleted or vanished — and how
// many were ever created; Instances without a copy of the list.
func (g *Group) Billed() (billed, created int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	for _, id := range g.order {
		if st, _ := g.instances[id].state(now); st != "" && st != fleeting.StateDeleted {
			billed++
		}
	}
	return billed, g.next
}

// Instances returns the instances as Update would report them now, without
// forgetting deleted ones.
func (g *Group) Instances() []Instance {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.initialized {
		return nil
	}
	now := g.clock.Now()
	var out []Instance
	for _, id := range g.order {
		in := g.instances[id]
		st, listed := in.state(now)
		if !listed && st == "" {
			continue
		}
		out = append(out, Instance{ID: id, State: st, Created: in.created, RunningAt: in.runningAt, NeverRuns: in.neverRuns})
	}
	return out
}
