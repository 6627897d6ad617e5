// Package docker is the docker executor: every job runs in containers of
// the Docker Engine (API 1.41 and later), the DESIGN's "container" level.
//
// A job gets one build container from its image (image:, else
// [runners.docker] image), created and started by Prepare and kept
// running until Cleanup; every stage — get_sources, caches, artifacts,
// step_script, after_script — runs inside it as a docker exec, so git and
// every other tool come from the job's image and there is no helper image.
// The berth binary (the helper, "berth helper …") is mounted read-only at
// HelperMount; a dynamically linked binary brings the host's loader and
// libraries along (see internal/bundle), so it runs in musl and busybox
// images too.
//
// Services (services: and [[runners.docker.services]]) run in containers
// of their own on a user-defined bridge network per job (unless
// network_mode is set), reachable by their aliases; the build container
// is "build" there. Prepare waits for their exposed ports (see
// waitForServices).
//
// Lifecycle of one job's resources:
//
//	Prepare:  image checks and pulls ─► network ─► volumes ─► services (created, started)
//	          ─► build container (created, started) ─► setup exec (shell, directories)
//	          ─► wait for services
//	Run:      exec of the stage wrapper (script written into TmpDir) ─► output streamed
//	          ─► leftovers of the stage killed by marker ─► exit status
//	Cleanup:  containers force-removed (with their anonymous volumes) ─► network removed;
//	          the builds and cache volumes stay
//
// Every container, network and volume carries the labels of names.go;
// Cleanup removes what carries its executor's instance label, so what a
// failed or canceled Prepare half-created goes too, and Sweep removes
// what a crashed runner manager left.
package docker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/internal/bundle"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "docker"

// Options configure a Provider.
type Options struct {
	// Config is [runners.docker].
	Config config.Docker
	// Helper is the berth binary on this host that jobs run as
	// "<Environment.Helper> helper …" ("": os.Executable()).
	Helper string
	// Logger receives the provider's own log lines (nil: discarded).
	Logger *slog.Logger
	// StateDir holds host-side files, such as the helper bundle; the
	// Docker daemon must see it at the same path ("": berth/docker under
	// os.UserCacheDir()).
	StateDir string
	// KillGrace is how long a canceled stage gets between SIGTERM and
	// SIGKILL (0: 10 s).
	KillGrace time.Duration
	// Client, if set, is the Docker client to use instead of connecting
	// from DOCKER_HOST or [runners.docker] host (docker-autoscaler: a
	// client whose connections go through the fleeting connector). The
	// provider owns it: Shutdown closes it.
	Client *client.Client
	// HelperVolume makes the helper bundle available to jobs in a Docker
	// volume filled through the Engine API, instead of a bind mount of
	// StateDir: for an engine on another host, which cannot see this
	// host's files.
	HelperVolume bool
	// CgroupParent, if set, returns the cgroup parents of a job's build
	// container and of its services from the job's concurrency id (its
	// slot): --cgroup-parent, as GitLab's slot cgroups do.
	CgroupParent func(slot int) (build, services string)
	// Name is the executor's name the runner reports ("docker" when
	// empty).
	Name string
	// Host names the machine of the engine (an autoscaled instance): it
	// labels what jobs create (com.berth.host) and keeps builds volumes of
	// instances that share one engine apart.
	Host string
}

// Provider creates docker executors. It holds one Docker client and is
// safe for concurrent use.
type Provider struct {
	cli       *client.Client
	set       *settings
	log       *slog.Logger
	helperDir string // host directory mounted at HelperMount
	helper    string // Environment.Helper
	killGrace time.Duration
	opts      Options

	// helperVolume is the volume holding the helper bundle (HelperVolume);
	// helperReady once it is known to be complete.
	helperMu     sync.Mutex
	helperVolume string
	helperReady  bool
}

var (
	_ executor.Provider   = (*Provider)(nil)
	_ executor.Describer  = (*Provider)(nil)
	_ executor.Shutdowner = (*Provider)(nil)
	_ executor.Sweeper    = (*Provider)(nil)
	_ executor.Isolator   = (*Provider)(nil)
)

// New checks o.Config (errors name the key), bundles the helper and
// connects to the Docker daemon: DOCKER_HOST and the other DOCKER_*
// variables, unless [runners.docker] host is set, with API version
// negotiation.
func New(ctx context.Context, o Options) (*Provider, error) {
	set, err := parseSettings(o.Config)
	if err != nil {
		return nil, fmt.Errorf("docker executor: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	grace := o.KillGrace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	bin := o.Helper
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("docker executor: finding the berth binary for the helper: %w", err)
		}
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return nil, fmt.Errorf("docker executor: helper: %w", err)
	}
	stateDir := o.StateDir
	if stateDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("docker executor: no state directory: %w", err)
		}
		stateDir = filepath.Join(base, "berth", "docker")
	}
	if stateDir, err = filepath.Abs(stateDir); err != nil {
		return nil, fmt.Errorf("docker executor: state directory: %w", err)
	}
	helperDir, err := bundle.Helper(bin, stateDir)
	if err != nil {
		return nil, fmt.Errorf("docker executor: %w", err)
	}
	cli := o.Client
	if cli == nil {
		opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
		if o.Config.Host != "" {
			opts = append(opts, client.WithHost(o.Config.Host))
		}
		if cli, err = client.NewClientWithOpts(opts...); err != nil {
			return nil, fmt.Errorf("docker executor: connecting to the Docker daemon: %w", err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ping, err := cli.Ping(pctx)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker executor: connecting to the Docker daemon at %s: %w", cli.DaemonHost(), err)
	}
	log.Debug("connected to the Docker daemon", "host", cli.DaemonHost(), "api", cli.ClientVersion(), "os", ping.OSType, "helper", helperDir)
	p := &Provider{cli: cli, set: set, log: log, helperDir: helperDir, helper: HelperMount + "/berth", killGrace: grace, opts: o}
	if o.HelperVolume {
		p.helperVolume = "berth-helper-" + strings.TrimPrefix(filepath.Base(helperDir), "helper-")
	}
	return p, nil
}

// Create implements executor.Provider.
func (p *Provider) Create(ctx context.Context) (executor.Executor, error) {
	return &Executor{p: p}, nil
}

// Describe implements executor.Describer.
func (p *Provider) Describe(info *runnerapi.Info) {
	info.Executor = cmp.Or(p.opts.Name, Name)
	info.Shell = "bash"
	Features(&info.Features)
}

// Features sets what a runner with containers offers: the runner's
// features, images and services.
func Features(f *runnerapi.Features) {
	executor.RunnerFeatures(f)
	f.Image = true
	f.Services = true
	f.ServiceVariables = true
	f.ServiceMultipleAliases = true
	f.ImageExecutorOpts = true
	f.ServiceExecutorOpts = true
}

// IsolationLevels implements executor.Isolator: every job runs in a
// container.
func (p *Provider) IsolationLevels() []executor.Isolation {
	return []executor.Isolation{executor.IsolationContainer}
}

// Shutdown implements executor.Shutdowner: it closes the Docker client.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.cli.Close(); err != nil {
		return fmt.Errorf("closing the Docker client: %w", err)
	}
	return nil
}

