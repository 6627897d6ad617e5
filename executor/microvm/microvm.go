// Package microvm is the microvm executor: every job runs in a VM of its
// own, made by a nesting daemon (package nesting; Berth's QEMU hypervisor
// by default) from the job's image and deleted after the job. Stages run
// through the guest agent (package guest) over the VM's virtio-serial
// port: no SSH server, no network and nothing else is needed in the
// image.
//
//	Prepare:  nesting Create(image, slot) ──► VM ──► agent Hello ──► dirs, coordinator tunnel
//	Run:      agent Run (chroot in the VM's root filesystem, streamed, cancel)
//	Cleanup:  nesting Delete(vm)
//
// The nesting daemon is either the runner manager's own (the hypervisor
// runs in its process, serving on a private socket, so it is the same
// protocol) or a running `berth nesting serve` named by nesting_host —
// on this machine or, for the instance executor's vm_isolation, on an
// autoscaled instance reached through its connector (Instances).
//
// The job reaches the coordinator through the agent whatever the VM's
// network: the guest listens on the coordinator's address (a host name
// resolves to the guest's loopback) and every connection is carried to
// the host over the agent's stream, and opened there.
package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "microvm"

// Defaults inside the VM.
const (
	DefaultBuildsDir = "/builds"
	DefaultCacheDir  = "/cache"
	// defaultPath is the scripts' PATH when the image sets none.
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// killGrace is what a canceled stage gets between SIGTERM and SIGKILL.
	killGrace = 10 * time.Second
	// deleteTimeout bounds deleting a VM (GitLab's runner: 1 min).
	deleteTimeout = time.Minute
)

// Dialer reaches a network address from where the nesting daemon runs
// (this machine, or an instance through its connector).
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// Options configure a Provider.
type Options struct {
	Config config.MicroVM
	// Hypervisor makes the in-process daemon's hypervisor when
	// Config.NestingHost is empty.
	Hypervisor func(*slog.Logger) nesting.Hypervisor
	// StateDir holds the in-process daemon's socket (default: a
	// directory under os.TempDir()).
	StateDir string
	// Dial reaches the daemon and the VMs' agents (nil: this machine).
	Dial Dialer
	// ServerDial reaches the coordinator for the tunnel (nil: this
	// machine).
	ServerDial Dialer
	// Name is the executor's name in what it tells the job and the
	// coordinator (default Name).
	Name   string
	Logger *slog.Logger
}

// Provider creates microvm executors for one [[runners]] entry.
type Provider struct {
	opts    Options
	cfg     []byte // nesting_config as JSON
	level   executor.Isolation
	log     *slog.Logger
	target  string
	dial    Dialer
	srvDial Dialer

	mu     sync.Mutex
	client *nesting.Client
	local  *localDaemon
	closed bool
	// hv is the in-process daemon's hypervisor (nil with nesting_host).
	hv nesting.Hypervisor
}

var (
	_ executor.Provider    = (*Provider)(nil)
	_ executor.Describer   = (*Provider)(nil)
	_ executor.Isolator    = (*Provider)(nil)
	_ executor.Shutdowner  = (*Provider)(nil)
	_ executor.Snapshotter = (*Executor)(nil)
	_ executor.Brancher    = (*Executor)(nil)
)

// localDaemon is the in-process nesting daemon.
type localDaemon struct {
	ctx    context.Context // ends with the daemon
	cancel context.CancelFunc
	done   chan error
	dir    string
}

