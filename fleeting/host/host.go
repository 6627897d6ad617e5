// Package host runs fleeting plugins: it resolves a plugin reference to a
// binary the way GitLab Runner does, starts it as a hashicorp/go-plugin
// process speaking the fleeting gRPC protocol, relays its logs, restarts it
// when it crashes and makes sure it never outlives the host.
//
// A *Plugin is a fleeting.InstanceGroup; callers (the autoscaler, the CLI)
// use it like any in-process group:
//
//	p, err := host.Start(ctx, host.Config{Plugin: "fleeting-plugin-aws", PluginConfig: cfg, Logger: log})
//	info, err := p.Init(ctx, log, settings)
//	… p.Update / Increase / Decrease / ConnectInfo / Heartbeat …
//	p.Shutdown(ctx) // Shutdown RPC, then the process is stopped
//
// Process lifecycle:
//
//	Start ──► starting ──handshake──► serving ──Shutdown/Close──► stopped
//	             │ timeout / exit        │ process exits
//	             ▼                       ▼
//	           error                restarting ──backoff, start, replay Init──► serving
//
// Instances live in the provider, not in the plugin process, so a restart
// loses nothing: the replayed Init has the same configuration and settings,
// and the next Update lists the same instances.
package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/transport"
	"github.com/berthci/berth/internal/pluginproc"
)

// Errors of the host.
var (
	// ErrHandshakeTimeout: the plugin did not complete the go-plugin
	// handshake within Config.StartTimeout.
	ErrHandshakeTimeout = errors.New("plugin handshake timed out")
	// ErrPluginExited: the plugin process exited (before the handshake, or
	// while a call was in flight).
	ErrPluginExited = errors.New("plugin process exited")
	// ErrClosed: the plugin was shut down or closed by the host.
	ErrClosed = errors.New("plugin closed")
)

// Config configures one plugin process.
type Config struct {
	// Plugin is the plugin reference: a path, a fleeting-plugin-* name in
	// PATH, or an installed OCI reference (see Resolve). Required.
	Plugin string
	// InstallDir is where installed plugins are looked up; "" means
	// InstallDir().
	InstallDir string
	// Args are the plugin program's arguments (none for plugins found by
	// reference).
	Args []string
	// Builtin, if set, resolves a reference nothing else resolves to a
	// plugin served by this program (berth fleeting-plugin local): the
	// program and its arguments.
	Builtin func(ref string) (path string, args []string, ok bool)
	// PluginConfig is the plugin_config JSON document sent with Init; nil
	// means "{}".
	PluginConfig json.RawMessage
	// Name labels the plugin's logs ("plugin" attribute); default: the
	// binary's base name.
	Name string
	// Logger receives the host's and the plugin's logs. Default: discard.
	Logger *slog.Logger
	// StartTimeout bounds the handshake. Default 1 minute.
	StartTimeout time.Duration
	// RestartBackoff is the first delay before restarting a crashed plugin;
	// it doubles on each failed attempt up to MaxRestartBackoff and starts
	// over once a plugin has stayed up for MaxRestartBackoff. Defaults 1 s
	// and 1 minute.
	RestartBackoff    time.Duration
	MaxRestartBackoff time.Duration
	// Env is added to the plugin's environment (which inherits the host's).
	Env []string

	// noDeathSignal disables the kernel parent-death signal; tests use it to
	// prove that SDK plugins notice a dead host by themselves.
	noDeathSignal bool
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Plugin == "" {
		return errors.New("no plugin configured")
	}
	if len(c.PluginConfig) > 0 && !json.Valid(c.PluginConfig) {
		return errors.New("plugin_config is not valid JSON")
	}
	if c.StartTimeout < 0 || c.RestartBackoff < 0 || c.MaxRestartBackoff < 0 {
		return errors.New("negative timeout or backoff")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = time.Minute
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = time.Second
	}
	if c.MaxRestartBackoff == 0 {
		c.MaxRestartBackoff = time.Minute
	}
	if c.MaxRestartBackoff < c.RestartBackoff {
		c.MaxRestartBackoff = c.RestartBackoff
	}
	if len(c.PluginConfig) == 0 {
		c.PluginConfig = json.RawMessage("{}")
	}
}

