// Package dockerautoscaler is the docker-autoscaler executor: each job runs
// in containers on a slot of an autoscaled instance (executor/autoscaler),
// with the docker executor's behaviour (executor/docker), the Engine API of
// the instance's Docker reached through the fleeting connector: every API
// connection is a channel of the instance's SSH connection to the engine's
// socket (direct-streamlocal, the native tunnel of GitLab's runner; OpenSSH
// allows it by default), so the engine is never exposed on the network.
//
// Containers carry the slot in their names and labels
// (runner-<short>-project-<id>-concurrent-<slot>-…). The berth helper is
// copied once per instance into a Docker volume through the Engine API, so
// the instance needs nothing but a Docker engine and an SSH server.
//
// With slot cgroups, a job's build and service containers run under the
// slot's cgroup (--cgroup-parent) with the configured limits, created on
// the instance over SSH before the job's containers start; an
// out-of-memory kill in the slot is reported in the job log.
package dockerautoscaler

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/docker/docker/client"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "docker-autoscaler"

// DefaultSocket is the engine's socket on instances when [runners.docker]
// host is not set.
const DefaultSocket = "/var/run/docker.sock"

// Options configure the docker-autoscaler executor.
type Options struct {
	// Config is [runners.docker]; its host is the engine's address on the
	// instance (unix:///path or tcp://host:port; default the socket).
	Config econfig.Docker
	// Helper, StateDir, KillGrace: as docker.Options.
	Helper    string
	StateDir  string
	KillGrace time.Duration
	// Connector are the connector's options (use_external_addr, host
	// key policy).
	Connector connector.Options
	// SlotCgroups puts each slot's containers under its cgroup.
	SlotCgroups slotcgroup.Config
	Logger      *slog.Logger
}

// Instances runs jobs in containers on instances; it is the
// autoscaler.Instances of the docker-autoscaler executor.
type Instances struct {
	opts    Options
	network string // of the engine's address on the instance
	address string

	hosts autoscaler.Hosts[*host]
}

// host is one instance: its SSH connection and the docker provider whose
// client talks through it.
type host struct {
	conn     *connector.Client
	docker   *docker.Provider
	systemd  bool // the engine uses the systemd cgroup driver
	warnedSD atomic.Bool
}

// Shutdown implements autoscaler.Host.
func (h *host) Shutdown(ctx context.Context) error { return h.docker.Shutdown(ctx) }

var (
	_ autoscaler.Instances       = (*Instances)(nil)
	_ autoscaler.InstanceReadier = (*Instances)(nil)
)

// New checks opts.
func New(opts Options) (*Instances, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	netw, addr, err := engineAddress(opts.Config.Host)
	if err != nil {
		return nil, err
	}
	opts.SlotCgroups.Template = opts.SlotCgroups.SlotTemplate()
	if err := opts.SlotCgroups.Check(opts.Logger); err != nil {
		return nil, err
	}
	x := &Instances{opts: opts, network: netw, address: addr}
	x.hosts = autoscaler.Hosts[*host]{Connector: opts.Connector, Logger: opts.Logger, Make: x.makeHost}
	return x, nil
}

// engineAddress is where the engine listens on the instance.
func engineAddress(h string) (network, address string, err error) {
	if h == "" {
		return "unix", DefaultSocket, nil
	}
	u, err := url.Parse(h)
	if err != nil {
		return "", "", fmt.Errorf("docker.host %q: %w", h, err)
	}
	switch u.Scheme {
	case "unix":
		return "unix", cmp.Or(u.Path, u.Opaque), nil
	case "tcp":
		if u.Host == "" {
			return "", "", fmt.Errorf("docker.host %q: no host:port", h)
		}
		return "tcp", u.Host, nil
	}
	return "", "", fmt.Errorf("docker.host %q: want unix:///path or tcp://host:port (the engine's address on the instances)", h)
}

// makeHost makes the docker provider of an instance whose client talks
// through conn.
func (x *Instances) makeHost(ctx context.Context, id string, conn *connector.Client) (*host, error) {
	cli, err := client.NewClientWithOpts(
		client.WithHost("unix://"+DefaultSocket), // the dialer below decides where connections go
		client.WithDialContext(func(ctx context.Context, _, _ string) (net.Conn, error) {
			return conn.Dial(ctx, x.network, x.address)
		}),
		client.WithAPIVersionNegotiation(),
	)
	if err != nil {
		return nil, fmt.Errorf("docker client for instance %s: %w", id, err)
	}
	h := &host{conn: conn}
	dcfg := x.opts.Config
	dcfg.Host = ""
	o := docker.Options{
		Config: dcfg, Helper: x.opts.Helper, StateDir: x.opts.StateDir, KillGrace: x.opts.KillGrace,
		Logger: x.opts.Logger.With("instance", id), Client: cli, HelperVolume: true, Name: Name, Host: id,
	}
	if x.opts.SlotCgroups.Enabled {
		info, err := cli.Info(ctx)
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("instance %s: the Docker engine: %w", id, err)
		}
		h.systemd = info.CgroupDriver == "systemd"
		o.CgroupParent = func(slot int) (string, string) {
			b, _ := slotcgroup.Expand(x.opts.SlotCgroups.Template, slot)
			s, _ := slotcgroup.Expand(x.opts.SlotCgroups.ServiceTemplate(), slot)
			return b, s
		}
	}
	p, err := docker.New(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", id, err)
	}
	h.docker = p
	return h, nil
}