// New checks the configuration and, without nesting_host, starts the
// in-process daemon. It does not initialize the daemon: the first job
// does (as GitLab's runner does, Init on "not initialized").
func New(o Options) (*Provider, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Name == "" {
		o.Name = Name
	}
	cfg := []byte("{}")
	nc := o.Config.NestingConfig
	if o.Config.NestingHost == "" && o.Config.Image != "" {
		// The runner's own daemon is Berth's QEMU hypervisor: it makes
		// the default image's template as soon as it starts, so even the
		// first job is a warm start.
		_, set := nc["warm_images"]
		warm, ok := nc["warm_start"].(bool)
		if !set && (!ok || warm) {
			nc = maps.Clone(nc)
			if nc == nil {
				nc = map[string]any{}
			}
			nc["warm_images"] = []string{o.Config.Image}
		}
	}
	if nc != nil {
		b, err := json.Marshal(nc)
		if err != nil {
			return nil, fmt.Errorf("nesting_config: %w", err)
		}
		cfg = b
	}
	for _, p := range o.Config.AllowedImages {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("allowed_images: %q: %w", p, err)
		}
	}
	p := &Provider{opts: o, cfg: cfg, level: Level(o.Config.NestingConfig), log: o.Logger, dial: o.Dial, srvDial: o.ServerDial}
	if p.dial == nil {
		p.dial = (&net.Dialer{}).DialContext
	}
	if p.srvDial == nil {
		p.srvDial = (&net.Dialer{}).DialContext
	}
	p.target = o.Config.NestingHost
	if p.target == "" {
		if o.Hypervisor == nil {
			return nil, errors.New("microvm: no nesting_host and no hypervisor in this build")
		}
		if err := p.startLocal(); err != nil {
			return nil, err
		}
		if _, ok := nc["warm_images"]; ok {
			go p.initEarly()
		}
	}
	return p, nil
}

// initEarly initializes the runner's own daemon now rather than at the
// first job, so that it starts making the templates of warm_images.
func (p *Provider) initEarly() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-p.local.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := p.nestingClient(ctx)
	if err == nil {
		_, err = c.ListInitialized(ctx, p.cfg)
	}
	if err != nil && ctx.Err() == nil && p.local.ctx.Err() == nil {
		p.log.Warn("initializing the nesting daemon early, for warm_images: the first job will try again", "err", err)
	}
}

// Level is the isolation level of VMs of a nesting config: vm for a full
// machine (QEMU's q35), microvm otherwise.
func Level(nestingConfig map[string]any) executor.Isolation {
	if m, _ := nestingConfig["machine"].(string); m == "q35" {
		return executor.IsolationVM
	}
	return executor.IsolationMicroVM
}

// startLocal serves the in-process daemon on a private socket.
func (p *Provider) startLocal() error {
	dir := p.opts.StateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "berth-microvm-")
		if err != nil {
			return fmt.Errorf("microvm: %w", err)
		}
		dir = d
	}
	sock := filepath.Join(dir, "nesting.sock")
	l, err := nesting.Listen(sock)
	if err != nil {
		return fmt.Errorf("microvm: the runner's nesting daemon: %w", err)
	}
	p.hv = p.opts.Hypervisor(p.log.With("component", "nesting"))
	srv := nesting.NewServer(p.hv, p.log.With("component", "nesting"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	p.local = &localDaemon{ctx: ctx, cancel: cancel, done: done, dir: dir}
	p.target = "unix://" + sock
	return nil
}

// nestingClient returns the daemon's client, dialled on first use.
func (p *Provider) nestingClient(ctx context.Context) (*nesting.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("microvm: the executor is shut down")
	}
	if p.client != nil {
		return p.client, nil
	}
	c, err := nesting.Dial(ctx, p.target, nesting.WithDialer(nesting.Dialer(p.dial)))
	if err != nil {
		return nil, fmt.Errorf("nesting daemon %s: %w", p.target, err)
	}
	p.client = c
	return c, nil
}

// Create implements executor.Provider.
func (p *Provider) Create(context.Context) (executor.Executor, error) {
	return &Executor{p: p}, nil
}

// Describe implements executor.Describer.
func (p *Provider) Describe(info *runnerapi.Info) { describe(info, p.opts.Name) }

// describe is what a runner of VM jobs advertises, as executor name.
func describe(info *runnerapi.Info, name string) {
	info.Executor = name
	info.Shell = "bash"
	executor.RunnerFeatures(&info.Features)
	info.Features.Image = true
	info.Features.Cancelable = true
}

// IsolationLevels implements executor.Isolator.
func (p *Provider) IsolationLevels() []executor.Isolation { return []executor.Isolation{p.level} }

// Shutdown implements executor.Shutdowner: the in-process daemon deletes
// its VMs and stops; a remote daemon is only disconnected from.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	c, local := p.client, p.local
	p.mu.Unlock()
	var err error
	if c != nil {
		err = c.Close()
	}
	if local != nil {
		local.cancel()
		select {
		case serr := <-local.done:
			err = errors.Join(err, serr)
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("microvm: stopping the nesting daemon: %w", ctx.Err()))
		}
		if p.opts.StateDir == "" {
			os.RemoveAll(local.dir)
		}
	}
	return err
}

