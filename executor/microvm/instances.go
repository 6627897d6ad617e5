package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/runnerapi"
)

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
	opts InstancesOptions

	mu    sync.Mutex
	hosts map[string]*vmHost // by instance ID
}

type vmHost struct {
	conn *connector.Client
	p    *Provider
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
	// The configuration is checked once, here, not per instance.
	if _, err := New(Options{Config: config.MicroVM{NestingHost: o.Config.NestingHost, NestingConfig: o.Config.NestingConfig, Image: o.Config.Image}}); err != nil {
		return nil, err
	}
	return &Instances{opts: o, hosts: map[string]*vmHost{}}, nil
}

// host returns the instance's connection and provider, made (or made
// again, after the connection broke) on first use.
func (x *Instances) host(ctx context.Context, id string, info fleeting.ConnectInfo) (*vmHost, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h, ok := x.hosts[id]; ok {
		select {
		case <-h.conn.Done():
			_ = h.p.Shutdown(context.WithoutCancel(ctx))
			delete(x.hosts, id)
		default:
			return h, nil
		}
	}
	copts := x.opts.Connector
	copts.Logger = x.opts.Logger
	conn, err := connector.Dial(ctx, info, copts)
	if err != nil {
		return nil, err
	}
	c := x.opts.Config
	p, err := New(Options{
		Config: config.MicroVM{NestingHost: c.NestingHost, NestingConfig: c.NestingConfig, Image: c.Image},
		Dial:   conn.Dial, Name: "instance", Logger: x.opts.Logger.With("instance", id),
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	h := &vmHost{conn: conn, p: p}
	x.hosts[id] = h
	return h, nil
}

// Ready implements autoscaler.InstanceReadier, as GitLab's runner readies
// an instance with vm_isolation: List on its nesting daemon (initializing
// it when it is not), then delete every VM found — a new instance has
// none, an instance taken over from a previous runner manager has its
// stale ones.
func (x *Instances) Ready(ctx context.Context, info fleeting.ConnectInfo) error {
	h, err := x.host(ctx, info.ID, info)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	nc, err := h.p.nestingClient(ctx)
	if err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	vms, err := nc.ListInitialized(ctx, h.p.cfg)
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
func (x *Instances) Forget(id string) {
	x.mu.Lock()
	h := x.hosts[id]
	delete(x.hosts, id)
	x.mu.Unlock()
	if h != nil {
		_ = h.p.Shutdown(context.Background())
		h.conn.Close()
	}
}

// Executor implements autoscaler.Instances.
func (x *Instances) Executor(ctx context.Context, inst autoscaler.Instance) (executor.Executor, error) {
	h, err := x.host(ctx, inst.ID, inst.ConnectInfo)
	if err != nil {
		return nil, err
	}
	return h.p.Create(ctx)
}

// Describe implements autoscaler.Instances.
func (x *Instances) Describe(info *runnerapi.Info) {
	info.Executor = "instance"
	info.Shell = "bash"
	executor.RunnerFeatures(&info.Features)
	info.Features.Image = true
	info.Features.Cancelable = true
}

// IsolationLevels implements autoscaler.Instances.
func (x *Instances) IsolationLevels() []executor.Isolation {
	return []executor.Isolation{Level(x.opts.Config.NestingConfig)}
}

// Shutdown closes every instance's connection.
func (x *Instances) Shutdown(ctx context.Context) error {
	x.mu.Lock()
	hosts := x.hosts
	x.hosts = map[string]*vmHost{}
	x.mu.Unlock()
	var err error
	for _, h := range hosts {
		err = errors.Join(err, h.p.Shutdown(ctx))
		h.conn.Close()
	}
	return err
}
