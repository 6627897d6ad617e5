package jobpush

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/coder/websocket"
)

// The tunnel: gRPC's HTTP/2 bytes travel as WebSocket binary messages, one
// message per write, as in GitLab's Job Router (gitlab-next.md §4.3). The
// coordinator upgrades GET Path and hands the connection to its gRPC
// server through a listener; the runner dials the WebSocket and gives the
// connection to its gRPC client.

// tunnelListener is a net.Listener whose connections are WebSocket
// upgrades handed in by Server.Upgrade.
type tunnelListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newTunnelListener() *tunnelListener {
	return &tunnelListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *tunnelListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *tunnelListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *tunnelListener) Addr() net.Addr { return tunnelAddr{} }

// hand gives a connection to Accept; false when the listener is closed.
func (l *tunnelListener) hand(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "websocket" }
func (tunnelAddr) String() string  { return "websocket" + Path }

// tunnelConn is a tunnel's net.Conn that tells when it is closed and ends
// the WebSocket's lifetime then.
type tunnelConn struct {
	net.Conn
	ws     *websocket.Conn
	cancel context.CancelFunc
	once   sync.Once
	closed chan struct{}
}

func newTunnelConn(c *websocket.Conn) *tunnelConn {
	// The tunnel outlives the request that opened it: its lifetime is its
	// own, ended by Close.
	ctx, cancel := context.WithCancel(context.Background())
	return &tunnelConn{Conn: websocket.NetConn(ctx, c, websocket.MessageBinary), ws: c, cancel: cancel, closed: make(chan struct{})}
}

// Close drops the connection at once. gRPC has said goodbye above it
// (GOAWAY) when there was a peer to say it to; a WebSocket closing
// handshake would wait up to seconds for a peer that is gone, and a
// server closing its streams closes them one after another.
func (c *tunnelConn) Close() error {
	c.once.Do(func() {
		c.cancel()
		_ = c.ws.CloseNow()
		close(c.closed)
	})
	return nil
}

// upgrade accepts a WebSocket with the ws-tunnel subprotocol on r and
// returns its connection; on failure the client has been answered.
func upgrade(w http.ResponseWriter, r *http.Request) (*tunnelConn, error) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		return nil, err // Accept answered (400, 426, ...)
	}
	if c.Subprotocol() != Subprotocol {
		_ = c.Close(websocket.StatusPolicyViolation, "subprotocol "+Subprotocol+" required")
		return nil, fmt.Errorf("upgrade without subprotocol %s", Subprotocol)
	}
	return newTunnelConn(c), nil
}

// HandshakeError is a WebSocket upgrade the server answered with another
// status than 101.
type HandshakeError struct {
	StatusCode int
	Err        error
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("push channel handshake: %d %s: %v", e.StatusCode, http.StatusText(e.StatusCode), e.Err)
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// Is matches ErrNotServed for statuses that say nothing serves the path
// (404, 405, 501) and ErrUnauthenticated for 401 and 403.
func (e *HandshakeError) Is(target error) bool {
	switch target {
	case ErrNotServed:
		return e.StatusCode == http.StatusNotFound || e.StatusCode == http.StatusMethodNotAllowed || e.StatusCode == http.StatusNotImplemented
	case ErrUnauthenticated:
		return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden
	}
	return false
}

// ErrNotServed: the server does not serve the push channel (its upgrade
// path answers 404, or its gRPC server does not know the service, as
// GitLab's Job Router, which serves another protocol, answers).
var ErrNotServed = errors.New("push channel not served")

// dialTunnel opens the WebSocket at serverURL with the runner token.
func dialTunnel(ctx context.Context, serverURL, token string, hc *http.Client, header http.Header) (*tunnelConn, error) {
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Authorization", "Bearer "+token)
	c, resp, err := websocket.Dial(ctx, serverURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: h, Subprotocols: []string{Subprotocol}})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, &HandshakeError{StatusCode: resp.StatusCode, Err: err}
		}
		return nil, err
	}
	if c.Subprotocol() != Subprotocol {
		_ = c.Close(websocket.StatusPolicyViolation, "subprotocol "+Subprotocol+" required")
		return nil, fmt.Errorf("push channel handshake: the server did not agree to subprotocol %s", Subprotocol)
	}
	return newTunnelConn(c), nil
}
