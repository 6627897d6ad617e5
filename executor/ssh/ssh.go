// Package ssh is the ssh executor ([runners.ssh]): every stage of a job
// runs as a shell script on one remote Linux host, reached over SSH as
// one user, the way GitLab's ssh executor works, with the differences
// below. It gives the isolation of that host and user, no more.
//
// # Connections
//
// Prepare dials the host once per job; every stage of the job runs in a
// session of that connection, and Cleanup closes it. Keepalives (every
// Options.Keepalive; three unanswered close the connection) notice a host
// that went away without closing the TCP connection. A connection lost
// during a job is a system failure: Run returns an error that is not an
// *executor.ExitError.
//
// # Host keys
//
// Berth checks host keys strictly by default (GitLab does not): the host's
// key must be in known_hosts_file (default ~/.ssh/known_hosts of the
// runner's user), else Prepare fails with a *HostKeyError that names the
// key and the file. Only the key types known_hosts lists for the host are
// negotiated, as OpenSSH does, so a host known by its ed25519 key is not
// refused because it also has an ecdsa key. disable_strict_host_key_checking
// = true accepts any key.
//
// # The helper
//
// Stages run "berth helper …" on the host (artifacts, caches) and the
// executor itself runs "berth helper reap" there to stop processes. The
// berth binary (Options.Helper) is uploaded once per host and user to
// ~/.cache/berth/helper/<sha256>/berth, named by its SHA-256: to a
// temporary name in that directory, checked (size, SHA-256 when the host
// has sha256sum, that it runs), then renamed into place, so concurrent
// jobs, even of different runner managers, never see a partial file and
// later jobs reuse it after a cheap existence and size check that rides
// along with Prepare's other remote work.
//
// # Directories
//
// The build directory is <builds_dir>/<short token>/<concurrency id>/
// <project path> on the host, builds_dir defaulting to ~/builds (relative
// builds_dir and cache_dir are relative to the remote user's home, as in
// GitLab); the cache directory defaults to ~/cache. The job's temporary
// directory is <build dir>.tmp, created empty by Prepare with mode 0700
// and removed by Cleanup.
//
// # Stages and their processes
//
// A stage's script is sent on the session's standard input to a small
// POSIX sh wrapper that writes it into the temporary directory and runs it
// with bash (or sh) in the build directory, stdout and stderr merged into
// one stream, with a marker variable (package reap) in its environment
// that every descendant inherits. When the script ends, the wrapper
// reports its exit status on the session's stderr and execs "berth helper
// reap", which kills whatever the stage left behind: every process with
// the marker, also those that escaped with setsid, and every process in
// the process group of a marked one. When the stage's context is done,
// the executor asks the host (in a second session) to send SIGTERM the
// same way, waits Options.KillGrace, then SIGKILL. Cleanup kills every
// process of any stage of the job. A process that clears its environment
// and leaves the stage's process group is beyond this bound; a connection
// lost mid-stage leaves the stage running on the host until Cleanup (which
// reconnects) or the next runner start (Sweep) kills it.
package ssh

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "ssh"

// Defaults of Options.
const (
	DefaultPort           = "22"
	DefaultKillGrace      = 10 * time.Second
	DefaultKeepalive      = 15 * time.Second
	DefaultConnectTimeout = 30 * time.Second
	// DefaultBuildsDir and DefaultCacheDir are relative to the remote
	// user's home.
	DefaultBuildsDir = "builds"
	DefaultCacheDir  = "cache"
)