// Executor runs one job in one VM.
type Executor struct {
	p *Provider

	mu      sync.Mutex
	state   int // 0 created, 1 prepared, 2 failed, 3 cleaned
	nc      *nesting.Client
	vm      nesting.VirtualMachine
	agent   *guest.Client
	env     executor.Environment
	baseEnv []string
	tunnels []func()
	boot    time.Duration
}

// VM is the job's VM (zero before Prepare created it).
func (e *Executor) VM() nesting.VirtualMachine {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vm
}

// BootTime is how long the job waited for its VM: from asking the
// nesting daemon for it to its agent's first answer.
func (e *Executor) BootTime() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.boot
}

const (
	stateCreated = iota
	statePrepared
	stateFailed
	stateCleaned
)

// ErrNoImage is a job without an image on a runner without a default one.
var ErrNoImage = errors.New("no nesting VM image specified")

// image is the VM image of the job.
func (p *Provider) image(job *runnerapi.JobResponse) (string, error) {
	img := ""
	if job != nil && job.Image != nil {
		img = strings.TrimSpace(job.ExpandVariables(job.Image.Name))
	}
	if img != "" && !p.imageAllowed(img) {
		return "", fmt.Errorf("%w: image %q is not in allowed_images", executor.ErrNotAllowed, img)
	}
	if img == "" {
		img = p.opts.Config.Image
	}
	if img == "" {
		return "", fmt.Errorf("%w: %w (no image: in the job, no image in [runners.%s])", executor.ErrNotAllowed, ErrNoImage, Name)
	}
	return img, nil
}

// imageAllowed says whether allowed_images (when set) has img.
func (p *Provider) imageAllowed(img string) bool {
	if len(p.opts.Config.AllowedImages) == 0 {
		return true
	}
	for _, pat := range p.opts.Config.AllowedImages {
		if m, _ := path.Match(pat, img); m {
			return true
		}
	}
	return false
}

