package bench

import (
	"context"
	"net"
	"sync"
	"time"
)

// delayConn is a connection over a link with one-way latency d and no
// bandwidth limit: a write returns at once and its bytes reach the peer d
// later, in order; what the peer sends is readable d after it arrived.
// Several messages in flight are delayed together, not one after another,
// as on a real link. The bench's runners talk through it (--rtt) to put
// a network between them and the coordinator.
type delayConn struct {
	net.Conn
	d time.Duration

	out  chan delayed // to the writer goroutine
	in   chan delayed // from the reader goroutine
	rest []byte       // of the chunk Read returns from

	mu     sync.Mutex
	werr   error
	closed chan struct{}
	once   sync.Once
}

type delayed struct {
	b   []byte
	at  time.Time
	err error
}

// delayQueue bounds the chunks in flight each way (backpressure beyond).
const delayQueue = 1024

func newDelayConn(c net.Conn, d time.Duration) *delayConn {
	dc := &delayConn{Conn: c, d: d, out: make(chan delayed, delayQueue), in: make(chan delayed, delayQueue), closed: make(chan struct{})}
	go dc.writeLoop()
	go dc.readLoop()
	return dc
}

// delayDialer dials through a delay line of one-way latency d.
func delayDialer(d time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var dialer net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newDelayConn(c, d), nil
	}
}

func (c *delayConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	err := c.werr
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	b := make([]byte, len(p))
	copy(b, p)
	select {
	case c.out <- delayed{b: b, at: time.Now().Add(c.d)}:
		return len(p), nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *delayConn) writeLoop() {
	for {
		select {
		case m := <-c.out:
			sleepUntil(m.at, c.closed)
			if _, err := c.Conn.Write(m.b); err != nil {
				c.mu.Lock()
				c.werr = err
				c.mu.Unlock()
				return
			}
		case <-c.closed:
			return
		}
	}
}

func (c *delayConn) readLoop() {
	for {
		b := make([]byte, 32<<10)
		n, err := c.Conn.Read(b)
		m := delayed{b: b[:n], at: time.Now().Add(c.d), err: err}
		select {
		case c.in <- m:
		case <-c.closed:
			return
		}
		if err != nil {
			return
		}
	}
}

func (c *delayConn) Read(p []byte) (int, error) {
	if len(c.rest) == 0 {
		select {
		case m := <-c.in:
			sleepUntil(m.at, c.closed)
			if len(m.b) == 0 {
				if m.err != nil {
					return 0, m.err
				}
				return 0, nil
			}
			c.rest = m.b
			if m.err != nil {
				// Deliver the bytes now, the error on the next Read.
				defer func() {
					select {
					case c.in <- delayed{at: m.at, err: m.err}:
					default:
					}
				}()
			}
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

func (c *delayConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// sleepUntil waits until t or until done is closed.
func sleepUntil(t time.Time, done <-chan struct{}) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-done:
	}
}
