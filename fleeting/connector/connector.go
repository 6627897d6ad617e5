// Package connector connects to fleeting instances over SSH
// (golang.org/x/crypto/ssh), from the ConnectInfo a plugin returns: run
// commands with streamed input and output and an exit status, forward TCP
// and unix-socket connections through the connection (to reach a Docker
// socket or a nesting daemon on the instance), and dial onwards through an
// open connection (a hop into a VM on the instance).
//
// WinRM (protocol winrm and winrm+https) is out of scope: Dial refuses it
// with ErrUnsupportedProtocol.
package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/internal/netpipe"
)

// Defaults for a ConnectInfo that leaves Timeout or Keepalive at 0.
const (
	DefaultTimeout   = 30 * time.Second
	DefaultKeepalive = 30 * time.Second
	// KeepaliveMissed is how many keepalives may go unanswered before the
	// connection is considered dead (OpenSSH's ServerAliveCountMax).
	KeepaliveMissed = 3
)

// Errors of the connector.
var (
	ErrUnsupportedProtocol = errors.New("unsupported connector protocol")
	ErrNoAddress           = errors.New("instance has no address")
	ErrNoCredentials       = errors.New("no key or password to authenticate with")
	ErrKeepaliveTimeout    = errors.New("keepalive timed out")
)

// Options are the caller's choices for a connection, beyond the
// ConnectInfo.
type Options struct {
	// UseExternalAddr picks ConnectInfo.ExternalAddr over InternalAddr
	// (config.toml's use_external_addr). Whichever is set is used when the
	// other is empty.
	UseExternalAddr bool
	// HostKey decides which host keys to accept. nil accepts any key, as
	// GitLab's connector does: ConnectInfo carries no host key, and cloud
	// instances are new machines with new keys. See TrustOnFirstUse.
	HostKey HostKeyPolicy
	// Via, if set, reaches the instance through this connection instead of
	// dialling it directly (an instance behind a bastion, a VM inside an
	// instance).
	Via *Client
	// Logger receives connection events. Default: discard.
	Logger *slog.Logger
}

// Client is an SSH connection to one instance. It is safe for concurrent
// use: many commands and forwarded connections share it.
type Client struct {
	ID   string // instance ID
	Addr string // address dialled

	ssh    *ssh.Client
	logger *slog.Logger
	done   chan struct{}

	mu  sync.Mutex
	err error // why the connection ended
}

// Address returns the host:port to dial for info.
func Address(info fleeting.ConnectInfo, useExternal bool) (string, error) {
	addr := info.InternalAddr
	if (useExternal && info.ExternalAddr != "") || addr == "" {
		addr = info.ExternalAddr
	}
	if addr == "" {
		return "", &fleeting.InstanceError{ID: info.ID, Err: ErrNoAddress}
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr, nil
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(info.Port())), nil
}

