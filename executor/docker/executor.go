package docker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
)

// Defaults of the directories inside job containers.
const (
	DefaultBuildsDir = "/builds"
	DefaultCacheDir  = "/cache"
)

type state int

const (
	created state = iota
	prepared
	failed
	cleaned
)

func (s state) String() string { return [...]string{"created", "prepared", "failed", "cleaned"}[s] }

// Executor is one job's containers. See package executor for the
// lifecycle; Prepare and Cleanup hold the executor's lock throughout.
type Executor struct {
	p *Provider

	mu    sync.Mutex
	state state
	// j is set as soon as Prepare has named the job's resources, before
	// it creates any: Cleanup removes what carries its labels.
	j   *job
	seq atomic.Int64
}

// job is what Prepare made.
type job struct {
	naming
	scope     string // marker scope
	env       executor.Environment
	buildID   string
	shellPath string
	user      string // the user stages run as ("": the image's)
	root      bool   // stages run as root
	netMode   string // network_mode, or the per-job network's name
	perJobNet bool
	services  []*service
	created   []string // container ids, for Cleanup
	networkID string
	// buildCgroup and serviceCgroup are the containers' cgroup parents
	// ("": the engine's default).
	buildCgroup, serviceCgroup string
	// stopLogs ends the service log streams (CI_DEBUG_SERVICES), logs
	// waits for them.
	stopLogs context.CancelFunc
	logs     sync.WaitGroup
}

// Prepare implements executor.Executor.
func (e *Executor) Prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != created {
		return executor.Environment{}, fmt.Errorf("prepare: executor already %s", e.state)
	}
	env, err := e.prepare(ctx, opts)
	if err != nil {
		e.state = failed
		return executor.Environment{}, err
	}
	e.state = prepared
	return env, nil
}

// detached is a context for one mutating API call: not canceled with the
// job (a create the daemon finishes must be known, to be cleaned up), but
// bounded.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
}

