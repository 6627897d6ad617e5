// Package shell is the shell executor: every stage runs as a bash (or sh)
// process on the runner's host, as the runner's user, with the runner's
// environment. It gives no isolation; the DESIGN's "none" level.
//
// Build directories are <builds_dir>/<short token>/<concurrency id>/<project
// path>, kept between jobs (GIT_STRATEGY=fetch reuses them); the job's
// temporary directory is <build dir>.tmp and is removed by Cleanup. Every
// stage runs in its own process group: when the stage's context is done the
// whole group gets SIGTERM, then SIGKILL after the grace period; when the
// stage's shell exits, whatever it left behind in its group is killed too,
// so a stray background process can neither hang the job log nor outlive
// the stage. Processes that left the group (setsid, daemons) are found by a
// marker in their environment (package reap) and stopped the same way.
package shell

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "shell"

// Config configures the shell executor provider.
type Config struct {
	// Helper is the berth binary jobs run as "<Helper> helper …" (empty:
	// os.Executable()).
	Helper string
	// DefaultBuildsDir and DefaultCacheDir apply when the runner has no
	// builds_dir / cache_dir (empty: ./builds and ./cache of the working
	// directory, as gitlab-runner).
	DefaultBuildsDir string
	DefaultCacheDir  string
	// KillGrace is how long a stopped stage gets between SIGTERM and
	// SIGKILL (0: 10 s).
	KillGrace time.Duration
	// Env is added to the runner's own environment for every stage.
	Env    []string
	Logger *slog.Logger
}

// Provider creates shell executors.
type Provider struct {
	cfg Config
}

// New returns a Provider.
func New(cfg Config) *Provider {
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Provider{cfg: cfg}
}

// Create implements executor.Provider.
func (p *Provider) Create(ctx context.Context) (executor.Executor, error) {
	return &Executor{cfg: p.cfg}, nil
}

// Describe implements executor.Describer.
func (p *Provider) Describe(info *runnerapi.Info) {
	info.Executor = Name
	info.Shell = "bash"
	if _, err := exec.LookPath("bash"); err != nil {
		info.Shell = "sh"
	}
	f := &info.Features
	executor.RunnerFeatures(f)
	f.Shared = true
}

type state int

const (
	created state = iota
	prepared
	failed
	cleaned
)

// Executor is one job's shell environment.
type Executor struct {
	cfg Config
	as  *runAs // set by Prepare

	mu    sync.Mutex
	state state
	env   environment
	// groups are the process groups of running stages and their markers,
	// killed by Cleanup.
	groups map[int]string
}

// Prepare implements executor.Executor.
func (e *Executor) Prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != created {
		return executor.Environment{}, fmt.Errorf("prepare: executor already %s", e.stateName())
	}
	env, err := e.prepare(ctx, opts)
	if err != nil {
		e.state = failed
		return executor.Environment{}, err
	}
	e.state, e.env = prepared, environment{Environment: env, scope: markerScope(opts.SystemID, opts.ShortToken), as: e.as}
	return env, nil
}

// environment is a prepared job's environment, the scope of its stages'
// markers and the user they run as (nil: the runner's own).
type environment struct {
	executor.Environment
	scope string
	as    *runAs
}

// markerScope is the scope of a runner's stage markers: Sweep finds the
// processes of a crashed predecessor by it ("" without a system id).
func markerScope(systemID, shortToken string) string {
	if systemID == "" || shortToken == "" {
		return ""
	}
	return executor.SafeName(systemID) + "." + executor.SafeName(shortToken)
}

// Sweep implements executor.Sweeper: it kills every process a stage of
// this runner started and that outlived a runner manager killed without
// a chance to clean up.
func (p *Provider) Sweep(ctx context.Context, o executor.SweepOptions) error {
	scope := markerScope(o.SystemID, o.ShortToken)
	if scope == "" {
		return nil
	}
	n, err := reap.SignalScope(scope, syscall.SIGKILL)
	if err != nil {
		return fmt.Errorf("sweeping processes of runner %s: %w", o.ShortToken, err)
	}
	if n > 0 {
		p.cfg.Logger.Warn("killed processes left by a previous runner manager", "runner", o.ShortToken, "processes", n)
	}
	return nil
}