// Plugin is a running plugin process, seen as a fleeting.InstanceGroup.
// It is safe for concurrent use. The call order of the contract applies:
// Init first, Shutdown last.
type Plugin struct {
	cfg    Config
	path   string
	logger *slog.Logger

	mu       sync.Mutex
	cur      *generation   // nil while restarting
	ready    chan struct{} // closed when cur becomes non-nil
	settings *fleeting.Settings
	restarts int
	closed   bool
	done     chan struct{} // closed by Close
}

// generation is one plugin process.
type generation struct {
	client  *plugin.Client
	rpc     *transport.Client
	runner  *pluginproc.Runner
	relay   *pluginproc.LogRelay
	started time.Time
}

var _ fleeting.InstanceGroup = (*Plugin)(nil)

// Start resolves and starts the plugin and completes the handshake. It does
// not call Init. ctx bounds the start only; the process lives until
// Shutdown or Close.
func Start(ctx context.Context, cfg Config) (*Plugin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleeting plugin config: %w", err)
	}
	cfg.setDefaults()
	path, err := Resolve(cfg.Plugin, cfg.InstallDir)
	if errors.Is(err, ErrPluginNotFound) && cfg.Builtin != nil {
		if bp, args, ok := cfg.Builtin(cfg.Plugin); ok {
			path, err = bp, nil
			cfg.Args = append(args, cfg.Args...)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("resolving fleeting plugin: %w", err)
	}
	if cfg.Name == "" {
		cfg.Name = filepath.Base(path)
		if cfg.Name == "plugin" || cfg.Name == "plugin.exe" {
			cfg.Name = cfg.Plugin
		}
	}
	p := &Plugin{
		cfg:    cfg,
		path:   path,
		logger: cfg.Logger.With("plugin", cfg.Name),
		done:   make(chan struct{}),
	}
	g, err := p.launch(ctx)
	if err != nil {
		return nil, err
	}
	p.cur = g
	p.ready = make(chan struct{})
	close(p.ready)
	go p.supervise(g)
	return p, nil
}

// Path is the resolved plugin executable.
func (p *Plugin) Path() string { return p.path }

// Pid is the process ID of the current plugin process, 0 while restarting.
func (p *Plugin) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.runner.Pid()
}

// Restarts is how many times the plugin was restarted after a crash.
func (p *Plugin) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// launch starts one plugin process and completes the handshake.
func (p *Plugin) launch(ctx context.Context) (*generation, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("starting fleeting plugin %s: %w", p.cfg.Name, err)
	}
	g := &generation{relay: pluginproc.NewLogRelay(p.logger, slog.LevelInfo)}
	stdio := pluginproc.NewLogRelay(p.logger, slog.LevelInfo)
	quiet := hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})
	timeout := p.cfg.StartTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	// go-plugin's handshake takes no context and its Kill waits for the
	// handshake to end, so the end of ctx kills the process itself: the
	// handshake then fails at once instead of after StartTimeout.
	var (
		cmu      sync.Mutex
		canceled bool
	)
	stop := context.AfterFunc(ctx, func() {
		cmu.Lock()
		canceled = true
		r := g.runner
		cmu.Unlock()
		if r != nil {
			r.Kill(context.Background())
		}
	})
	defer stop()
	g.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  transport.Handshake,
		VersionedPlugins: transport.PluginSet(nil),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		RunnerFunc: func(_ hclog.Logger, cmd *exec.Cmd, _ string) (runner.Runner, error) {
			cmd.Path = p.path
			cmd.Args = append([]string{p.path}, p.cfg.Args...)
			cmd.Env = append(cmd.Env, p.cfg.Env...)
			r, err := pluginproc.NewRunner(cmd, p.cfg.Name, !p.cfg.noDeathSignal)
			if err != nil {
				return nil, err
			}
			cmu.Lock()
			defer cmu.Unlock()
			if canceled {
				r.Kill(context.Background()) // Start refuses a killed runner
			}
			g.runner = r
			return r, nil
		},
		StartTimeout: timeout,
		Logger:       quiet, // go-plugin's own parsing of stderr is off: relay does it
		Stderr:       g.relay,
		SyncStdout:   stdio,
		SyncStderr:   stdio,
	})
	began := time.Now()
	proto, err := g.client.Client()
	if err != nil {
		g.client.Kill()
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("starting fleeting plugin %s: %w", p.cfg.Name, context.Cause(ctx))
		}
		return nil, p.startError(g, began, timeout, err)
	}
	raw, err := proto.Dispense(transport.PluginName)
	if err != nil {
		g.client.Kill()
		return nil, fmt.Errorf("starting fleeting plugin %s: dispensing %q: %w", p.cfg.Name, transport.PluginName, err)
	}
	g.rpc = raw.(*transport.Client)
	g.rpc.SetConfig(p.cfg.PluginConfig)
	g.started = time.Now()
	p.logger.Debug("plugin started", "path", p.path, "pid", g.runner.ID())
	return g, nil
}

