// Package plugin is the host side of executor plugins: an executor that
// lives in another process, written in any language, served over
// hashicorp/go-plugin and gRPC (the protocol is internal/pb/executor.proto;
// docs/executor-plugins.md explains it). A *Provider is an
// executor.Provider like the built-in ones, so the runner manager does not
// know the difference.
//
// One plugin process serves one [[runners]] entry:
//
//	New ──► starting ──handshake, Describe──► serving ──Shutdown──► stopped
//	           │ fails / times out                │ process exits
//	           ▼                                  ▼
//	        waiting ◄────────backoff─────────  restarting ──► starting
//
// The process is restarted when it dies (at once the first time, then
// with a backoff while it keeps dying); jobs whose stages ran on it fail
// with a system failure (ErrPluginExited), the next job gets the new
// process. What the dead process's stages left running is swept by the new
// process when the plugin can sweep. While no process serves, Create
// waits for a start in progress and otherwise fails with why the last
// start failed, so a broken plugin fails jobs with a clear reason and
// never wedges the runner.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/executor/plugin/internal/wire"
	"github.com/berthci/berth/internal/pluginproc"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "plugin"

// Errors of the host, checked with errors.Is.
var (
	// ErrPluginExited: the plugin process exited (under a call, or before
	// its handshake).
	ErrPluginExited = errors.New("executor plugin process exited")
	// ErrStartTimeout: the plugin did not complete its start (handshake
	// and Describe) within start_timeout.
	ErrStartTimeout = errors.New("executor plugin did not start in time")
	// ErrProtocolVersion: the plugin speaks no protocol version this host
	// speaks.
	ErrProtocolVersion = errors.New("executor plugin speaks another protocol version")
	// ErrNoAnswer: the plugin did not answer a short call in time; the
	// process is stopped and started again.
	ErrNoAnswer = errors.New("executor plugin did not answer")
	// ErrConfig: the plugin refused its configuration.
	ErrConfig = wire.ErrConfig
	// ErrClosed: the provider was shut down.
	ErrClosed = errors.New("executor plugin provider shut down")
)

// Options configure a Provider.
type Options struct {
	// Config is the [runners.plugin] section.
	Config econfig.Plugin
	// RunnerName is the [[runners]] entry's name (for logs).
	RunnerName string
	// HostVersion is the runner manager's version, sent to the plugin.
	HostVersion string
	// Dir is the executor plugin directory ("" means Dir()).
	Dir string
	// Builtin resolves a plugin name to a built-in executor run out of
	// process (cmd/berth: the berth binary with "executor-plugin NAME").
	Builtin func(name string) (Command, bool)
	// Logger receives the host's and the plugin's logs.
	Logger *slog.Logger
	// Helper is the berth binary offered to the plugin for its
	// environments ("": this process's executable).
	Helper string
	// Env is added to the plugin's environment (which inherits the
	// runner manager's).
	Env []string

	// CallTimeout bounds the calls that must be quick (Describe after the
	// start, Create); a plugin that misses it is restarted. 0: 1 minute.
	CallTimeout time.Duration
	// CancelWait is how long a canceled stage may take to end before the
	// host gives up on it. 0: 2 minutes.
	CancelWait time.Duration
	// RestartBackoff and MaxRestartBackoff pace restarts of a plugin that
	// keeps dying or failing to start. 0: 1 second and 1 minute.
	RestartBackoff    time.Duration
	MaxRestartBackoff time.Duration

	startTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Helper == "" {
		o.Helper, _ = os.Executable()
	}
	o.startTimeout = econfig.DefaultPluginStartTimeout
	if o.Config.StartTimeout > 0 {
		o.startTimeout = time.Duration(o.Config.StartTimeout) * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = time.Minute
	}
	if o.CancelWait <= 0 {
		o.CancelWait = 2 * time.Minute
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = time.Second
	}
	if o.MaxRestartBackoff < o.RestartBackoff {
		o.MaxRestartBackoff = max(time.Minute, o.RestartBackoff)
	}
}

