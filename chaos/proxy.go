package chaos

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Network faults the proxy injects between runners (and their jobs) and
// the coordinator.
const (
	FaultNone     = ""
	FaultDrop     = "drop"     // new connections are closed at once
	FaultDelay    = "delay"    // every chunk is held 50–500 ms
	FaultReset    = "reset"    // connections are reset (RST) at a random point
	FaultTruncate = "truncate" // responses are cut after a random number of bytes
)

// Proxy is a TCP proxy on loopback that injects one fault mode at a time.
// Its randomness comes from its own seeded source.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  string
	rng   *rand.Rand
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free port of host (an address of this machine:
// loopback, or the Docker bridge's for jobs in containers) and forwards
// to target.
func NewProxy(host, target string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetMode switches the fault mode; FaultNone forwards faithfully.
func (p *Proxy) SetMode(mode string) {
	p.mu.Lock()
	p.mode = mode
	p.mu.Unlock()
}

// Close stops the proxy and every connection through it.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) decide() (mode string, cut int64, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mode = p.mode
	switch mode {
	case FaultReset, FaultTruncate:
		cut = int64(p.rng.IntN(4096))
		if p.rng.IntN(2) == 0 { // half the connections pass untouched
			mode = FaultNone
		}
	case FaultDelay:
		delay = time.Duration(50+p.rng.IntN(450)) * time.Millisecond
	}
	return mode, cut, delay
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		mode, cut, delay := p.decide()
		if mode == FaultDrop {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.forward(c, mode, cut, delay)
		}()
	}
}

func (p *Proxy) forward(client net.Conn, mode string, cut int64, delay time.Duration) {
	p.track(client, true)
	defer p.track(client, false)
	defer client.Close()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	p.track(server, true)
	defer p.track(server, false)
	defer server.Close()

	done := make(chan struct{}, 2)
	go func() { // client → server
		copyChunks(server, client, -1, delay)
		if tc, ok := server.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() { // server → client, where responses are cut
		limit := int64(-1)
		if mode == FaultReset || mode == FaultTruncate {
			limit = cut
		}
		copyChunks(client, server, limit, delay)
		if mode == FaultReset {
			if tc, ok := client.(*net.TCPConn); ok {
				tc.SetLinger(0) // Close sends RST
			}
			client.Close()
			server.Close()
		} else if tc, ok := client.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	if mode == FaultReset || mode == FaultTruncate {
		client.Close()
		server.Close()
	}
	<-done
}

// copyChunks copies src to dst, holding every chunk for delay, and stops
// after limit bytes (limit < 0: no limit).
func copyChunks(dst io.Writer, src io.Reader, limit int64, delay time.Duration) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if limit >= 0 && n+int64(k) > limit {
				k = int(limit - n)
			}
			if delay > 0 {
				time.Sleep(delay)
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
			n += int64(k)
			if limit >= 0 && n >= limit {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