// startError explains a failed start: a timeout, an early exit (with the
// plugin's last words), or go-plugin's complaint about the handshake line.
func (p *Plugin) startError(g *generation, began time.Time, timeout time.Duration, err error) error {
	var why error
	// go-plugin kills the process when the handshake fails; a process that
	// exited without being killed did so by itself.
	exited := false
	if g.runner != nil {
		select {
		case <-g.runner.Exited():
			exited = g.runner.SelfExit()
		case <-time.After(100 * time.Millisecond):
		}
	}
	switch {
	case exited:
		why = fmt.Errorf("%w before the handshake (%v)", ErrPluginExited, g.runner.ExitErr())
	case time.Since(began) >= timeout:
		why = fmt.Errorf("%w after %s (does %s serve the fleeting protocol?)", ErrHandshakeTimeout, timeout, p.path)
	default:
		why = err
	}
	if tail := g.relay.Tail(); len(tail) > 0 {
		why = fmt.Errorf("%w; plugin stderr: %s", why, strings.Join(tail, " | "))
	}
	return fmt.Errorf("starting fleeting plugin %s: %w", p.cfg.Name, why)
}

// supervise watches one generation after another and restarts the plugin
// when its process exits without being asked to.
func (p *Plugin) supervise(g *generation) {
	backoff := p.cfg.RestartBackoff
	for {
		select {
		case <-g.runner.Exited():
		case <-p.done:
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.cur = nil
		p.ready = make(chan struct{})
		p.mu.Unlock()
		g.client.Kill() // release go-plugin's connection and goroutines
		if time.Since(g.started) >= p.cfg.MaxRestartBackoff {
			backoff = p.cfg.RestartBackoff
		}
		p.logger.Error("plugin process exited unexpectedly; restarting",
			"exit", fmt.Sprint(g.runner.ExitErr()), "restart_in", backoff.String())

		for {
			select {
			case <-time.After(backoff):
			case <-p.done:
				return
			}
			ng, err := p.restart()
			if err == nil {
				g = ng
				break
			}
			backoff = min(backoff*2, p.cfg.MaxRestartBackoff)
			p.logger.Error("restarting plugin failed", "error", err, "retry_in", backoff.String())
		}
	}
}

// restart launches a new process and replays Init.
func (p *Plugin) restart() (*generation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StartTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	g, err := p.launch(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	settings := p.settings
	p.mu.Unlock()
	if settings != nil {
		if _, err := g.rpc.Init(ctx, p.logger, *settings); err != nil {
			g.client.Kill()
			return nil, fmt.Errorf("replaying Init: %w", err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		g.client.Kill()
		return nil, ErrClosed
	}
	p.cur = g
	p.restarts++
	close(p.ready)
	p.logger.Info("plugin restarted", "pid", g.runner.ID(), "restarts", p.restarts)
	return g, nil
}

// rpc returns the client of the current process, waiting for a restart in
// progress (bounded by ctx).
func (p *Plugin) rpc(ctx context.Context) (*transport.Client, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if p.cur != nil {
			c := p.cur.rpc
			p.mu.Unlock()
			return c, nil
		}
		ready := p.ready
		p.mu.Unlock()
		select {
		case <-ready:
		case <-p.done:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the plugin to restart: %w", ctx.Err())
		}
	}
}

// wrap turns a call's error into a path-like error and notices a process
// that died under the call.
func (p *Plugin) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, transport.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrPluginExited, err)
	}
	return fmt.Errorf("fleeting plugin %s: %s: %w", p.cfg.Name, op, err)
}

