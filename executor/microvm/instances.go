package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/runnerapi"
)

// instanceExecutor is the runner executor that VM isolation belongs to
// (executor/instance's Name).
const instanceExecutor = "instance"

// InstancesOptions configure Instances.
type InstancesOptions struct {
	Config config.VMIsolation
	// Connector are the connector's options for the instances.
	Connector connector.Options
	Logger    *slog.Logger
}

// Instances runs each job of an instance executor in a VM of the nesting
// daemon on its instance ([runners.autoscaler.vm_isolation], as GitLab's
// runner does): the daemon and the VMs' agents are reached through the
// instance's connector. It is an autoscaler.Instances.
type Instances struct {
	opts  InstancesOptions
	hosts autoscaler.Hosts[*Provider]
}

var (
	_ autoscaler.Instances       = (*Instances)(nil)
	_ autoscaler.InstanceReadier = (*Instances)(nil)
	_ autoscaler.Forgetter       = (*Instances)(nil)
)

// NewInstances checks the configuration.
func NewInstances(o InstancesOptions) (*Instances, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if !o.Config.Enabled {
		return nil, errors.New("vm_isolation is not enabled")
	}
	if o.Config.NestingHost == "" {
		return nil, errors.New("vm_isolation.nesting_host is required: the nesting daemon's socket on the instances (unix:///path)")
	}
	c := config.MicroVM{NestingHost: o.Config.NestingHost, NestingConfig: o.Config.NestingConfig, Image: o.Config.Image}
	// The configuration is checked once, here, not per instance.
	if _, err := New(Options{Config: c}); err != nil {
		return nil, err
	}
	x := &Instances{opts: o}
	x.hosts = autoscaler.Hosts[*Provider]{Connector: o.Connector, Logger: o.Logger,
		Make: func(_ context.Context, id string, conn *connector.Client) (*Provider, error) {
			// The instance's daemon and its VMs' agents, through the
			// instance's connection.
			return New(Options{Config: c, Dial: conn.Dial, Name: instanceExecutor, Logger: o.Logger.With("instance", id)})
		}}
	return x, nil
}

// Ready implements autoscaler.InstanceReadier, as GitLab's runner readies
// an instance with vm_isolation: List on its nesting daemon (initializing
// it when it is not), then delete every VM found — a new instance has
// none, an instance taken over from a previous runner manager has its
// stale ones.
func (x *Instances) Ready(ctx context.Context, info fleeting.ConnectInfo) error {
	p, _, err := x.hosts.Get(ctx, info.ID, info)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	nc, err := p.nestingClient(ctx)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	vms, err := nc.ListInitialized(ctx, p.cfg)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: nesting: %w", info.ID, err)
	}
	for _, vm := range vms {
		if err := nc.Delete(ctx, vm.ID); err != nil && !errors.Is(err, nesting.ErrNotFound) {
			x.opts.Logger.Warn("deleting a stale VM", "instance", info.ID, "vm", vm.ID, "err", err)
		}
	}
	return nil
}

// Forget implements autoscaler.Forgetter.
func (x *Instances) Forget(id string) { x.hosts.Forget(id) }

// Executor implements autoscaler.Instances.
func (x *Instances) Executor(ctx context.Context, inst autoscaler.Instance) (executor.Executor, error) {
	p, _, err := x.hosts.Get(ctx, inst.ID, inst.ConnectInfo)
	if err != nil {
		return nil, err
	}
	return p.Create(ctx)
}

// Describe implements autoscaler.Instances.
func (x *Instances) Describe(info *runnerapi.Info) { describe(info, instanceExecutor) }

// IsolationLevels implements autoscaler.Instances.
func (x *Instances) IsolationLevels() []executor.Isolation {
	return []executor.Isolation{Level(x.opts.Config.NestingConfig)}
}

// Shutdown closes every instance's connection.
func (x *Instances) Shutdown(ctx context.Context) error { return x.hosts.Shutdown(ctx) }
