package guest

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/berthci/berth/internal/netpipe"
)

// The agent's virtio-serial port is one byte stream between the guest and
// whoever holds the hypervisor's end of it, with no notion of
// connections: when a host client closes and the next one connects at
// once, the guest cannot tell where the first one's bytes end. So the
// port carries one yamux session for the VM's whole life, held by the
// hypervisor (HostMux), and every host client is a stream of it: any
// number of clients at once, each its own gRPC connection, and none ever
// sees another's bytes.
//
//	client ─┐                                     ┌─ gRPC conn
//	client ─┼─ unix socket ─ HostMux ═ port ═ guest session ─┼─ gRPC conn
//	client ─┘        (yamux client)    (yamux server)        └─ gRPC conn

// muxConfig is the session's configuration on both ends. No keepalives
// and no open timeout: the host opens streams while the guest still
// boots (minutes under emulation), and a VM that is gone closes the
// port. Writes may wait for a guest busy under emulation.
func muxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.StreamOpenTimeout = 0
	c.ConnectionWriteTimeout = 2 * time.Minute
	c.LogOutput = io.Discard
	return c
}

// HostMux serves a VM's agent to any number of host clients: each
// connection accepted on its listener becomes a stream of the session
// over the port. Create it with NewHostMux once the port is connected;
// it serves until Close or until the port or the listener fails.
type HostMux struct {
	sess   *yamux.Session
	l      net.Listener
	wg     sync.WaitGroup
	once   sync.Once
	ctx    context.Context // ends when the mux stops
	cancel context.CancelFunc
}

// NewHostMux starts serving l over port.
func NewHostMux(port io.ReadWriteCloser, l net.Listener) (*HostMux, error) {
	sess, err := yamux.Client(port, muxConfig())
	if err != nil {
		return nil, fmt.Errorf("guest port: %w", err)
	}
	m := &HostMux{sess: sess, l: l}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.wg.Add(1)
	go m.serve()
	go func() {
		select {
		case <-sess.CloseChan():
			m.stop()
		case <-m.ctx.Done():
		}
	}()
	return m, nil
}

func (m *HostMux) serve() {
	defer m.wg.Done()
	for {
		c, err := m.l.Accept()
		if err != nil {
			m.stop()
			return
		}
		s, err := m.sess.Open()
		if err != nil {
			c.Close()
			m.stop()
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			netpipe.Join(m.ctx, c, s)
		}()
	}
}

func (m *HostMux) stop() {
	m.once.Do(func() {
		// Done closes last: once it has, the socket takes no client.
		m.l.Close()
		m.sess.Close()
		m.cancel()
	})
}

// Done is closed when the mux stopped: Close, or the port or the listener
// failed.
func (m *HostMux) Done() <-chan struct{} { return m.ctx.Done() }

// Close stops serving: the listener, the session and every client
// connection are closed.
func (m *HostMux) Close() error {
	m.stop()
	m.wg.Wait()
	return nil
}

// sessionListener is the guest's end: it accepts the host's streams of
// the session over the port, and when the session ends (the hypervisor's
// end went away) opens the port again for the next one.
type sessionListener struct {
	// open opens the port and returns once the host is there.
	open func(ctx context.Context) (io.ReadWriteCloser, error)
	addr net.Addr

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	sess   *yamux.Session
}

func newSessionListener(addr net.Addr, open func(ctx context.Context) (io.ReadWriteCloser, error)) *sessionListener {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessionListener{open: open, addr: addr, ctx: ctx, cancel: cancel}
}

func (l *sessionListener) session() (*yamux.Session, error) {
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	if s != nil && !s.IsClosed() {
		return s, nil
	}
	port, err := l.open(l.ctx)
	if err != nil {
		if l.ctx.Err() != nil {
			return nil, net.ErrClosed
		}
		return nil, err
	}
	s, err = yamux.Server(port, muxConfig())
	if err != nil {
		port.Close()
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		s.Close()
		return nil, net.ErrClosed
	}
	l.sess = s
	return s, nil
}

func (l *sessionListener) Accept() (net.Conn, error) {
	for {
		s, err := l.session()
		if err != nil {
			return nil, err
		}
		c, err := s.Accept()
		if err == nil {
			return c, nil
		}
		if l.ctx.Err() != nil {
			return nil, net.ErrClosed
		}
		s.Close() // the host's end went away: the next session
	}
}

func (l *sessionListener) Close() error {
	l.cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		l.sess.Close()
	}
	return nil
}

func (l *sessionListener) Addr() net.Addr { return l.addr }