// Init implements fleeting.InstanceGroup. The settings are kept and replayed
// to a restarted plugin. logger is unused: the plugin's logs go to
// Config.Logger.
func (p *Plugin) Init(ctx context.Context, logger *slog.Logger, settings fleeting.Settings) (fleeting.ProviderInfo, error) {
	c, err := p.rpc(ctx)
	if err != nil {
		return fleeting.ProviderInfo{}, p.wrap("init", err)
	}
	info, err := c.Init(ctx, logger, settings)
	if err != nil {
		return info, p.wrap("init", err)
	}
	p.mu.Lock()
	p.settings = &settings
	p.mu.Unlock()
	return info, nil
}

// Update implements fleeting.InstanceGroup.
func (p *Plugin) Update(ctx context.Context, fn func(string, fleeting.State)) error {
	c, err := p.rpc(ctx)
	if err != nil {
		return p.wrap("update", err)
	}
	return p.wrap("update", c.Update(ctx, fn))
}

// Increase implements fleeting.InstanceGroup.
func (p *Plugin) Increase(ctx context.Context, n int) (int, error) {
	c, err := p.rpc(ctx)
	if err != nil {
		return 0, p.wrap("increase", err)
	}
	got, err := c.Increase(ctx, n)
	return got, p.wrap("increase", err)
}

// Decrease implements fleeting.InstanceGroup.
func (p *Plugin) Decrease(ctx context.Context, ids []string) ([]string, error) {
	c, err := p.rpc(ctx)
	if err != nil {
		return nil, p.wrap("decrease", err)
	}
	got, err := c.Decrease(ctx, ids)
	return got, p.wrap("decrease", err)
}

// ConnectInfo implements fleeting.InstanceGroup.
func (p *Plugin) ConnectInfo(ctx context.Context, id string) (fleeting.ConnectInfo, error) {
	c, err := p.rpc(ctx)
	if err != nil {
		return fleeting.ConnectInfo{}, p.wrap("connect info for "+id, err)
	}
	info, err := c.ConnectInfo(ctx, id)
	return info, p.wrap("connect info for "+id, err)
}

// Heartbeat implements fleeting.InstanceGroup.
func (p *Plugin) Heartbeat(ctx context.Context, id string) error {
	c, err := p.rpc(ctx)
	if err != nil {
		return p.wrap("heartbeat "+id, err)
	}
	return p.wrap("heartbeat "+id, c.Heartbeat(ctx, id))
}

// Shutdown implements fleeting.InstanceGroup: it calls the plugin's
// Shutdown, then stops the process (Close). The process is stopped even when
// the call fails.
func (p *Plugin) Shutdown(ctx context.Context) error {
	var err error
	p.mu.Lock()
	g := p.cur
	p.mu.Unlock()
	if g != nil {
		err = p.wrap("shutdown", g.rpc.Shutdown(ctx))
	}
	return errors.Join(err, p.Close())
}

// Close stops the plugin process without calling its Shutdown: go-plugin
// asks it to exit, and kills it after two seconds. It is idempotent.
func (p *Plugin) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	g := p.cur
	p.cur = nil
	p.mu.Unlock()
	if g != nil {
		g.client.Kill()
	}
	return nil
}