// Provider runs the executors of one [[runners]] entry in a plugin
// process. It is safe for concurrent use.
type Provider struct {
	opts   Options
	cmd    Command
	config []byte
	name   string
	logger *slog.Logger

	mu       sync.Mutex
	cur      *generation   // nil while none serves
	starting chan struct{} // non-nil while a start is in progress; closed when it ends
	lastErr  error         // why the last start failed
	desc     *pb.DescribeResponse
	sweeps   map[executor.SweepOptions]bool // runners to sweep after a restart
	gens     int
	// launching is the process being started, stopped by Close.
	launching *generation
	closed    bool
	done      chan struct{}
	stopped   chan struct{} // closed when the supervisor has returned
}

// generation is one plugin process.
type generation struct {
	n       int
	client  *goplugin.Client
	rpc     pb.ExecutorClient
	runner  *pluginproc.Runner
	relay   *pluginproc.LogRelay
	desc    *pb.DescribeResponse
	started time.Time
	killed  chan struct{} // closed by kill
	once    sync.Once
}

// exited is closed when the process has exited.
func (g *generation) exited() <-chan struct{} { return g.runner.Exited() }

func (g *generation) alive() bool {
	select {
	case <-g.runner.Exited():
		return false
	case <-g.killed:
		return false
	default:
		return true
	}
}

func (g *generation) kill() {
	g.once.Do(func() { close(g.killed) })
	g.client.Kill()
}

var (
	_ executor.Provider   = (*Provider)(nil)
	_ executor.Describer  = (*Provider)(nil)
	_ executor.Isolator   = (*Provider)(nil)
	_ executor.Sweeper    = (*Provider)(nil)
	_ executor.Shutdowner = (*Provider)(nil)
)

// New resolves the plugin and starts it, waiting for the first start to
// end. It fails when the plugin cannot be found or refuses its
// configuration; a plugin that fails to start for another reason (a
// protocol version mismatch, a handshake that never comes) is logged and
// retried in the background, and jobs fail with the reason until it
// starts.
func New(ctx context.Context, opts Options) (*Provider, error) {
	opts.setDefaults()
	c := opts.Config
	cmd, err := Resolve(c.Name, c.Path, c.Args, opts.Dir, opts.Builtin)
	if err != nil {
		return nil, err
	}
	cfg := []byte("{}")
	if len(c.Config) > 0 {
		if cfg, err = json.Marshal(c.Config); err != nil {
			return nil, fmt.Errorf("[runners.plugin.config] cannot be sent as JSON: %w", err)
		}
	}
	name := c.Name
	if name == "" {
		name = filepath.Base(cmd.Path)
	}
	p := &Provider{
		opts: opts, cmd: cmd, config: cfg, name: name,
		logger:  opts.Logger.With("executor_plugin", name),
		sweeps:  map[executor.SweepOptions]bool{},
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	p.starting = make(chan struct{})
	first := p.starting
	go p.supervise()
	select {
	case <-first:
	case <-ctx.Done():
		p.Close()
		return nil, fmt.Errorf("starting executor plugin %s: %w", name, ctx.Err())
	}
	p.mu.Lock()
	err = p.lastErr
	p.mu.Unlock()
	if errors.Is(err, ErrConfig) {
		p.Close()
		return nil, err
	}
	if err != nil {
		p.logger.Error("executor plugin failed to start; jobs fail until it starts", "error", err)
	}
	return p, nil
}

// supervise starts the plugin, waits for it to exit and starts it again,
// until Close.
func (p *Provider) supervise() {
	defer close(p.stopped)
	backoff := time.Duration(0)
	for {
		g, err := p.launch()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			if g != nil {
				g.kill()
			}
			return
		}
		if err != nil {
			p.lastErr = err
		} else {
			p.cur, p.lastErr, p.desc = g, nil, g.desc
		}
		close(p.starting)
		p.starting = nil
		p.mu.Unlock()

		if err == nil {
			select {
			case <-g.exited():
			case <-g.killed:
			case <-p.done:
				return
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				return
			}
			if p.cur == g {
				p.cur = nil
			}
			p.mu.Unlock()
			g.kill() // release go-plugin's connection and goroutines
			if time.Since(g.started) >= p.opts.MaxRestartBackoff {
				backoff = 0
			}
			why := "killed after it stopped answering"
			select {
			case <-g.exited():
				why = fmt.Sprint(g.runner.ExitErr())
			default:
			}
			p.logger.Error("executor plugin process ended; restarting", "pid", g.runner.Pid(), "exit", why, "restart_in", backoff.String())
		} else {
			p.logger.Error("executor plugin failed to start", "error", err, "retry_in", max(backoff, p.opts.RestartBackoff).String())
			backoff = max(backoff, p.opts.RestartBackoff)
		}
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
		}
		backoff = min(max(backoff*2, p.opts.RestartBackoff), p.opts.MaxRestartBackoff)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.starting = make(chan struct{})
		p.mu.Unlock()
	}
}