// Options configure the ssh executor provider.
type Options struct {
	// Config is the runner's [runners.ssh] section.
	Config config.SSH
	// Helper is the local berth binary uploaded to the host for "berth
	// helper …" (empty: os.Executable()). It must be a Linux build for
	// the host's architecture.
	Helper string
	// Logger receives connection and upload events. Default: discard.
	Logger *slog.Logger
	// KillGrace is how long a stopped stage gets between SIGTERM and
	// SIGKILL (0: DefaultKillGrace).
	KillGrace time.Duration
	// DefaultBuildsDir and DefaultCacheDir apply when the runner has no
	// builds_dir / cache_dir; relative paths are under the remote user's
	// home (empty: DefaultBuildsDir and DefaultCacheDir).
	DefaultBuildsDir string
	DefaultCacheDir  string
	// Keepalive is the interval of SSH keepalives; three unanswered in a
	// row close the connection (0: DefaultKeepalive; negative: none).
	Keepalive time.Duration
	// ConnectTimeout bounds connecting, handshake and authentication
	// (0: DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// Dial, if set, connects to the host instead of Config's host, port,
	// user and credentials (which are then not needed): the instance
	// executor reaches instances through the fleeting connector. Each
	// call returns a new connection the executor owns and closes.
	Dial Dialer
	// Target names the host in messages when Dial is set (an instance
	// ID); default "the host".
	Target string
	// MessageName is the executor's name in the job log ("SSH" when
	// empty: "Using SSH executor with bash on …").
	MessageName string
	// Cgroup, if set, returns the cgroup a job's processes run in (nil:
	// none for this job).
	Cgroup func(executor.PrepareOptions) (*JobCgroup, error)
}

// Dialer connects to the host: a new SSH connection per call.
type Dialer func(ctx context.Context) (*xssh.Client, error)

// JobCgroup keeps a job's processes in a cgroup on the host (the slot
// cgroups of the instance executor). Its scripts are POSIX sh, run by
// /bin/sh as the remote user (who must be allowed to manage cgroups):
// each is sent on standard input, so it may span lines.
type JobCgroup struct {
	// Describe names the cgroup and its limits for the job log.
	Describe string
	// Setup creates the cgroup and sets its limits; run once by Prepare.
	Setup string
	// Enter moves the running shell into the cgroup; it is put before
	// every stage's script, so the script and all it starts are inside.
	Enter string
	// Kill kills every process in the cgroup and waits until none is
	// left; run after every stage and by Cleanup, from outside.
	Kill string
	// OOMKills prints how many processes the kernel killed so far in the
	// cgroup for lack of memory; run with Setup and Kill.
	OOMKills string
}

var (
	_ executor.Provider   = (*Provider)(nil)
	_ executor.Describer  = (*Provider)(nil)
	_ executor.Shutdowner = (*Provider)(nil)
	_ executor.Sweeper    = (*Provider)(nil)
)

// Provider creates ssh executors for one host. It is safe for concurrent
// use; its executors share nothing but the uploaded helper.
type Provider struct {
	opts       Options
	log        *slog.Logger
	addr       string // host:port
	user       string
	auth       []xssh.AuthMethod
	authDesc   string // how we authenticate, for errors
	hostKeys   hostKeyPolicy
	helperPath string

	helper helperCache

	mu     sync.Mutex
	closed bool
	conns  map[*client]struct{} // open connections of executors
}

// New checks opts and returns a Provider. It reads identity_file; it does
// not connect (Prepare does).
func New(opts Options) (*Provider, error) {
	c := opts.Config
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	if opts.Keepalive == 0 {
		opts.Keepalive = DefaultKeepalive
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.DefaultBuildsDir == "" {
		opts.DefaultBuildsDir = DefaultBuildsDir
	}
	if opts.DefaultCacheDir == "" {
		opts.DefaultCacheDir = DefaultCacheDir
	}
	if opts.MessageName == "" {
		opts.MessageName = "SSH"
	}
	if opts.Dial != nil {
		return newDialing(opts)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(c.Host, "["), "]")
	if host == "" {
		return nil, errors.New("ssh executor: ssh.host is required")
	}
	if _, _, err := net.SplitHostPort(c.Host); err == nil {
		return nil, fmt.Errorf("ssh executor: ssh.host %q: give the port in ssh.port", c.Host)
	}
	port := c.Port
	if port == "" {
		port = DefaultPort
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return nil, fmt.Errorf("ssh executor: ssh.port %q: want a port number", c.Port)
	}
	if c.User == "" {
		return nil, errors.New("ssh executor: ssh.user is required")
	}
	auth, desc, err := authMethods(c)
	if err != nil {
		return nil, fmt.Errorf("ssh executor: %w", err)
	}
	hk, err := newHostKeyPolicy(c, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("ssh executor: %w", err)
	}
	helper := opts.Helper
	if helper == "" {
		if helper, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("ssh executor: finding the berth binary for the helper: %w", err)
		}
	}
	p := &Provider{
		opts: opts, log: opts.Logger.With("executor", Name, "host", host),
		addr: net.JoinHostPort(host, port), user: c.User, auth: auth, authDesc: desc,
		hostKeys: hk, helperPath: helper, conns: map[*client]struct{}{},
	}
	if !hk.insecure {
		if _, err := os.Stat(hk.file); err != nil {
			p.log.Warn("known hosts file is not readable: jobs will fail until it lists the host's key", "file", hk.file, "err", err)
		}
	}
	return p, nil
}