// Prepare implements executor.Executor.
func (e *Executor) Prepare(ctx context.Context, o executor.PrepareOptions) (env executor.Environment, err error) {
	e.mu.Lock()
	if e.state != stateCreated {
		e.mu.Unlock()
		return env, errors.New("prepare: executor already prepared or cleaned up")
	}
	e.state = stateFailed // until it succeeds
	e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return env, fmt.Errorf("preparing: %w", err)
	}
	project, err := executor.CleanProjectPath(o.ProjectPath)
	if err != nil {
		return env, err
	}
	if o.ShortToken == "" || strings.ContainsAny(o.ShortToken, "/\\.") {
		return env, fmt.Errorf("short token %q: empty or not a single path element", o.ShortToken)
	}
	if o.Job != nil && len(o.Job.Services) > 0 {
		return env, fmt.Errorf("%w: services: are not supported at the %s level (run them from the job's script, or at the container level)", executor.ErrNotAllowed, e.p.level)
	}
	img, err := e.p.image(o.Job)
	if err != nil {
		return env, err
	}
	out := o.Output
	if out == nil {
		out = io.Discard
	}
	restorer, _ := e.p.hv.(nesting.BundleRestorer)
	switch {
	case o.Branch != nil && o.Snapshot != nil:
		return env, errors.New("preparing from both a branch point and a snapshot")
	case o.Snapshot != nil && restorer == nil:
		return env, fmt.Errorf("%w: only the runner's own nesting daemon resumes snapshots (no nesting_host)", executor.ErrNoSnapshots)
	}
	nc, err := e.p.nestingClient(ctx)
	if err != nil {
		return env, err
	}
	began := time.Now()
	var (
		vm nesting.VirtualMachine
		// resumed is the environment of the VM a branch point or a
		// snapshot resumes (nil: a new VM).
		resumed *executor.Environment
		// badEnv is what is wrong with a snapshot's environment (the VM
		// is recorded first, for Cleanup to delete).
		badEnv error
	)
	switch {
	case o.Branch != nil:
		from, ok := o.Branch.(*vmBranch)
		if !ok || from.p != e.p {
			return env, errors.New("preparing from a branch point another executor made")
		}
		fmt.Fprintf(out, "Creating a %s from the branch point of VM %s...\n", vmWord(e.p.level), from.vm)
		br, _ := e.p.hv.(nesting.Brancher)
		if br == nil {
			return env, executor.ErrNoBranching
		}
		if vm, err = br.CreateFromBranch(ctx, from.id); err != nil {
			return env, fmt.Errorf("creating the VM from its branch point: %w", err)
		}
		resumed = &from.env
	case o.Snapshot != nil:
		// The daemon is initialized by the first job's Create: this one
		// may be the first.
		if _, err := nc.ListInitialized(ctx, e.p.cfg); err != nil {
			return env, err
		}
		var job nesting.SnapshotJob
		if vm, job, err = restorer.CreateFromBundle(ctx, o.Snapshot); err != nil {
			return env, fmt.Errorf("creating the VM from the snapshot: %w", err)
		}
		point := ""
		if job.Point != "" {
			point = " (" + job.Point + ")"
		}
		fmt.Fprintf(out, "Creating a %s from a snapshot of job %d%s...\n", vmWord(e.p.level), job.ID, point)
		resumed, badEnv = snapshotEnv(job)
		if !e.p.imageAllowed(vm.Name) {
			// Another runner's snapshot, of an image this one does not run.
			badEnv = fmt.Errorf("%w: the snapshot's image %q is not in allowed_images", executor.ErrNotAllowed, vm.Name)
		}
	default:
		fmt.Fprintf(out, "Creating a %s from %s...\n", vmWord(e.p.level), img)
		slot := int32(o.ConcurrencyID)
		var stomped string
		if vm, stomped, err = nc.CreateInitialized(ctx, e.p.cfg, img, &slot); err != nil {
			return env, fmt.Errorf("creating the VM: %w", err)
		}
		if stomped != "" {
			fmt.Fprintf(out, "Removed VM %s, left in slot %d\n", stomped, slot)
		}
	}
	e.mu.Lock()
	e.nc, e.vm = nc, vm
	e.mu.Unlock()
	if badEnv != nil {
		return env, badEnv
	}
	if vm.Addr == "" {
		return env, fmt.Errorf("VM %s: the nesting daemon gave no address", vm.ID)
	}
	network, addr, err := nesting.ParseTarget(vm.Addr)
	if err != nil {
		return env, fmt.Errorf("VM %s: %w", vm.ID, err)
	}
	agent, err := guest.NewClient(func(ctx context.Context) (net.Conn, error) { return e.p.dial(ctx, network, addr) })
	if err != nil {
		return env, err
	}
	e.mu.Lock()
	e.agent = agent
	e.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	info, err := agent.Wait(wctx, 100*time.Millisecond)
	cancel()
	if err != nil {
		return env, fmt.Errorf("VM %s: %w", vm.ID, err)
	}
	boot := time.Since(began)
	e.mu.Lock()
	e.boot = boot
	e.mu.Unlock()
	fmt.Fprintf(out, "Running in %s %s (kernel %s, root %s) after %s\n", vmWord(e.p.level), vm.ID, info.Kernel, info.Root, boot.Round(time.Millisecond))

	if resumed != nil {
		// The saved VM's directories, files and processes, under this
		// VM's name.
		env = *resumed
		env.Hostname = info.Hostname
		e.baseEnv = baseEnv(info)
	} else {
		env.Shell = "bash"
		if o.Shell == "sh" || !slices.Contains(info.Shells, "bash") {
			env.Shell = "sh"
		}
		if !slices.Contains(info.Shells, env.Shell) {
			return env, fmt.Errorf("image %s has no /bin/sh: a VM image needs a shell", img)
		}
		builds := o.BuildsDir
		if builds == "" {
			builds = DefaultBuildsDir
		}
		cache := o.CacheDir
		if cache == "" {
			cache = DefaultCacheDir
		}
		if !path.IsAbs(builds) || !path.IsAbs(cache) {
			return env, fmt.Errorf("builds_dir %q and cache_dir %q must be absolute paths in the VM", builds, cache)
		}
		env.BuildDir = path.Join(builds, o.ShortToken, fmt.Sprint(o.ConcurrencyID), project)
		env.TmpDir = env.BuildDir + ".tmp"
		env.CacheDir = cache
		env.Helper = guest.HelperPath
		env.Hostname = info.Hostname
		e.baseEnv = baseEnv(info)
		// The build directory is the VM's own: what a previous job left in
		// the slot is gone with its VM.
		var mkOut strings.Builder
		if err := agent.Run(ctx, guest.RunOptions{Argv: []string{"/bin/sh", "-c", `mkdir -p "$1" "$2" "$3" && chmod 700 "$2"`, "sh", env.BuildDir, env.TmpDir, env.CacheDir},
			Env: e.baseEnv, Detached: true, Output: &mkOut}); err != nil {
			return env, fmt.Errorf("making the job's directories in the VM: %w: %s", err, strings.TrimSpace(mkOut.String()))
		}
	}
	env.Disposable = true // fresh or restored, the VM is the job's own
	if err := e.tunnel(ctx, o); err != nil {
		return env, err
	}
	e.mu.Lock()
	e.env, e.state = env, statePrepared
	e.mu.Unlock()
	return env, nil
}