var versionRe = regexp.MustCompile(`Plugin version: (\d+)`)

// launch starts one plugin process: handshake, Describe, and after a
// restart the sweep of what the dead process's stages left.
func (p *Provider) launch() (*generation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.startTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	p.mu.Lock()
	p.gens++
	n := p.gens
	p.mu.Unlock()
	g := &generation{n: n, relay: pluginproc.NewLogRelay(p.logger, slog.LevelInfo), killed: make(chan struct{})}
	stdio := pluginproc.NewLogRelay(p.logger.With("stream", "stdio"), slog.LevelInfo)
	quiet := hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})
	g.client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSet(nil),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		RunnerFunc: func(_ hclog.Logger, cmd *exec.Cmd, _ string) (runner.Runner, error) {
			cmd.Path = p.cmd.Path
			cmd.Args = append([]string{p.cmd.Path}, p.cmd.Args...)
			cmd.Env = append(cmd.Env, p.opts.Env...)
			r, err := pluginproc.NewRunner(cmd, p.name, true)
			g.runner = r
			return r, err
		},
		StartTimeout: p.opts.startTimeout,
		Logger:       quiet,
		Stderr:       g.relay,
		SyncStdout:   stdio,
		SyncStderr:   stdio,
	})
	p.mu.Lock()
	p.launching = g
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.launching = nil
		p.mu.Unlock()
	}()
	began := time.Now()
	proto, err := g.client.Client()
	if err != nil {
		g.client.Kill()
		return nil, p.startError(g, began, err)
	}
	raw, err := proto.Dispense(wire.PluginName)
	if err != nil {
		g.client.Kill()
		return nil, fmt.Errorf("starting executor plugin %s: dispensing %q: %w", p.name, wire.PluginName, err)
	}
	g.rpc = raw.(pb.ExecutorClient)
	desc, err := g.rpc.Describe(ctx, &pb.DescribeRequest{Config: p.config, HostVersion: p.opts.HostVersion, RunnerName: p.opts.RunnerName, Helper: p.opts.Helper})
	if err == nil && desc.GetFailure() != nil {
		err = wire.FromFailure(desc.GetFailure())
		if errors.Is(err, ErrConfig) {
			g.client.Kill()
			return nil, fmt.Errorf("executor plugin %s refused [runners.plugin.config]: %w", p.name, err)
		}
	}
	if err != nil {
		g.client.Kill()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("starting executor plugin %s: %w: Describe got no answer within %s", p.name, ErrStartTimeout, p.opts.startTimeout)
		}
		return nil, fmt.Errorf("starting executor plugin %s: Describe: %w", p.name, p.callError(g, err))
	}
	g.desc = desc
	g.started = time.Now()
	if n > 1 && slices.Contains(desc.GetCapabilities(), wire.CapabilitySweep) {
		p.mu.Lock()
		sweeps := make([]executor.SweepOptions, 0, len(p.sweeps))
		for o := range p.sweeps {
			sweeps = append(sweeps, o)
		}
		p.mu.Unlock()
		for _, o := range sweeps {
			if err := p.sweep(ctx, g, o); err != nil {
				p.logger.Warn("sweeping what the previous plugin process left failed", "runner", o.ShortToken, "error", err)
			}
		}
	}
	p.logger.Info("executor plugin started", "path", p.cmd.Path, "pid", g.runner.Pid(),
		"name", desc.GetName(), "version", desc.GetVersion(), "protocol", g.client.NegotiatedVersion())
	return g, nil
}

