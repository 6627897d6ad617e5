package ssh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/fleeting/connector"
)

// Errors of connecting and of a connection, checked with errors.Is.
var (
	// ErrUnreachable: no TCP connection to the host (refused, no route,
	// no answer within the connect timeout).
	ErrUnreachable = errors.New("host unreachable")
	// ErrAuth: the host refused every credential offered.
	ErrAuth = errors.New("authentication failed")
	// ErrConnectionLost: the connection ended while the job still needed
	// it (the host went away, keepalives went unanswered, or the
	// executor was shut down).
	ErrConnectionLost = errors.New("connection to the host lost")
	// ErrKeepaliveTimeout is the cause of ErrConnectionLost when
	// keepalives went unanswered.
	ErrKeepaliveTimeout = errors.New("keepalives unanswered")
)

// dialAttempts bounds how often a handshake the server broke off (sshd's
// MaxStartups throttling of many jobs starting at once shows as an EOF
// right after connecting) is tried again.
const dialAttempts = 3

// authMethods builds the credentials of [runners.ssh]: the identity
// file's key, then the password (also answering keyboard-interactive
// prompts with it).
func authMethods(c config.SSH) ([]xssh.AuthMethod, string, error) {
	var auth []xssh.AuthMethod
	var desc []string
	if c.IdentityFile != "" {
		path, err := expandHome(c.IdentityFile)
		if err != nil {
			return nil, "", fmt.Errorf("ssh.identity_file: %w", err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", fmt.Errorf("ssh.identity_file: %w", err)
		}
		signer, err := xssh.ParsePrivateKey(b)
		var pp *xssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, "", fmt.Errorf("ssh.identity_file %s: the key is encrypted with a passphrase; give an unencrypted key", path)
		}
		if err != nil {
			return nil, "", fmt.Errorf("ssh.identity_file %s: %w", path, err)
		}
		auth = append(auth, xssh.PublicKeys(signer))
		desc = append(desc, "key "+path+" ("+signer.PublicKey().Type()+" "+xssh.FingerprintSHA256(signer.PublicKey())+")")
	}
	if c.Password != "" {
		pw := c.Password
		auth = append(auth, xssh.Password(pw), xssh.KeyboardInteractive(func(_, _ string, qs []string, _ []bool) ([]string, error) {
			ans := make([]string, len(qs))
			for i := range ans {
				ans[i] = pw
			}
			return ans, nil
		}))
		desc = append(desc, "password")
	}
	if len(auth) == 0 {
		return nil, "", errors.New("ssh.identity_file or ssh.password is required")
	}
	return auth, strings.Join(desc, " and "), nil
}

// client is one SSH connection to the host. It is safe for concurrent
// use: a stage's session and the sessions that stop it share it.
type client struct {
	addr string
	ssh  *xssh.Client
	log  *slog.Logger
	done chan struct{}

	mu  sync.Mutex
	err error // why the connection ended
}

// dial connects and authenticates. ctx and Options.ConnectTimeout bound
// the set-up only; the connection lives until Close or until keepalives
// go unanswered.
func (p *Provider) dial(ctx context.Context) (*client, error) {
	wrap := func(err error) error { return fmt.Errorf("connecting: %w", err) }
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.ConnectTimeout)
	defer cancel()
	var err error
	for attempt := range dialAttempts {
		if attempt > 0 {
			p.log.Debug("handshake broken off by the host; trying again", "attempt", attempt+1, "err", err)
			select {
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			case <-dctx.Done():
			}
		}
		var c *client
		c, err = p.dialOnce(dctx)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, wrap(fmt.Errorf("%w (%w)", ctx.Err(), err))
		}
		if dctx.Err() != nil {
			if !errors.Is(err, ErrUnreachable) {
				err = fmt.Errorf("%w: no answer within %s: %w", ErrUnreachable, p.opts.ConnectTimeout, err)
			}
			return nil, wrap(err)
		}
		if !retryable(err) {
			return nil, wrap(err)
		}
	}
	return nil, wrap(fmt.Errorf("the host broke off the handshake %d times (sshd's MaxStartups?): %w", dialAttempts, err))
}