// newDialing is New for a provider whose connections come from
// opts.Dial.
func newDialing(opts Options) (*Provider, error) {
	helper := opts.Helper
	if helper == "" {
		var err error
		if helper, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("ssh executor: finding the berth binary for the helper: %w", err)
		}
	}
	target := opts.Target
	if target == "" {
		target = "the host"
	}
	return &Provider{
		opts: opts, log: opts.Logger.With("executor", Name, "host", target),
		addr: target, helperPath: helper, conns: map[*client]struct{}{},
	}, nil
}

// where names the host in messages: user@host:port, or the dialer's
// target.
func (p *Provider) where() string {
	if p.user == "" {
		return p.addr
	}
	return p.user + "@" + p.addr
}

// Create implements executor.Provider.
func (p *Provider) Create(ctx context.Context) (executor.Executor, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("ssh executor: provider is shut down")
	}
	return &Executor{p: p}, nil
}

// Describe implements executor.Describer.
func (p *Provider) Describe(info *runnerapi.Info) {
	info.Executor = Name
	info.Shell = "bash"
	f := &info.Features
	executor.RunnerFeatures(f)
	f.Shared = true
}

// Shutdown implements executor.Shutdowner: it closes the connections of
// executors that were never cleaned up (normally none) and refuses new
// executors. Stage processes of such executors are left to the next
// runner start's Sweep.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[*client]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		p.log.Warn("closing the connection of an executor that was not cleaned up")
		c.Close()
	}
	return nil
}

// track registers an open connection for Shutdown; untrack forgets it.
func (p *Provider) track(c *client) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return errors.New("ssh executor: provider is shut down")
	}
	p.conns[c] = struct{}{}
	return nil
}

func (p *Provider) untrack(c *client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// Sweep implements executor.Sweeper: it kills every process on the host
// that a stage of this runner started and that outlived a runner manager
// killed without a chance to clean up (or a connection lost for good).
func (p *Provider) Sweep(ctx context.Context, o executor.SweepOptions) error {
	scope := markerScope(o.SystemID, o.ShortToken)
	if scope == "" {
		return nil
	}
	wrap := func(err error) error {
		return fmt.Errorf("sweeping processes of runner %s on %s: %w", o.ShortToken, p.where(), err)
	}
	c, err := p.dial(ctx)
	if err != nil {
		return wrap(err)
	}
	defer c.Close()
	hb, err := p.helperBinary()
	if err != nil {
		return wrap(err)
	}
	pr, err := probeHost(ctx, c, probeRequest{helper: hb})
	if err != nil {
		return wrap(err)
	}
	if err := checkPlatform(pr, hb); err != nil {
		return wrap(err)
	}
	if pr.helperSize != hb.size {
		if err := p.installHelper(ctx, c, pr.home, hb, nil); err != nil {
			return wrap(err)
		}
	}
	out, err := c.output(ctx, reapCommand(remoteHelper(pr.home, hb), "--scope", scope, "KILL"), nil)
	if err != nil {
		return wrap(err)
	}
	var n int
	if _, err := fmt.Sscanf(string(out), "signalled %d processes", &n); err == nil && n > 0 {
		p.log.Warn("killed processes left by a previous runner manager", "runner", o.ShortToken, "processes", n)
	}
	return nil
}

// markerScope is the scope of a runner's stage markers: Sweep finds the
// processes of a crashed predecessor by it ("" without a system id).
func markerScope(systemID, shortToken string) string {
	if systemID == "" || shortToken == "" {
		return ""
	}
	return executor.SafeName(systemID) + "." + executor.SafeName(shortToken)
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// expandHome expands a leading ~/ of a local path.
func expandHome(p string) (string, error) {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("expanding %s: %w", p, err)
	}
	return filepath.Join(h, strings.TrimPrefix(p, "~")), nil
}