// snapshotEnv is the environment of the job a snapshot was taken in, as
// its bundle records it (defaults for what an older bundle lacks).
func snapshotEnv(job nesting.SnapshotJob) (*executor.Environment, error) {
	env := &executor.Environment{BuildDir: job.Dir, TmpDir: job.TmpDir, CacheDir: job.CacheDir, Shell: job.Shell, Helper: guest.HelperPath}
	if env.TmpDir == "" {
		env.TmpDir = env.BuildDir + ".tmp"
	}
	if env.CacheDir == "" {
		env.CacheDir = DefaultCacheDir
	}
	if env.Shell == "" {
		env.Shell = "sh"
	}
	for _, d := range []string{env.BuildDir, env.TmpDir, env.CacheDir} {
		if !path.IsAbs(d) {
			return nil, fmt.Errorf("the snapshot of job %d records directory %q: not an absolute path", job.ID, d)
		}
	}
	if env.Shell != "sh" && env.Shell != "bash" {
		return nil, fmt.Errorf("the snapshot of job %d records shell %q: want sh or bash", job.ID, env.Shell)
	}
	return env, nil
}

func vmWord(l executor.Isolation) string {
	if l == executor.IsolationVM {
		return "VM"
	}
	return "microVM"
}

// baseEnv is the scripts' environment before the job's variables: the
// image's (PATH of its tools), and what a login would set.
func baseEnv(info guest.Info) []string {
	env := []string{"HOME=/root", "USER=root", "LOGNAME=root", "HOSTNAME=" + info.Hostname}
	hasPath := false
	for _, kv := range info.Image.Env {
		if strings.HasPrefix(kv, "PATH=") {
			hasPath = true
		}
		if k, _, ok := strings.Cut(kv, "="); ok && (k == "HOME" || k == "HOSTNAME") {
			env = dropKey(env, k)
		}
		env = append(env, kv)
	}
	if !hasPath {
		env = append(env, defaultPath)
	}
	return env
}

func dropKey(env []string, k string) []string {
	out := env[:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// tunnel makes the coordinator's addresses the job uses lead to the
// coordinator through the agent.
func (e *Executor) tunnel(ctx context.Context, o executor.PrepareOptions) error {
	seen := map[string]bool{}
	var urls []string
	urls = append(urls, o.ServerURL)
	if o.Job != nil {
		urls = append(urls, o.Job.GitInfo.RepoURL)
		for _, v := range o.Job.Variables {
			if v.Key == "CI_SERVER_URL" {
				urls = append(urls, v.Value)
			}
		}
	}
	for _, raw := range urls {
		hp, ok := hostPort(raw)
		if !ok || seen[hp] {
			continue
		}
		seen[hp] = true
		stop, err := e.agent.Expose(ctx, hp, func(ctx context.Context) (net.Conn, error) {
			return e.p.srvDial(ctx, "tcp", hp)
		})
		if err != nil {
			return fmt.Errorf("reaching the coordinator (%s) from the VM: %w", hp, err)
		}
		e.mu.Lock()
		e.tunnels = append(e.tunnels, stop)
		e.mu.Unlock()
	}
	return nil
}

// hostPort is the host:port of an http(s) URL.
func hostPort(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", false
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port), true
}

// Run implements executor.Executor.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	state, agent, env, base := e.state, e.agent, e.env, e.baseEnv
	e.mu.Unlock()
	if state != statePrepared {
		return fmt.Errorf("stage %s: %w", cmd.Stage, executor.ErrNotPrepared)
	}
	script := path.Join(env.TmpDir, "stage-"+executor.SafeName(cmd.Stage)+".sh")
	err := agent.Run(ctx, guest.RunOptions{
		Argv: []string{"/bin/" + env.Shell, script}, Dir: env.BuildDir, Env: base,
		Script: cmd.Script, ScriptPath: script, Grace: killGrace, Output: cmd.Output, KeepProcesses: cmd.KeepProcesses,
	})
	var ee *guest.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return &executor.ExitError{Stage: cmd.Stage, Code: ee.Code}
	case errors.Is(err, guest.ErrCanceled):
		return fmt.Errorf("stage %s: %w", cmd.Stage, err)
	}
	return fmt.Errorf("stage %s in VM %s: %w", cmd.Stage, e.vm.ID, err)
}