// startError explains a failed start: a protocol mismatch, a timeout, an
// early exit (with the plugin's last words), or go-plugin's complaint.
func (p *Provider) startError(g *generation, began time.Time, err error) error {
	var why error
	exited := false
	if g.runner != nil {
		select {
		case <-g.runner.Exited():
			exited = g.runner.SelfExit()
		case <-time.After(100 * time.Millisecond):
		}
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "incompatible API version"):
		theirs := "another version"
		if m := versionRe.FindStringSubmatch(msg); m != nil {
			theirs = "version " + m[1]
		}
		why = fmt.Errorf("%w: the plugin speaks executor protocol %s, this runner manager speaks %v; upgrade the one that is behind", ErrProtocolVersion, theirs, wire.ProtocolVersions)
	case strings.Contains(msg, "incompatible core API version"):
		why = fmt.Errorf("%w: the plugin speaks another go-plugin core protocol (%s)", ErrProtocolVersion, strings.SplitN(msg, "\n", 2)[0])
	case exited:
		why = fmt.Errorf("%w before its handshake (%v)", ErrPluginExited, g.runner.ExitErr())
	case time.Since(began) >= p.opts.startTimeout:
		why = fmt.Errorf("%w: no handshake within %s (is %s an executor plugin?)", ErrStartTimeout, p.opts.startTimeout, p.cmd.Path)
	default:
		why = err
	}
	if tail := g.relay.Tail(); len(tail) > 0 {
		why = fmt.Errorf("%w; plugin stderr: %s", why, strings.Join(tail, " | "))
	}
	return fmt.Errorf("starting executor plugin %s: %w", p.name, why)
}

// callError turns a transport error of a call into ErrPluginExited when
// the process died under it.
func (p *Provider) callError(g *generation, err error) error {
	if err == nil {
		return nil
	}
	// The connection may break a moment before the exit is seen.
	select {
	case <-g.runner.Exited():
		return fmt.Errorf("%w (%v)", ErrPluginExited, g.runner.ExitErr())
	case <-time.After(50 * time.Millisecond):
	}
	if !g.alive() {
		return fmt.Errorf("%w: %w", ErrPluginExited, err)
	}
	return err
}

// current returns the serving process, waiting for a start in progress
// (bounded by ctx).
func (p *Provider) current(ctx context.Context) (*generation, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if g := p.cur; g != nil && g.alive() {
			p.mu.Unlock()
			return g, nil
		}
		starting, lastErr := p.starting, p.lastErr
		p.mu.Unlock()
		if starting == nil {
			if lastErr == nil {
				lastErr = ErrPluginExited
			}
			return nil, fmt.Errorf("executor plugin %s is not running: %w", p.name, lastErr)
		}
		select {
		case <-starting:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for executor plugin %s to start: %w", p.name, ctx.Err())
		}
		p.mu.Lock()
		g, lastErr := p.cur, p.lastErr
		p.mu.Unlock()
		if g == nil && lastErr != nil {
			return nil, fmt.Errorf("executor plugin %s is not running: %w", p.name, lastErr)
		}
	}
}