func (e *Executor) stateName() string {
	return [...]string{"created", "prepared", "failed", "cleaned"}[e.state]
}

func (e *Executor) prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing shell environment: %w", err)
	}
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
	wd, _ := os.Getwd()
	buildsDir := cmp.Or(opts.BuildsDir, e.cfg.DefaultBuildsDir, filepath.Join(wd, "builds"))
	cacheDir := cmp.Or(opts.CacheDir, e.cfg.DefaultCacheDir, filepath.Join(wd, "cache"))
	buildsDir, err = filepath.Abs(buildsDir)
	if err != nil {
		return executor.Environment{}, err
	}
	cacheDir, err = filepath.Abs(cacheDir)
	if err != nil {
		return executor.Environment{}, err
	}
	buildDir := filepath.Join(buildsDir, short, strconv.Itoa(opts.ConcurrencyID), proj)
	tmpDir := buildDir + ".tmp"
	if e.as, err = lookupRunAs(opts.User); err != nil {
		return executor.Environment{}, err
	}
	for _, d := range []string{buildDir, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return executor.Environment{}, fmt.Errorf("preparing shell environment: %w", err)
		}
	}
	// A job's temporary directory never carries anything from a previous
	// job (file variables of another job must not survive).
	if err := os.RemoveAll(tmpDir); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing shell environment: %w", err)
	}
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing shell environment: %w", err)
	}
	if e.as != nil {
		// The directories the runner made are the user's, as if the
		// user's shell had made them (gitlab-runner's stages do).
		if err := e.as.own(buildsDir, buildDir, tmpDir, cacheDir); err != nil {
			return executor.Environment{}, fmt.Errorf("preparing shell environment for user %s: %w", e.as.name, err)
		}
	}
	shell, err := pickShell(opts.Shell)
	if err != nil {
		return executor.Environment{}, err
	}
	helper := e.cfg.Helper
	if helper == "" {
		if helper, err = os.Executable(); err != nil {
			return executor.Environment{}, fmt.Errorf("finding the berth binary for the helper: %w", err)
		}
	}
	host, _ := os.Hostname()
	if opts.Output != nil {
		fmt.Fprintf(opts.Output, "Using Shell (%s) executor...\n", shell)
	}
	// As another user, the cache and artifacts stages run as that user
	// too (the helper in the stage's shell), not in the runner's process.
	return executor.Environment{BuildDir: buildDir, TmpDir: tmpDir, CacheDir: cacheDir, Shell: shell, Helper: helper, Hostname: host,
		Local: e.as == nil}, nil
}