// Snapshot implements executor.Snapshotter: the job's VM, whole, as the
// hypervisor's bundle (nesting.Snapshotter), with the job's working
// directory, shell and environment (the image's, then o.Env) for a
// debugger: from the runner's own daemon in process, or over Berth's
// Snapshots service from a daemon elsewhere (GitLab's nesting protocol
// has no such call: its daemon cannot).
func (e *Executor) Snapshot(ctx context.Context, o executor.SnapshotOptions, w io.Writer) error {
	e.mu.Lock()
	state, vm, env, base, nc := e.state, e.vm, e.env, e.baseEnv, e.nc
	e.mu.Unlock()
	if state != statePrepared {
		return fmt.Errorf("snapshot: %w", executor.ErrNotPrepared)
	}
	job := nesting.SnapshotJob{ID: o.JobID, Name: o.JobName, Project: o.Project, Point: o.Point, Dir: env.BuildDir, Shell: env.Shell,
		Env: append(slices.Clone(base), o.Env...), TmpDir: env.TmpDir, CacheDir: env.CacheDir}
	if sn, ok := e.p.hv.(nesting.Snapshotter); ok {
		return sn.SnapshotVM(ctx, vm.ID, job, w)
	}
	// A daemon elsewhere (nesting_host, an instance's): Berth's Snapshots
	// service, which GitLab's daemon does not have.
	err := nc.SnapshotVM(ctx, vm.ID, job, w)
	if errors.Is(err, nesting.ErrNoSnapshots) {
		return fmt.Errorf("%w: %w", executor.ErrNoSnapshots, err)
	}
	return err
}

// vmBranch is a branch point of a job's VM, made by the runner's own
// daemon.
type vmBranch struct {
	p   *Provider
	id  string // the hypervisor's
	vm  string // the branched VM's id
	env executor.Environment
}

// Drop implements executor.Branch.
func (b *vmBranch) Drop(ctx context.Context) error {
	br, ok := b.p.hv.(nesting.Brancher)
	if !ok {
		return nil
	}
	if err := br.DropBranch(ctx, b.id); err != nil && !errors.Is(err, nesting.ErrNotFound) {
		return err
	}
	return nil
}

// Branch implements executor.Brancher: the job's VM becomes a branch
// point of the runner's own daemon (a daemon elsewhere — nesting_host,
// an instance's — has no such call: ErrNoBranching).
func (e *Executor) Branch(ctx context.Context) (executor.Branch, error) {
	e.mu.Lock()
	state, vm, env := e.state, e.vm, e.env
	e.mu.Unlock()
	if state != statePrepared {
		return nil, fmt.Errorf("branch: %w", executor.ErrNotPrepared)
	}
	br, ok := e.p.hv.(nesting.Brancher)
	if !ok {
		return nil, fmt.Errorf("%w: only the runner's own nesting daemon branches VMs (no nesting_host)", executor.ErrNoBranching)
	}
	id, err := br.Branch(ctx, vm.ID)
	if err != nil {
		return nil, err
	}
	return &vmBranch{p: e.p, id: id, vm: vm.ID, env: env}, nil
}

// Cleanup implements executor.Executor: the VM is deleted with
// everything in it.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	if e.state == stateCleaned {
		e.mu.Unlock()
		return nil
	}
	e.state = stateCleaned
	tunnels, agent, nc, vm := e.tunnels, e.agent, e.nc, e.vm
	e.tunnels = nil
	e.mu.Unlock()
	for _, stop := range tunnels {
		stop()
	}
	if agent != nil {
		agent.Close()
	}
	if nc == nil || vm.ID == "" {
		return nil
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	if err := nc.Delete(dctx, vm.ID); err != nil && !errors.Is(err, nesting.ErrNotFound) {
		return fmt.Errorf("deleting VM %s: %w", vm.ID, err)
	}
	return nil
}
