// Package instance is the instance executor: each job runs on a slot of an
// autoscaled instance (executor/autoscaler), its stages as shell scripts
// over SSH through the fleeting connector — the ssh executor's machinery
// (executor/ssh) with the instance as its host. The berth helper is
// uploaded once per instance (by checksum, under ~/.cache/berth/helper),
// and the build directory is per slot:
// <builds_dir>/<short token>/<slot>/<project path> on the instance.
//
// With slot cgroups (use_slot_cgroups), every stage of a job runs in its
// slot's cgroup on the instance, created with the configured CPU, memory
// and pids limits (executor/slotcgroup); whatever is left in it after a
// stage is killed, and an out-of-memory kill is reported in the job log.
// The job gets the cgroup's path as GITLAB_RUNNER_SLOT_CGROUP, as with
// GitLab.
package instance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/executor/ssh"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "instance"

// Options configure the instance executor.
type Options struct {
	// Helper is the local berth binary uploaded to instances (empty:
	// os.Executable()); a Linux build for the instances' architecture.
	Helper string
	// Connector are the connector's options (use_external_addr, host
	// key policy).
	Connector connector.Options
	// SlotCgroups puts each slot's processes in a cgroup.
	SlotCgroups slotcgroup.Config
	// KillGrace is how long a stopped stage gets between SIGTERM and
	// SIGKILL (0: 10 s).
	KillGrace time.Duration
	Logger    *slog.Logger
}

// Instances runs jobs on instances over SSH; it is the
// autoscaler.Instances of the instance executor.
type Instances struct {
	opts Options

	mu    sync.Mutex
	hosts map[string]*ssh.Provider // by instance ID
}

var _ autoscaler.Instances = (*Instances)(nil)

// New checks opts.
func New(opts Options) (*Instances, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.SlotCgroups.Template = opts.SlotCgroups.SlotTemplate()
	if err := opts.SlotCgroups.Check(opts.Logger); err != nil {
		return nil, err
	}
	return &Instances{opts: opts, hosts: map[string]*ssh.Provider{}}, nil
}

// host is the ssh provider of an instance, made once per instance.
func (x *Instances) host(inst autoscaler.Instance) (*ssh.Provider, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if p, ok := x.hosts[inst.ID]; ok {
		return p, nil
	}
	info := inst.ConnectInfo
	copts := x.opts.Connector
	copts.Logger = x.opts.Logger
	o := ssh.Options{
		Helper:      x.opts.Helper,
		Logger:      x.opts.Logger.With("instance", inst.ID),
		KillGrace:   x.opts.KillGrace,
		Keepalive:   -1, // the connector's keepalives watch the connection
		Target:      "instance " + inst.ID,
		MessageName: "Instance",
		Dial: func(ctx context.Context) (*xssh.Client, error) {
			c, err := connector.Dial(ctx, info, copts)
			if err != nil {
				return nil, err
			}
			return c.SSH(), nil
		},
	}
	if x.opts.SlotCgroups.Enabled {
		o.Cgroup = x.cgroup
	}
	p, err := ssh.New(o)
	if err != nil {
		return nil, err
	}
	x.hosts[inst.ID] = p
	return p, nil
}

// cgroup is the job's slot cgroup: ConcurrencyID is the slot.
func (x *Instances) cgroup(o executor.PrepareOptions) (*ssh.JobCgroup, error) {
	path, err := slotcgroup.Expand(x.opts.SlotCgroups.Template, o.ConcurrencyID)
	if err != nil {
		return nil, fmt.Errorf("slot_cgroup_template: %w", err)
	}
	l := x.opts.SlotCgroups.Limits
	return &ssh.JobCgroup{
		Describe: x.opts.SlotCgroups.Describe(path),
		Setup:    slotcgroup.SetupScript(path, l),
		Enter:    slotcgroup.EnterScript(path),
		Kill:     slotcgroup.KillScript(path),
		OOMKills: slotcgroup.OOMKillsScript(path),
	}, nil
}

// Executor implements autoscaler.Instances.
func (x *Instances) Executor(ctx context.Context, inst autoscaler.Instance) (executor.Executor, error) {
	p, err := x.host(inst)
	if err != nil {
		return nil, err
	}
	e, err := p.Create(ctx)
	if err != nil {
		return nil, err
	}
	if !x.opts.SlotCgroups.Enabled {
		return e, nil
	}
	path, err := slotcgroup.Expand(x.opts.SlotCgroups.Template, inst.Slot)
	if err != nil {
		return nil, err
	}
	return &withVariable{Executor: e, v: runnerapi.Variable{Key: "GITLAB_RUNNER_SLOT_CGROUP", Value: path, Public: true}}, nil
}

// withVariable adds a variable to the job's environment.
type withVariable struct {
	executor.Executor
	v runnerapi.Variable
}

func (w *withVariable) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	env, err := w.Executor.Prepare(ctx, o)
	if err == nil {
		env.Variables = append(env.Variables, w.v)
	}
	return env, err
}

// Snapshot implements executor.Snapshotter when the wrapped executor can.
func (w *withVariable) Snapshot(ctx context.Context, o executor.SnapshotOptions, out io.Writer) error {
	sn, ok := w.Executor.(executor.Snapshotter)
	if !ok {
		return executor.ErrNoSnapshots
	}
	return sn.Snapshot(ctx, o, out)
}

// Forget drops what is kept for an instance that is gone.
func (x *Instances) Forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.hosts, id)
}

// Describe implements autoscaler.Instances.
func (x *Instances) Describe(info *runnerapi.Info) {
	info.Executor = Name
	info.Shell = "bash"
	executor.RunnerFeatures(&info.Features)
}

// IsolationLevels implements autoscaler.Instances: a job sharing an
// instance is isolated by its slot cgroup, or not at all.
func (x *Instances) IsolationLevels() []executor.Isolation {
	if x.opts.SlotCgroups.Enabled {
		return []executor.Isolation{executor.IsolationCgroups}
	}
	return []executor.Isolation{executor.IsolationNone}
}