// Create implements executor.Provider.
func (p *Provider) Create(ctx context.Context) (executor.Executor, error) {
	g, err := p.current(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	defer cancel()
	resp, err := g.rpc.Create(cctx, &pb.CreateRequest{})
	if err != nil {
		if ctx.Err() == nil && (cctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded) {
			p.logger.Error("executor plugin did not answer Create; restarting it", "timeout", p.opts.CallTimeout.String())
			g.kill()
			return nil, fmt.Errorf("executor plugin %s: Create: %w within %s (the plugin is restarted)", p.name, ErrNoAnswer, p.opts.CallTimeout)
		}
		return nil, fmt.Errorf("executor plugin %s: Create: %w", p.name, p.callError(g, err))
	}
	if f := resp.GetFailure(); f != nil {
		return nil, fmt.Errorf("executor plugin %s: Create: %w", p.name, wire.FromFailure(f))
	}
	if resp.GetExecutorId() == "" {
		return nil, fmt.Errorf("executor plugin %s: Create returned no executor id", p.name)
	}
	return &Executor{p: p, g: g, id: resp.GetExecutorId()}, nil
}

// description is the last Describe answer, nil before the first start.
func (p *Provider) description() *pb.DescribeResponse {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desc
}

// Describe implements executor.Describer with what the plugin said of
// itself; before the plugin ever started, the runner's own features only.
func (p *Provider) Describe(info *runnerapi.Info) {
	executor.RunnerFeatures(&info.Features)
	info.Executor = Name
	d := p.description()
	if d == nil {
		return
	}
	if d.GetExecutor() != "" {
		info.Executor = d.GetExecutor()
	}
	if s := d.GetShell(); s == "bash" || s == "sh" {
		info.Shell = s
	}
	wire.ApplyFeatures(&info.Features, d.GetFeatures())
}

// IsolationLevels implements executor.Isolator: the levels the plugin
// offers (IsolationNone when it never started or named none Berth knows).
func (p *Provider) IsolationLevels() []executor.Isolation {
	var out []executor.Isolation
	if d := p.description(); d != nil {
		for _, s := range d.GetIsolationLevels() {
			if l, err := executor.ParseIsolation(s); err == nil {
				out = append(out, l)
			}
		}
	}
	if len(out) == 0 {
		out = []executor.Isolation{executor.IsolationNone}
	}
	return out
}

// Sweep implements executor.Sweeper. The runner is remembered: after a
// restart the new process sweeps what the dead one's stages left.
func (p *Provider) Sweep(ctx context.Context, o executor.SweepOptions) error {
	p.mu.Lock()
	p.sweeps[o] = true
	p.mu.Unlock()
	g, err := p.current(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(g.desc.GetCapabilities(), wire.CapabilitySweep) {
		return nil
	}
	return p.sweep(ctx, g, o)
}

func (p *Provider) sweep(ctx context.Context, g *generation, o executor.SweepOptions) error {
	resp, err := g.rpc.Sweep(ctx, &pb.SweepRequest{SystemId: o.SystemID, ShortToken: o.ShortToken})
	if err != nil {
		return fmt.Errorf("executor plugin %s: Sweep: %w", p.name, p.callError(g, err))
	}
	if f := resp.GetFailure(); f != nil {
		return fmt.Errorf("executor plugin %s: Sweep: %w", p.name, wire.FromFailure(f))
	}
	return nil
}

// remember notes the runner of a prepared job, to sweep after a restart.
func (p *Provider) remember(o executor.SweepOptions) {
	if o.SystemID == "" || o.ShortToken == "" {
		return
	}
	p.mu.Lock()
	p.sweeps[o] = true
	p.mu.Unlock()
}

// Pid is the serving plugin process's id, 0 when none serves.
func (p *Provider) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil || !p.cur.alive() {
		return 0
	}
	return p.cur.runner.Pid()
}

// Restarts is how many plugin processes were started after the first.
func (p *Provider) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.gens-1, 0)
}

// Shutdown implements executor.Shutdowner: the plugin's Shutdown, then the
// process is stopped (also when the call fails).
func (p *Provider) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	g := p.cur
	p.mu.Unlock()
	var err error
	if g != nil && g.alive() {
		resp, cerr := g.rpc.Shutdown(ctx, &pb.ShutdownRequest{})
		switch {
		case cerr != nil:
			err = fmt.Errorf("executor plugin %s: Shutdown: %w", p.name, p.callError(g, cerr))
		case resp.GetFailure() != nil:
			err = fmt.Errorf("executor plugin %s: Shutdown: %w", p.name, wire.FromFailure(resp.GetFailure()))
		}
	}
	p.Close()
	return err
}

// Close stops the plugin process without its Shutdown call. Idempotent.
func (p *Provider) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	g, l := p.cur, p.launching
	p.cur = nil
	p.mu.Unlock()
	if g != nil {
		g.kill()
	}
	if l != nil {
		l.kill()
	}
	<-p.stopped
}