// Dial connects to the instance info describes. ctx bounds the connection
// set-up only (together with info.Timeout); the connection lives until
// Close, or until keepalives go unanswered.
func Dial(ctx context.Context, info fleeting.ConnectInfo, opts Options) (*Client, error) {
	if p := info.Protocol; p != "" && p != fleeting.ProtocolSSH {
		return nil, fmt.Errorf("connecting to instance %s: %w: %q (only ssh is implemented; WinRM is out of scope)", info.ID, ErrUnsupportedProtocol, p)
	}
	addr, err := Address(info, opts.UseExternalAddr)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	wrap := func(err error) error { return fmt.Errorf("connecting to instance %s at %s: %w", info.ID, addr, err) }
	auth, err := authMethods(info)
	if err != nil {
		return nil, wrap(err)
	}
	timeout := info.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	policy := opts.HostKey
	if policy == nil {
		policy = AcceptAnyHostKey()
	}
	cfg := &ssh.ClientConfig{
		User: info.Username,
		Auth: auth,
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			return policy.Check(info.ID, addr, key)
		},
		Timeout:       timeout,
		ClientVersion: "SSH-2.0-Berth",
	}

	var nc net.Conn
	if opts.Via != nil {
		nc, err = opts.Via.Dial(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, wrap(err)
	}
	sc, err := Handshake(ctx, nc, addr, cfg)
	if err != nil {
		return nil, wrap(err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{ID: info.ID, Addr: addr, ssh: sc, logger: logger, done: make(chan struct{})}
	go func() {
		err := c.ssh.Wait()
		c.setErr(err)
		close(c.done)
	}()
	if ka := info.Keepalive; ka >= 0 {
		if ka == 0 {
			ka = DefaultKeepalive
		}
		go Keepalive(c.ssh, ka, c.done, func(missed int) {
			c.logger.Warn("ssh keepalive timed out; closing", "instance", c.ID, "addr", c.Addr, "missed", missed)
			c.setErr(ErrKeepaliveTimeout)
		})
	}
	return c, nil
}

// Handshake runs the SSH client handshake on nc, bounded by ctx: its
// deadline bounds the handshake and cancelling it closes nc under the
// handshake. On any failure nc is closed; after a cancel the error wraps
// ctx's error.
func Handshake(ctx context.Context, nc net.Conn, addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	conn, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
	if !stop() {
		if conn != nil {
			conn.Close()
		}
		nc.Close()
		if err != nil {
			return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, ctx.Err()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return ssh.NewClient(conn, chans, reqs), nil
}

// Keepalive sends keepalive@openssh.com requests on c every interval
// until done is closed. When KeepaliveMissed requests in a row go
// unanswered it calls dead with that count, closes c and returns. Any
// reply, even a refusal, proves the peer alive.
func Keepalive(c *ssh.Client, interval time.Duration, done <-chan struct{}, dead func(missed int)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	replies := make(chan struct{}, 1)
	outstanding := 0
	for {
		select {
		case <-done:
			return
		case <-replies:
			outstanding = 0
		case <-t.C:
			if outstanding >= KeepaliveMissed {
				dead(outstanding)
				c.Close()
				return
			}
			outstanding++
			go func() {
				if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err == nil {
					select {
					case replies <- struct{}{}:
					default:
					}
				}
			}()
		}
	}
}

func authMethods(info fleeting.ConnectInfo) ([]ssh.AuthMethod, error) {
	var auth []ssh.AuthMethod
	if len(info.Key) > 0 {
		signer, err := ssh.ParsePrivateKey(info.Key)
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, errors.New("the private key is encrypted with a passphrase; give an unencrypted key")
		}
		if err != nil {
			return nil, fmt.Errorf("parsing private key: %w", err)
		}
		auth = append(auth, ssh.PublicKeys(signer))
	}
	if info.Password != "" {
		pw := info.Password
		auth = append(auth, ssh.Password(pw), ssh.KeyboardInteractive(func(_, _ string, qs []string, _ []bool) ([]string, error) {
			ans := make([]string, len(qs))
			for i := range ans {
				ans[i] = pw
			}
			return ans, nil
		}))
	}
	if len(auth) == 0 {
		return nil, ErrNoCredentials
	}
	return auth, nil
}

func (c *Client) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// SSH is the connection itself, for callers that open sessions and
// channels of their own (the instance executor runs the ssh executor's
// machinery on it). Closing it closes the Client.
func (c *Client) SSH() *ssh.Client { return c.ssh }

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it is up, or after Close).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection and everything running over it.
func (c *Client) Close() error {
	c.setErr(net.ErrClosed)
	err := c.ssh.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Command is a command to run on the instance.
type Command struct {
	// Cmd is a shell command line, run by the instance's login shell.
	Cmd string
	// Env is exported to the command (prefixed to Cmd as shell
	// assignments, so it does not depend on the server's AcceptEnv).
	Env map[string]string
	// Stdin, Stdout and Stderr are the command's streams; nil means none.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// ExitError is a command that ended unsuccessfully on the instance.
type ExitError struct {
	// Code is the exit status, or -1 when the command was killed by a
	// signal or ended without a status.
	Code int
	// Signal names the signal that killed it ("KILL"), if any.
	Signal string
}

func (e *ExitError) Error() string {
	switch {
	case e.Signal != "":
		return "command killed by signal " + e.Signal
	case e.Code < 0:
		return "command ended without an exit status"
	}
	return fmt.Sprintf("command exited with status %d", e.Code)
}

// Run runs cmd and waits for it. A command that exits non-zero returns an
// *ExitError; other errors are about the connection. When ctx ends first,
// the command is sent SIGKILL and Run returns ctx's error.
func (c *Client) Run(ctx context.Context, cmd Command) error {
	s, err := whileUp(ctx, c, func() (*ssh.Session, error) { return c.ssh.NewSession() }, (*ssh.Session).Close)
	if err != nil {
		return fmt.Errorf("instance %s: opening session: %w", c.ID, c.closedErr(err))
	}
	defer s.Close()
	s.Stdin, s.Stdout, s.Stderr = cmd.Stdin, cmd.Stdout, cmd.Stderr
	line := cmd.Cmd
	if len(cmd.Env) > 0 {
		line = exports(cmd.Env) + line
	}
	if err := s.Start(line); err != nil {
		return fmt.Errorf("instance %s: starting command: %w", c.ID, c.closedErr(err))
	}
	waited := make(chan error, 1)
	go func() { waited <- s.Wait() }()
	select {
	case err = <-waited:
	case <-ctx.Done():
		s.Signal(ssh.SIGKILL)
		s.Close()
		return ctx.Err()
	}
	var ee *ssh.ExitError
	var missing *ssh.ExitMissingError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		if ee.Signal() != "" {
			return &ExitError{Code: -1, Signal: ee.Signal()}
		}
		return &ExitError{Code: ee.ExitStatus()}
	case errors.As(err, &missing):
		if e := c.Err(); e != nil {
			return fmt.Errorf("instance %s: connection lost: %w", c.ID, e)
		}
		return &ExitError{Code: -1}
	}
	return fmt.Errorf("instance %s: %w", c.ID, c.closedErr(err))
}

// ErrClosed: the connection has ended.
var ErrClosed = errors.New("connection closed")

// whileUp runs open (which opens a channel) but gives up when ctx ends or
// the connection ends first. x/crypto/ssh can leave a channel opened just
// as the connection dies waiting forever; whileUp does not wait with it,
// and closes what open returns too late.
func whileUp[T any](ctx context.Context, c *Client, open func() (T, error), closeFn func(T) error) (T, error) {
	var zero T
	select {
	case <-c.done:
		return zero, ErrClosed
	default:
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := open()
		ch <- result{v, err}
	}()
	late := func() {
		go func() {
			if r := <-ch; r.err == nil {
				closeFn(r.v)
			}
		}()
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-c.done:
		late()
		return zero, ErrClosed
	case <-ctx.Done():
		late()
		return zero, ctx.Err()
	}
}

// closedErr prefers the reason the connection ended over a generic EOF.
func (c *Client) closedErr(err error) error {
	select {
	case <-c.done:
		if e := c.Err(); e != nil && !errors.Is(err, e) {
			return fmt.Errorf("%w (%w)", err, e)
		}
	default:
	}
	return err
}

// exports renders env as POSIX shell assignments.
func exports(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString("export ")
		b.WriteString(k)
		b.WriteString("=")
		b.WriteString(shellQuote(env[k]))
		b.WriteString("; ")
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Dial opens a connection to addr as seen from the instance, through the
// SSH connection: network "tcp" (host:port) or "unix" (a socket path).
func (c *Client) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		return nil, fmt.Errorf("instance %s: dialling %s %s: unsupported network", c.ID, network, addr)
	}
	conn, err := whileUp(ctx, c, func() (net.Conn, error) { return c.ssh.Dial(network, addr) }, net.Conn.Close)
	if err != nil {
		return nil, fmt.Errorf("instance %s: dialling %s %s: %w", c.ID, network, addr, c.closedErr(err))
	}
	return conn, nil
}

// Forward accepts connections on l and connects each to network/addr on the
// instance, until ctx ends or l or the connection fails; it then closes l
// and returns. Typical use: a local unix socket forwarded to the instance's
// /var/run/docker.sock.
func (c *Client) Forward(ctx context.Context, l net.Listener, network, addr string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-c.done:
		}
		l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		local, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			select {
			case <-c.done:
				return fmt.Errorf("instance %s: forwarding: connection ended: %w", c.ID, c.Err())
			default:
			}
			return fmt.Errorf("instance %s: forwarding: %w", c.ID, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			remote, err := c.Dial(ctx, network, addr)
			if err != nil {
				c.logger.Warn("forwarding a connection failed", "error", err)
				local.Close()
				return
			}
			netpipe.Join(ctx, local, remote)
		}()
	}
}