// Sweep implements executor.Sweeper: it force-removes every container
// (with its anonymous volumes) and network labelled as created for the
// runner o names (short token and system id) — what a runner manager
// that died without cleaning up left. The persistent builds and cache
// volumes stay. The runner manager calls it at start, before it asks for
// jobs, so none of these belong to a running job then.
func (p *Provider) Sweep(ctx context.Context, o executor.SweepOptions) error {
	if o.ShortToken == "" || o.SystemID == "" {
		return nil
	}
	f := filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelShortToken+"="+o.ShortToken),
		filters.Arg("label", LabelSystemID+"="+o.SystemID),
	)
	n, err := p.removeLabelled(ctx, f)
	if n > 0 {
		p.log.Warn("removed containers and networks left by a previous runner manager", "runner", o.ShortToken, "removed", n)
	}
	if err != nil {
		return fmt.Errorf("sweeping containers of runner %s: %w", o.ShortToken, err)
	}
	return nil
}

// RemoveVolumes removes the persistent volumes (builds and cache) of the
// runner o names, for a runner that goes away for good — such as the
// one-off runner of berth run. A volume still in use by a container is
// not removed and is reported in the error. Missing ones are no error.
func (p *Provider) RemoveVolumes(ctx context.Context, o executor.SweepOptions) error {
	if o.ShortToken == "" || o.SystemID == "" {
		return nil
	}
	vs, err := p.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelShortToken+"="+o.ShortToken),
		filters.Arg("label", LabelSystemID+"="+o.SystemID),
	)})
	if err != nil {
		return fmt.Errorf("listing volumes of runner %s: %w", o.ShortToken, err)
	}
	var errs []error
	for _, v := range vs.Volumes {
		if err := p.cli.VolumeRemove(ctx, v.Name, false); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("removing volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

// removeLabelled force-removes the containers, then the networks,
// matching f and returns how many it removed. Missing ones are no error.
func (p *Provider) removeLabelled(ctx context.Context, f filters.Args) (int, error) {
	var errs []error
	n := 0
	cs, err := p.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("listing containers: %w", err)
	}
	for _, c := range cs {
		if err := p.removeContainer(ctx, c.ID); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
	}
	ns, err := p.cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return n, errors.Join(append(errs, fmt.Errorf("listing networks: %w", err))...)
	}
	for _, nw := range ns {
		if err := p.removeNetwork(ctx, nw.ID, nw.Name); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
	}
	return n, errors.Join(errs...)
}

func (p *Provider) removeContainer(ctx context.Context, id string) error {
	err := p.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: !p.set.cfg.VolumeKeep})
	if err != nil && !client.IsErrNotFound(err) {
		return fmt.Errorf("removing container %.12s: %w", id, err)
	}
	return nil
}

func (p *Provider) removeNetwork(ctx context.Context, id, name string) error {
	err := p.cli.NetworkRemove(ctx, id)
	if err != nil && !client.IsErrNotFound(err) {
		return fmt.Errorf("removing network %s: %w", name, err)
	}
	return nil
}

// HostAddress returns an IP address of this host that containers on a
// bridge network reach: the gateway of Docker's default "bridge" network,
// or, when its IPAM configuration names none (Docker 20.10), the first
// IPv4 address of the bridge interface it names
// (com.docker.network.bridge.name, default docker0). It needs the daemon
// to run on this host.
func (p *Provider) HostAddress(ctx context.Context) (string, error) {
	nw, err := p.cli.NetworkInspect(ctx, "bridge", network.InspectOptions{})
	if err != nil {
		return "", fmt.Errorf("inspecting Docker's bridge network: %w", err)
	}
	for _, c := range nw.IPAM.Config {
		if ip := net.ParseIP(c.Gateway); ip != nil && ip.To4() != nil {
			return ip.String(), nil
		}
	}
	ifname := nw.Options["com.docker.network.bridge.name"]
	if ifname == "" {
		ifname = "docker0"
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return "", fmt.Errorf("finding the address of Docker's bridge %s: %w", ifname, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", fmt.Errorf("finding the address of Docker's bridge %s: %w", ifname, err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", fmt.Errorf("the Docker bridge %s has no IPv4 address", ifname)
}