func (e *Executor) prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing docker environment: %w", err)
	}
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	set := e.p.set
	cfg := set.cfg

	// Inputs first: nothing is created for a job that cannot run.
	proj, err := executor.CleanProjectPath(opts.ProjectPath)
	if err != nil {
		return executor.Environment{}, err
	}
	if opts.ConcurrencyID < 0 {
		return executor.Environment{}, fmt.Errorf("concurrency id %d: must not be negative", opts.ConcurrencyID)
	}
	short := opts.ShortToken
	if short == "" || strings.ContainsAny(short, `/\`) || short == "." || short == ".." {
		return executor.Environment{}, fmt.Errorf("short token %q: not usable in a path", short)
	}
	candidates := bashFirst
	switch opts.Shell {
	case "", "bash":
	case "sh":
		candidates = shFirst
	default:
		return executor.Environment{}, fmt.Errorf("shell %q is not supported by the docker executor (bash or sh)", opts.Shell)
	}
	buildsDir := cmp.Or(opts.BuildsDir, DefaultBuildsDir)
	cacheDir := cmp.Or(opts.CacheDir, DefaultCacheDir)
	if !path.IsAbs(buildsDir) || !path.IsAbs(cacheDir) {
		return executor.Environment{}, fmt.Errorf("builds_dir %q and cache_dir %q: must be absolute paths inside the container", buildsDir, cacheDir)
	}
	buildsDir, cacheDir = path.Clean(buildsDir), path.Clean(cacheDir)
	buildDir := path.Join(buildsDir, short, strconv.Itoa(opts.ConcurrencyID), proj)

	jobResp := opts.Job
	expand := expander(jobResp)

	img, err := set.buildImage(jobResp, expand, out)
	if err != nil {
		return executor.Environment{}, err
	}
	specs, err := set.serviceSpecs(jobResp, expand, out)
	if err != nil {
		return executor.Environment{}, err
	}

	// Name the job's resources; from here on Cleanup removes them.
	j := &job{scope: markerScope(opts)}
	j.naming = naming{
		short: sanitizeName(short), rawShort: short, systemID: opts.SystemID, jobID: opts.JobID,
		project: opts.ProjectPath, slot: opts.ConcurrencyID, instance: randomHex(4), job: jobResp, host: e.p.opts.Host,
	}
	if jobResp != nil {
		j.projectID = jobResp.JobInfo.ProjectID
	}
	j.buildCgroup, j.serviceCgroup = cfg.CgroupParent, cfg.ServiceCgroupParent
	if f := e.p.opts.CgroupParent; f != nil {
		j.buildCgroup, j.serviceCgroup = f(opts.ConcurrencyID)
	}
	if len(cfg.ContainerLabels) > 0 {
		j.extra = map[string]string{}
		for k, v := range cfg.ContainerLabels {
			j.extra[k] = expand(v)
		}
	}
	e.j = j
	j.env = executor.Environment{
		BuildDir: buildDir, TmpDir: buildDir + ".tmp", CacheDir: cacheDir, Disposable: true,
		Helper: e.p.helper, Hostname: cmp.Or(cfg.Hostname, j.hostname()),
	}
	j.user = cmp.Or(cfg.User, img.user)
	if !set.allowedUser(j.user) {
		err := fmt.Errorf("user %q is not an allowed user: %v (docker.allowed_users): %w", j.user, set.allowedUsers(), ErrNotAllowed)
		fmt.Fprintf(out, "%sERROR: %v%s\n", ansiRed, err, ansiReset)
		return executor.Environment{}, err
	}

	fmt.Fprintf(out, "Using Docker executor with image %s ...\n", img.name)
	auth := registryAuth(jobResp)
	buildImage, err := e.p.ensureImage(ctx, img, auth, out)
	if err != nil {
		return executor.Environment{}, fmt.Errorf("build image: %w", err)
	}
	effectiveUser := j.user
	if effectiveUser == "" && buildImage.Config != nil {
		effectiveUser = buildImage.Config.User
	}
	j.root = isRoot(effectiveUser)

	if err := e.p.ensureHelperVolume(ctx, buildImage.ID); err != nil {
		return executor.Environment{}, err
	}
	if err := e.createNetwork(ctx, j); err != nil {
		return executor.Environment{}, err
	}
	vols, err := e.volumes(ctx, j, buildsDir)
	if err != nil {
		return executor.Environment{}, err
	}
	for i, sp := range specs {
		fmt.Fprintf(out, "Starting service %s ...\n", sp.image)
		ins, err := e.p.ensureImage(ctx, imageRequest{name: sp.image, policies: sp.policies, platform: sp.platform}, auth, out)
		if err != nil {
			return executor.Environment{}, fmt.Errorf("service %s: %w", sp.image, err)
		}
		s, err := e.startService(ctx, j, vols, sp, i, ins, out)
		if err != nil {
			return executor.Environment{}, err
		}
		j.services = append(j.services, s)
	}
	if opts.DebugServices && len(j.services) > 0 {
		e.streamServiceLogs(j, out)
	}
	if err := e.startBuild(ctx, j, vols, buildImage, img); err != nil {
		return executor.Environment{}, err
	}
	if err := e.setup(ctx, j, img.name, buildsDir, candidates, effectiveUser); err != nil {
		return executor.Environment{}, err
	}
	if err := e.waitForServices(ctx, j, out); err != nil {
		return executor.Environment{}, err
	}
	return j.env, nil
}

// createNetwork creates the job's user-defined bridge network unless
// network_mode is set.
func (e *Executor) createNetwork(ctx context.Context, j *job) error {
	if m := e.p.set.cfg.NetworkMode; m != "" {
		j.netMode = m
		return nil
	}
	name := j.networkName()
	j.netMode, j.perJobNet = name, true
	for attempt := 0; ; attempt++ {
		mctx, cancel := detached(ctx)
		resp, err := e.p.cli.NetworkCreate(mctx, name, e.p.set.networkOptions(j.labels(typeNetwork)))
		cancel()
		if err == nil {
			j.networkID = resp.ID
			break
		}
		// A network of the same name is a leftover of this very job
		// slot (a crashed manager): remove it once and retry.
		if attempt == 0 && strings.Contains(strings.ToLower(err.Error()), "already exists") {
			if rerr := e.removeStaleNetwork(ctx, name, j); rerr == nil {
				continue
			}
		}
		if e.p.set.cfg.EnableIPv6 {
			// The daemon needs an IPv6 address pool for it.
			return fmt.Errorf("creating network %s with IPv6 (docker.enable_ipv6): %w", name, err)
		}
		return fmt.Errorf("creating network %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("creating network %s: %w", name, err)
	}
	return nil
}

// removeStaleNetwork removes a network of the job's name if this runner
// made it.
func (e *Executor) removeStaleNetwork(ctx context.Context, name string, j *job) error {
	mctx, cancel := detached(ctx)
	defer cancel()
	nw, err := e.p.cli.NetworkInspect(mctx, name, network.InspectOptions{})
	if err != nil {
		return err
	}
	if nw.Labels[LabelShortToken] != j.rawShort || nw.Labels[LabelManaged] != "true" {
		return fmt.Errorf("network %s exists and is not this runner's", name)
	}
	for id := range nw.Containers {
		_ = e.p.removeContainer(mctx, id)
	}
	return e.p.removeNetwork(mctx, nw.ID, name)
}

// jobVolumes are the mounts of a job's containers.
type jobVolumes struct {
	binds []string // user binds and host cache directories
	// shared are mounted in the build container and the services;
	// buildOnly (helper, temporary directory) only in the build container.
	shared, buildOnly []mount.Mount
}

// volumes creates the job's persistent volumes and returns its mounts:
//
//   - the builds volume at builds_dir, one per (runner, slot, project),
//     unless a volumes entry mounts builds_dir;
//   - volumes entries: binds as given; "/path" as a persistent per-project
//     volume, a per-project host directory under cache_dir, or (with
//     disable_cache) an anonymous volume removed with the container;
//   - the cache directory the same way as "/path", unless a volumes entry
//     mounts it (with disable_cache it stays in the container);
//   - the job's temporary directory, an anonymous volume removed with the
//     container, and the helper bundle, read-only.
func (e *Executor) volumes(ctx context.Context, j *job, buildsDir string) (jobVolumes, error) {
	set := e.p.set
	var v jobVolumes
	covered := map[string]bool{}
	for _, vs := range set.volumes {
		covered[vs.Target] = true
	}
	persistent := func(target, name, typ string) error {
		if set.cfg.DisableCache && typ == typeCache {
			v.shared = append(v.shared, mount.Mount{Type: mount.TypeVolume, Target: target,
				VolumeOptions: set.anonymousVolume(j.labels(typeTmp))})
			return nil
		}
		if set.cfg.CacheDir != "" && typ == typeCache {
			v.binds = append(v.binds, j.hostCacheDir(set.cfg.CacheDir, target)+":"+target)
			return nil
		}
		mctx, cancel := detached(ctx)
		defer cancel()
		if _, err := e.p.cli.VolumeCreate(mctx, volume.CreateOptions{Name: name, Labels: j.labels(typ),
			Driver: set.cfg.VolumeDriver, DriverOpts: set.cfg.VolumeDriverOps}); err != nil {
			return fmt.Errorf("creating volume %s: %w", name, err)
		}
		v.shared = append(v.shared, mount.Mount{Type: mount.TypeVolume, Source: name, Target: target})
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("creating volume %s: %w", name, err)
		}
		return nil
	}
	if !covered[buildsDir] {
		if err := persistent(buildsDir, j.buildsVolume(buildsDir), typeBuilds); err != nil {
			return v, err
		}
	}
	for _, vs := range set.volumes {
		if !vs.cache() {
			v.binds = append(v.binds, vs.bind())
			continue
		}
		if err := persistent(vs.Target, j.cacheVolume(vs.Target), typeCache); err != nil {
			return v, err
		}
	}
	if !covered[j.env.CacheDir] && !set.cfg.DisableCache {
		if err := persistent(j.env.CacheDir, j.cacheVolume(j.env.CacheDir), typeCache); err != nil {
			return v, err
		}
	}
	helper := mount.Mount{Type: mount.TypeBind, Source: e.p.helperDir, Target: HelperMount, ReadOnly: true}
	if e.p.helperVolume != "" {
		helper = mount.Mount{Type: mount.TypeVolume, Source: e.p.helperVolume, Target: HelperMount, ReadOnly: true}
	}
	v.buildOnly = append(v.buildOnly,
		mount.Mount{Type: mount.TypeVolume, Target: j.env.TmpDir, VolumeOptions: set.anonymousVolume(j.labels(typeTmp))},
		helper,
	)
	return v, nil
}

// networking is the network part of a container of the job: its network
// mode and, on user-defined networks, its aliases.
func (j *job) networking(aliases []string) (container.NetworkMode, *network.NetworkingConfig) {
	mode := container.NetworkMode(j.netMode)
	if !mode.IsUserDefined() || len(aliases) == 0 {
		return mode, nil
	}
	return mode, &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
		j.netMode: {Aliases: aliases},
	}}
}

// create creates a container and records it for Cleanup.
func (e *Executor) create(ctx context.Context, j *job, name string, cfg *container.Config, hc *container.HostConfig, nc *network.NetworkingConfig, pl *ocispec.Platform) (string, error) {
	mctx, cancel := detached(ctx)
	defer cancel()
	resp, err := e.p.cli.ContainerCreate(mctx, cfg, hc, nc, pl, name)
	if err != nil {
		return "", fmt.Errorf("creating container %s: %w", name, err)
	}
	j.created = append(j.created, resp.ID)
	for _, w := range resp.Warnings {
		e.p.log.Warn("docker warning", "container", name, "warning", w)
	}
	if err := e.p.cli.ContainerStart(mctx, resp.ID, container.StartOptions{}); err != nil {
		return resp.ID, fmt.Errorf("starting container %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return resp.ID, fmt.Errorf("starting container %s: %w", name, err)
	}
	return resp.ID, nil
}

// startService creates and starts one service container and finds the
// address and ports the health check uses.
func (e *Executor) startService(ctx context.Context, j *job, vols jobVolumes, sp serviceSpec, i int, ins image.InspectResponse, out io.Writer) (*service, error) {
	set := e.p.set
	name := j.serviceName(sp.image, i)
	labels := j.labels(typeService)
	labels[LabelService] = sp.image
	if ref, err := parseImageName(sp.image); err == nil {
		labels[labelGitLabSvc] = reference.FamiliarName(ref)
		labels[labelGitLabSvcV] = "latest"
		if tagged, ok := ref.(reference.Tagged); ok {
			labels[labelGitLabSvcV] = tagged.Tag()
		}
	}
	cfg := &container.Config{Image: ins.ID, Env: sp.env, Labels: labels, User: sp.user}
	if len(sp.entrypoint) > 0 {
		cfg.Entrypoint = sp.entrypoint
	}
	if len(sp.command) > 0 {
		cfg.Cmd = sp.command
	}
	mode, nc := j.networking(sp.aliases)
	hc := &container.HostConfig{
		NetworkMode:   mode,
		Binds:         vols.binds,
		Mounts:        vols.shared,
		Resources:     container.Resources{CgroupParent: j.serviceCgroup},
		Tmpfs:         set.cfg.ServicesTmpfs,
		DNS:           set.cfg.DNS,
		DNSSearch:     set.cfg.DNSSearch,
		ExtraHosts:    set.cfg.ExtraHosts,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
	}
	set.applyService(hc, sp.image)
	id, err := e.create(ctx, j, name, cfg, hc, nc, sp.platform)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", sp.image, err)
	}
	s := &service{spec: sp, name: name, id: id}
	mctx, cancel := detached(ctx)
	defer cancel()
	ci, err := e.p.cli.ContainerInspect(mctx, id)
	if err != nil {
		return nil, fmt.Errorf("service %s: inspecting container %s: %w", sp.image, name, err)
	}
	var exposed map[string]struct{}
	if ci.Config != nil {
		exposed = map[string]struct{}{}
		for p := range ci.Config.ExposedPorts {
			exposed[string(p)] = struct{}{}
		}
	}
	if s.ports, err = healthPorts(sp.env, exposed); err != nil {
		return nil, fmt.Errorf("service %s: %w", sp.image, err)
	}
	switch {
	case mode.IsHost():
		s.host = "127.0.0.1"
	case mode.IsNone() || mode.IsContainer():
		fmt.Fprintf(out, "%sWARNING: service %s cannot be reached with network_mode %q%s\n", ansiYellow, sp.image, j.netMode, ansiReset)
	default:
		if ci.NetworkSettings != nil {
			key := j.netMode
			if mode.IsDefault() {
				key = "bridge"
			}
			if ep := ci.NetworkSettings.Networks[key]; ep != nil {
				s.host = ep.IPAddress
			}
		}
	}
	return s, nil
}

// startBuild creates and starts the build container: the job's image
// with its entrypoint (or the job's image:entrypoint) and keepaliveCmd,
// docker-init as PID 1 (it reaps the processes stages leave to it).
func (e *Executor) startBuild(ctx context.Context, j *job, vols jobVolumes, ins image.InspectResponse, img imageRequest) error {
	set := e.p.set
	env := jobEnv(j.job)
	if j.perJobNet {
		env = append(env, "CI_BUILD_NETWORK_NAME="+j.netMode)
	}
	cfg := &container.Config{
		Image:     ins.ID,
		Cmd:       keepaliveCmd,
		OpenStdin: true,
		Hostname:  j.env.Hostname,
		User:      j.user,
		Env:       env,
		Labels:    j.labels(typeBuild),
	}
	if len(img.entrypoint) > 0 {
		cfg.Entrypoint = img.entrypoint
	}
	mode, nc := j.networking([]string{"build"})
	extraHosts := append([]string(nil), set.cfg.ExtraHosts...)
	if mode.IsDefault() || mode.IsBridge() || mode.IsHost() {
		// No aliases on the default bridge or the host's network: the
		// services' aliases become host entries, as GitLab does.
		for _, s := range j.services {
			if s.host == "" {
				continue
			}
			for _, a := range s.spec.aliases {
				extraHosts = append(extraHosts, a+":"+s.host)
			}
		}
	}
	init := true
	hc := &container.HostConfig{
		NetworkMode:   mode,
		CapAdd:        set.cfg.CapAdd,
		CapDrop:       set.cfg.CapDrop,
		SecurityOpt:   set.cfg.SecurityOpt,
		DNS:           set.cfg.DNS,
		DNSSearch:     set.cfg.DNSSearch,
		ExtraHosts:    extraHosts,
		ShmSize:       set.cfg.ShmSize,
		Tmpfs:         set.cfg.Tmpfs,
		Binds:         vols.binds,
		Mounts:        append(append([]mount.Mount(nil), vols.shared...), vols.buildOnly...),
		Init:          &init,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Resources: container.Resources{
			NanoCPUs:     set.nanoCPUs,
			Memory:       set.memory,
			MemorySwap:   set.memorySwap,
			Devices:      set.devices,
			CgroupParent: j.buildCgroup,
		},
	}
	set.applyBuild(hc, img.name)
	set.applyMAC(e.p.cli.ClientVersion(), cfg, &nc, j.netMode)
	id, err := e.create(ctx, j, j.buildName(), cfg, hc, nc, img.platform)
	j.buildID = id
	if err != nil {
		return fmt.Errorf("build container: %w", err)
	}
	return nil
}

// imageName is the build image's name as the job (or the runner) gave it.
func imageName(j *job) string {
	if j.job != nil && j.job.Image != nil && j.job.Image.Name != "" {
		return expander(j.job)(j.job.Image.Name)
	}
	return ""
}

// setup finds the shell stages run with and makes the job's directories,
// as root, in the running build container.
func (e *Executor) setup(ctx context.Context, j *job, imgName, buildsDir string, candidates []string, effectiveUser string) error {
	owner := ""
	if !j.root {
		owner = effectiveUser
	}
	var buf outputTail
	buf.max = 16 << 10
	args := append([]string{"sh", "-c", setupScript, "berth-setup", j.env.BuildDir, j.env.TmpDir, j.env.CacheDir, owner, buildsDir}, candidates...)
	code, err := e.p.runExec(ctx, j.buildID, execSpec{cmd: args, user: "0"}, &buf, nil)
	if ctx.Err() != nil {
		return fmt.Errorf("preparing the build container: %w", ctx.Err())
	}
	if err != nil {
		return e.buildContainerError(ctx, j, imgName, err)
	}
	outStr := strings.TrimSpace(string(buf.buf))
	if code != 0 {
		if strings.Contains(outStr, "shell not found") {
			return fmt.Errorf("image %s: %s", imgName, outStr)
		}
		// The container may have stopped while the exec started (its
		// entrypoint exited): say so, with its output.
		return e.buildContainerError(ctx, j, imgName, fmt.Errorf("preparing the build container: exit status %d: %s", code, outStr))
	}
	for _, line := range strings.Split(outStr, "\n") {
		if s, ok := strings.CutPrefix(line, "shell="); ok {
			j.shellPath = s
		}
	}
	if j.shellPath == "" {
		return fmt.Errorf("preparing the build container: no shell reported (output %q)", outStr)
	}
	j.env.Shell = "sh"
	if path.Base(j.shellPath) == "bash" {
		j.env.Shell = "bash"
	}
	return nil
}

// buildContainerError explains a failed exec in the build container: if
// the container stopped, with its status and log.
func (e *Executor) buildContainerError(ctx context.Context, j *job, imgName string, cause error) error {
	mctx, cancel := detached(ctx)
	defer cancel()
	ins, err := e.p.cli.ContainerInspect(mctx, j.buildID)
	// An exec killed because its container is stopping (status 137) can
	// end a moment before the engine calls the container stopped.
	for i := 0; i < 20 && err == nil && ins.State != nil && ins.State.Running; i++ {
		time.Sleep(50 * time.Millisecond)
		ins, err = e.p.cli.ContainerInspect(mctx, j.buildID)
	}
	if err != nil || ins.State == nil || ins.State.Running {
		return fmt.Errorf("build container %s: %w", j.buildName(), cause)
	}
	logs := &outputTail{max: 8 << 10}
	if rc, err := e.p.cli.ContainerLogs(mctx, j.buildID, container.LogsOptions{ShowStdout: true, ShowStderr: true}); err == nil {
		_, _ = stdcopy.StdCopy(logs, logs, rc)
		rc.Close()
	}
	msg := fmt.Sprintf("build container %s (image %s) is not running: it exited with status %d", j.buildName(), imgName, ins.State.ExitCode)
	if ins.State.OOMKilled {
		msg += " (killed: out of memory)"
	}
	if ins.State.Error != "" {
		msg += ": " + ins.State.Error
	}
	if l := strings.TrimSpace(string(logs.buf)); l != "" {
		msg += "; its output:\n" + l
	}
	switch {
	case j.shellPath == "" && e.p.set.cfg.DisableEntrypointOverwrite:
		msg += "\nThe image's entrypoint must run the command it is given (a shell); docker.disable_entrypoint_overwrite keeps jobs from overriding it"
	case j.shellPath == "":
		msg += "\nThe image's entrypoint must run the command it is given (a shell); override it with image: entrypoint: [\"\"] if it does not"
	}
	return fmt.Errorf("%s: %w", msg, cause)
}

// isRoot reports whether a container user is root.
func isRoot(u string) bool {
	name, _, _ := strings.Cut(u, ":")
	return name == "" || name == "root" || name == "0"
}

// Run implements executor.Executor. The script is put into TmpDir (in the
// exec's environment, or copied when large) and run by stageScript as a
// docker exec with the job's user, in the build directory; stdout and
// stderr are streamed to cmd.Output. When the script
// ends, whatever it started (found by a marker in the environment, also
// after setsid) is killed; when ctx is done, those processes get SIGTERM,
// then SIGKILL after KillGrace.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	if e.state != prepared {
		st := e.state
		e.mu.Unlock()
		return fmt.Errorf("stage %s: %w (executor %s)", cmd.Stage, executor.ErrNotPrepared, st)
	}
	j := e.j
	e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return stopped(ctx, cmd.Stage)
	}
	out := cmd.Output
	if out == nil {
		out = io.Discard
	}
	name := fmt.Sprintf("stage-%d-%s.sh", e.seq.Add(1), sanitizeName(cmd.Stage))
	var env []string
	if len(cmd.Script) <= maxEnvScript && !strings.ContainsRune(cmd.Script, 0) {
		env = []string{"BERTH_STAGE_SCRIPT=" + cmd.Script}
	} else if err := e.p.writeFile(ctx, j.buildID, j.env.TmpDir, name, []byte(cmd.Script), 0o644); err != nil {
		if ctx.Err() != nil {
			return stopped(ctx, cmd.Stage)
		}
		return fmt.Errorf("stage %s: %w", cmd.Stage, e.buildContainerError(ctx, j, imageName(j), err))
	}
	marker := reap.NewScopedMarker(j.scope)
	code, err := e.p.runExec(ctx, j.buildID, execSpec{
		cmd:  []string{j.shellPath, "-c", stageScript, "berth-stage", marker, j.env.TmpDir + "/" + name, j.shellPath, j.env.BuildDir},
		user: j.user,
		env:  env,
	}, out, func(sctx context.Context, exited <-chan struct{}) {
		_ = e.reap(sctx, j, marker, "TERM")
		t := time.NewTimer(e.p.killGrace)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
		}
		_ = e.reap(sctx, j, marker, "KILL")
	})
	if !j.root && ctx.Err() == nil && err == nil {
		// The stage's user may not signal what it started as another
		// user (sudo, setuid): root finishes the job.
		if rerr := e.reap(ctx, j, marker, "KILL"); rerr != nil {
			e.p.log.Warn("killing the leftovers of a stage", "stage", cmd.Stage, "err", rerr)
		}
	}
	if ctx.Err() != nil {
		return stopped(ctx, cmd.Stage)
	}
	if err != nil {
		return fmt.Errorf("stage %s: %w", cmd.Stage, e.buildContainerError(ctx, j, imageName(j), err))
	}
	if code == 126 || code == 127 {
		// Also the status of an exec the runtime could not start: a
		// stopped container is a system failure, not the script's.
		if ierr := e.notRunning(ctx, j); ierr != nil {
			return fmt.Errorf("stage %s: %w", cmd.Stage, e.buildContainerError(ctx, j, imageName(j), ierr))
		}
	}
	if code != 0 {
		return &executor.ExitError{Stage: cmd.Stage, Code: code}
	}
	return nil
}

// notRunning returns an error when the build container does not run.
func (e *Executor) notRunning(ctx context.Context, j *job) error {
	mctx, cancel := detached(ctx)
	defer cancel()
	ins, err := e.p.cli.ContainerInspect(mctx, j.buildID)
	if err != nil {
		return fmt.Errorf("inspecting the build container: %w", err)
	}
	if ins.State == nil || !ins.State.Running {
		return errors.New("the build container stopped")
	}
	return nil
}

// maxEnvScript is the largest script Run passes in the exec's
// environment; larger ones are copied into TmpDir (a single environment
// string may not exceed 128 KiB on Linux).
const maxEnvScript = 96 << 10

// stopped is Run's error for a done context: it wraps the context's error
// and its cause.
func stopped(ctx context.Context, stage string) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("stage %s: stopped: %w: %w", stage, err, cause)
	}
	return fmt.Errorf("stage %s: stopped: %w", stage, err)
}

// reap signals, as root, every process of the build container that
// carries marker.
func (e *Executor) reap(ctx context.Context, j *job, marker, sig string) error {
	rctx, cancel := detached(ctx)
	defer cancel()
	code, err := e.p.runExec(rctx, j.buildID, execSpec{cmd: []string{j.shellPath, "-c", reapScript, "berth-reap", sig, marker}, user: "0"}, nil, nil)
	if err != nil {
		return fmt.Errorf("signalling stage processes: %w", err)
	}
	if code != 0 {
		return fmt.Errorf("signalling stage processes: exit status %d", code)
	}
	return nil
}

// Cleanup implements executor.Executor: it force-removes the job's
// containers (the temporary directory's volume with them) and network —
// those Prepare recorded and any other carrying the executor's instance
// label — and keeps the builds and cache volumes. It is idempotent.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == cleaned {
		return nil
	}
	e.state = cleaned
	j := e.j
	if j == nil {
		return nil
	}
	j.stopServiceLogs()
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, id := range j.created {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.p.removeContainer(ctx, id); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if j.networkID != "" {
		if err := e.p.removeNetwork(ctx, j.networkID, j.netMode); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := e.p.removeLabelled(ctx, filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelShortToken+"="+j.rawShort),
		filters.Arg("label", LabelInstance+"="+j.instance),
	)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up job %d: %w", j.jobID, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