// Ready implements autoscaler.InstanceReadier: an instance is ready once
// its Docker engine answers through the connector.
func (x *Instances) Ready(ctx context.Context, info fleeting.ConnectInfo) error {
	if _, _, err := x.hosts.Get(ctx, info.ID, info); err != nil {
		return fmt.Errorf("ready-up of instance %s: %w", info.ID, err)
	}
	return nil
}

// Forget closes what is kept for an instance that is gone.
func (x *Instances) Forget(id string) { x.hosts.Forget(id) }

// Executor implements autoscaler.Instances.
func (x *Instances) Executor(ctx context.Context, inst autoscaler.Instance) (executor.Executor, error) {
	h, _, err := x.hosts.Get(ctx, inst.ID, inst.ConnectInfo)
	if err != nil {
		return nil, err
	}
	e, err := h.docker.Create(ctx)
	if err != nil {
		return nil, err
	}
	if !x.opts.SlotCgroups.Enabled {
		return e, nil
	}
	path, err := slotcgroup.Expand(x.opts.SlotCgroups.Template, inst.Slot)
	if err != nil {
		return nil, fmt.Errorf("slot_cgroup_template: %w", err)
	}
	return &slotExecutor{Executor: e, x: x, h: h, path: path}, nil
}

// slotExecutor is a docker executor whose containers run under a slot
// cgroup with limits.
type slotExecutor struct {
	executor.Executor
	x    *Instances
	h    *host
	path string
	ooms int
}

// Prepare sets the slot cgroup up on the instance, then prepares the
// containers under it.
func (e *slotExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	l := e.x.opts.SlotCgroups.Limits
	if e.h.systemd {
		if !l.IsZero() && e.h.warnedSD.CompareAndSwap(false, true) {
			e.x.opts.Logger.Warn("the instance's Docker engine uses the systemd cgroup driver: slot cgroup limits are left to its slice units", "template", e.x.opts.SlotCgroups.Template)
		}
	} else {
		out, err := e.sh(ctx, slotcgroup.SetupScript(e.path, l)+"\n"+slotcgroup.OOMKillsScript(e.path))
		if err != nil {
			return executor.Environment{}, fmt.Errorf("setting up slot cgroup %s: %w", e.path, err)
		}
		e.ooms = lastInt(out)
		if o.Output != nil {
			fmt.Fprintf(o.Output, "Running in %s\n", e.x.opts.SlotCgroups.Describe(e.path))
		}
	}
	env, err := e.Executor.Prepare(ctx, o)
	if err == nil {
		env.Variables = append(env.Variables, runnerapi.Variable{Key: "GITLAB_RUNNER_SLOT_CGROUP", Value: e.path, Public: true})
	}
	return env, err
}

// Run runs the stage and reports an out-of-memory kill in the slot.
func (e *slotExecutor) Run(ctx context.Context, cmd executor.Command) error {
	err := e.Executor.Run(ctx, cmd)
	if e.h.systemd {
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if out, serr := e.sh(sctx, slotcgroup.OOMKillsScript(e.path)); serr == nil {
		if n := lastInt(out); n > e.ooms {
			if cmd.Output != nil {
				fmt.Fprintf(cmd.Output, "\x1b[31;1mERROR: the job exceeded the memory limit of its %s: the kernel killed %d process(es) of it (out of memory)\x1b[0;m\n",
					e.x.opts.SlotCgroups.Describe(e.path), n-e.ooms)
			}
			e.ooms = n
		}
	}
	return err
}

// sh runs a POSIX sh script on the instance (sent on standard input).
func (e *slotExecutor) sh(ctx context.Context, script string) ([]byte, error) {
	var out, errb tail
	err := e.h.conn.Run(ctx, connector.Command{Cmd: "exec /bin/sh -s", Stdin: strings.NewReader(script), Stdout: &out, Stderr: &errb})
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(errb.b)))
	}
	return out.b, nil
}

// Describe implements autoscaler.Instances.
func (x *Instances) Describe(info *runnerapi.Info) {
	info.Executor = Name
	info.Shell = "bash"
	docker.Features(&info.Features)
}

// IsolationLevels implements autoscaler.Instances.
func (x *Instances) IsolationLevels() []executor.Isolation {
	return []executor.Isolation{executor.IsolationContainer}
}

// Shutdown closes every instance's connection and client.
func (x *Instances) Shutdown(ctx context.Context) error { return x.hosts.Shutdown(ctx) }

// lastInt is the integer on the last non-empty line of out, 0 if none.
func lastInt(out []byte) int {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(lines[len(lines)-1]))
	return n
}

// tail keeps the last 4 KiB written.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4<<10 {
		t.b = t.b[len(t.b)-4<<10:]
	}
	return len(p), nil
}

var _ io.Writer = (*tail)(nil)