// retryable reports whether a failed handshake may succeed when tried
// again: the server closed or reset the connection before authentication
// was decided.
func retryable(err error) bool {
	var hk *HostKeyError
	if errors.As(err, &hk) || errors.Is(err, ErrAuth) || errors.Is(err, ErrUnreachable) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

func (p *Provider) dialOnce(ctx context.Context) (*client, error) {
	if p.opts.Dial != nil {
		sc, err := p.opts.Dial(ctx)
		if err != nil {
			return nil, err
		}
		return p.watch(sc), nil
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	nc = quickAck(nc)
	check, algos, err := p.hostKeys.forHost(p.addr, nc.RemoteAddr())
	if err != nil {
		nc.Close()
		return nil, err
	}
	cfg := &xssh.ClientConfig{
		User:              p.user,
		Auth:              p.auth,
		HostKeyCallback:   check,
		HostKeyAlgorithms: algos,
		ClientVersion:     "SSH-2.0-Berth",
	}
	sc, err := connector.Handshake(ctx, nc, p.addr, cfg)
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	if err != nil {
		var hk *HostKeyError
		if errors.As(err, &hk) {
			return nil, hk
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("%w: no answer within %s: %w", ErrUnreachable, p.opts.ConnectTimeout, err)
		}
		if len(algos) > 0 && strings.Contains(err.Error(), "no common algorithm for host key") {
			// known_hosts knows the host only by key types it no
			// longer offers: as good as a changed key.
			return nil, fmt.Errorf("%w for %s: %s lists only %s keys for the host, and the host offers none of them (after checking, replace the entry): %w",
				ErrHostKeyChanged, p.addr, p.hostKeys.file, strings.Join(algos, ", "), err)
		}
		if strings.Contains(err.Error(), "unable to authenticate") {
			// x/crypto has no typed error for this; its message is
			// stable ("ssh: unable to authenticate, attempted methods
			// [none publickey], no supported methods remain").
			return nil, fmt.Errorf("%w as %s with %s: %w", ErrAuth, p.user, p.authDesc, err)
		}
		return nil, err
	}
	return p.watch(sc), nil
}

// watch watches a new connection: why it ended, and keepalives.
func (p *Provider) watch(sc *xssh.Client) *client {
	c := &client{addr: p.addr, ssh: sc, log: p.log, done: make(chan struct{})}
	go func() {
		err := c.ssh.Wait()
		c.setErr(err)
		close(c.done)
	}()
	if p.opts.Keepalive > 0 {
		go connector.Keepalive(c.ssh, p.opts.Keepalive, c.done, func(missed int) {
			c.log.Warn("ssh keepalives unanswered; closing the connection", "addr", c.addr, "missed", missed)
			c.setErr(ErrKeepaliveTimeout)
		})
	}
	return c
}

func (c *client) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if err == nil {
			err = io.EOF
		}
		c.err = err
	}
}

// lost returns nil while the connection is up, else an error wrapping
// ErrConnectionLost and why it ended (also once Close was called).
func (c *client) lost() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return nil
	}
	return fmt.Errorf("%w (%s): %w", ErrConnectionLost, c.addr, c.err)
}

// check asks the host for an answer (a keepalive) and returns an error
// wrapping ErrConnectionLost when the connection turns out to be gone; a
// host that does not answer within d is not judged (keepalives will).
// A session may end because its connection broke a moment before the
// connection itself is seen to end: check tells the two apart.
func (c *client) check(d time.Duration) error {
	if err := c.lost(); err != nil {
		return err
	}
	res := make(chan error, 1)
	go func() {
		_, _, err := c.ssh.SendRequest("keepalive@openssh.com", true, nil)
		res <- err
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-res:
		if err == nil {
			return nil
		}
		select {
		case <-c.done:
			return c.lost()
		case <-t.C:
			return fmt.Errorf("%w (%s): %w", ErrConnectionLost, c.addr, err)
		}
	case <-c.done:
		return c.lost()
	case <-t.C:
		return nil
	}
}

// Close closes the connection and every session on it.
func (c *client) Close() error {
	c.setErr(net.ErrClosed)
	err := c.ssh.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// session opens a session, giving up when ctx ends or the connection
// ends first.
func (c *client) session(ctx context.Context) (*xssh.Session, error) {
	return whileUp(ctx, c, c.ssh.NewSession, func(s *xssh.Session) { s.Close() })
}

// whileUp runs open (which opens a channel), giving up when ctx ends or
// the connection ends first. x/crypto can leave a channel opened just as
// the connection dies waiting forever; whileUp does not wait with it,
// and closes with closeFn what opens too late.
func whileUp[T any](ctx context.Context, c *client, open func() (T, error), closeFn func(T)) (T, error) {
	var zero T
	if err := c.lost(); err != nil {
		return zero, err
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
		if r.err != nil {
			return zero, c.why(fmt.Errorf("opening a session: %w", r.err))
		}
		return r.v, nil
	case <-c.done:
		late()
		return zero, c.lost()
	case <-ctx.Done():
		late()
		return zero, ctx.Err()
	}
}

// output runs a command to completion with stdin (nil: none) and returns
// its stdout. A non-zero exit returns an error wrapping the
// *xssh.ExitError with the command's stderr; when ctx ends first the
// session is closed and ctx's error returned.
func (c *client) output(ctx context.Context, cmd string, stdin io.Reader) ([]byte, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 4 << 10}
	s.Stdin, s.Stdout, s.Stderr = stdin, &stdout, stderr
	if err := s.Start(cmd); err != nil {
		return nil, c.why(fmt.Errorf("starting a command: %w", err))
	}
	waited := make(chan error, 1)
	go func() { waited <- s.Wait() }()
	select {
	case err = <-waited:
	case <-ctx.Done():
		s.Close()
		return stdout.Bytes(), ctx.Err()
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	var ee *xssh.ExitError
	if errors.As(err, &ee) {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return stdout.Bytes(), fmt.Errorf("%w: %s", err, msg)
		}
		return stdout.Bytes(), err
	}
	return stdout.Bytes(), c.why(err)
}

// why prefers the reason the connection ended over a generic error of a
// session on it.
func (c *client) why(err error) error {
	if lost := c.check(time.Second); lost != nil {
		return lost
	}
	return err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