// tempScript writes a stage's script to a file of the job's temporary
// directory.
func tempScript(tmpDir, stage, script string) (*os.File, string, func(), error) {
	f, err := os.CreateTemp(tmpDir, "stage-"+stage+"-*.sh")
	if err != nil {
		return nil, "", nil, fmt.Errorf("writing script: %w", err)
	}
	name := f.Name()
	if _, err := io.WriteString(f, script); err != nil {
		f.Close()
		os.Remove(name)
		return nil, "", nil, fmt.Errorf("writing script: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return nil, "", nil, fmt.Errorf("writing script: %w", err)
	}
	return nil, name, func() { os.Remove(name) }, nil
}

func pickShell(want string) (string, error) {
	switch want {
	case "", "bash":
		if _, err := exec.LookPath("bash"); err == nil {
			return "bash", nil
		}
		fallthrough
	case "sh":
		if _, err := exec.LookPath("sh"); err == nil {
			return "sh", nil
		}
		return "", errors.New("neither bash nor sh found in PATH")
	}
	return "", fmt.Errorf("shell %q is not supported by the shell executor (bash or sh)", want)
}

// Run implements executor.Executor.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	if e.state != prepared {
		st := e.stateName()
		e.mu.Unlock()
		return fmt.Errorf("stage %s: %w (executor %s)", cmd.Stage, executor.ErrNotPrepared, st)
	}
	env := e.env
	e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stage %s: %w", cmd.Stage, err)
	}
	out := cmd.Output
	if out == nil {
		out = io.Discard
	}
	scriptFD, scriptPath, closeScript, err := scriptFile(env.TmpDir, executor.SafeName(cmd.Stage), cmd.Script)
	if err != nil {
		return fmt.Errorf("stage %s: %w", cmd.Stage, err)
	}
	defer closeScript()
	if scriptFD == nil && env.as != nil {
		if err := os.Chown(scriptPath, int(env.as.cred.Uid), int(env.as.cred.Gid)); err != nil {
			return fmt.Errorf("stage %s: %w", cmd.Stage, err)
		}
	}
	args := []string{scriptPath}
	if env.Shell == "bash" {
		args = []string{"--noprofile", "--norc", scriptPath}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stage %s: %w", cmd.Stage, err)
	}
	c := exec.Command(env.Shell, args...)
	c.Dir = env.BuildDir
	marker := reap.NewScopedMarker(env.scope)
	c.Env = append(append(os.Environ(), e.cfg.Env...), reap.Env(marker))
	if env.as != nil {
		c.Env = env.as.environ(c.Env)
	}
	c.Stdout, c.Stderr = pw, pw
	if scriptFD != nil {
		c.ExtraFiles = []*os.File{scriptFD}
	}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if env.as != nil {
		c.SysProcAttr.Credential = env.as.cred
	}
	if err := c.Start(); err != nil {
		pr.Close()
		pw.Close()
		return fmt.Errorf("stage %s: starting %s: %w", cmd.Stage, env.Shell, err)
	}
	pw.Close()
	pgid := c.Process.Pid
	e.trackGroup(pgid, marker, true)
	defer e.trackGroup(pgid, marker, false)

	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				_, _ = out.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()

	exited := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-exited:
			return
		case <-ctx.Done():
		}
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		_, _ = reap.Signal(marker, syscall.SIGTERM)
		t := time.NewTimer(e.cfg.KillGrace)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}()
	werr := c.Wait()
	close(exited)
	<-stopped
	// Whatever the stage left behind, in its group or escaped from it,
	// goes with it.
	killStage(pgid, marker)
	select {
	case <-copied:
	case <-time.After(5 * time.Second):
		// A process that left the group still holds the pipe: stop
		// reading rather than hang the job.
	}
	pr.Close()
	<-copied

	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != err {
			return fmt.Errorf("stage %s: stopped: %w: %w", cmd.Stage, err, cause)
		}
		return fmt.Errorf("stage %s: stopped: %w", cmd.Stage, err)
	}
	if werr == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return &executor.ExitError{Stage: cmd.Stage, Code: code}
	}
	return fmt.Errorf("stage %s: %w", cmd.Stage, werr)
}

func (e *Executor) trackGroup(pgid int, marker string, add bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.groups == nil {
		e.groups = map[int]string{}
	}
	if add {
		e.groups[pgid] = marker
	} else {
		delete(e.groups, pgid)
	}
}

// killStage kills a stage's process group and every process carrying its
// marker.
func killStage(pgid int, marker string) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	_, _ = reap.Signal(marker, syscall.SIGKILL)
}

// Cleanup implements executor.Executor.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == cleaned {
		return nil
	}
	wasPrepared := e.state == prepared
	e.state = cleaned
	for pgid, marker := range e.groups {
		killStage(pgid, marker)
	}
	if wasPrepared && e.env.TmpDir != "" {
		if err := os.RemoveAll(e.env.TmpDir); err != nil {
			return fmt.Errorf("cleaning up %s: %w", e.env.TmpDir, err)
		}
	}
	return nil
}
