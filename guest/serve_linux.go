package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/berthci/berth/guest/internal/pb"
)

// FindPort returns the device of the virtio-serial port named name
// (/dev/vportNpM). There is no udev in the VM to make /dev/virtio-ports
// links: the names are in sysfs.
func FindPort(name string) (string, error) {
	ents, err := filepath.Glob("/sys/class/virtio-ports/*/name")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(e)), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q (%d ports)", name, len(ents))
}

// Serve serves a on the virtio-serial port device until it fails. Each
// connection of the host (the hypervisor's socket) is one gRPC
// connection; when the host goes away the port is opened again for the
// next.
func Serve(a *Agent, device string) error {
	s := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	pb.RegisterAgentServer(s, a)
	return s.Serve(&portListener{device: device})
}

// portListener hands out the port as one connection at a time: the next
// Accept opens it again once the previous connection closed, and returns
// only when the host sent something — the host's side of a virtio-serial
// port may not be connected yet, and what the guest writes then is lost
// (gRPC's server speaks first).
type portListener struct {
	device string
	mu     sync.Mutex
	busy   chan struct{} // closed when the current connection closes
	closed bool
}

func (l *portListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	busy := l.busy
	l.mu.Unlock()
	if busy != nil {
		<-busy
	}
	for {
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		f, err := os.OpenFile(l.device, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", l.device, err)
		}
		first, err := waitForHost(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		c := &portConn{f: f, pending: first, done: make(chan struct{})}
		l.mu.Lock()
		l.busy = c.done
		l.mu.Unlock()
		return c, nil
	}
}

// waitForHost reads the first bytes the host sends. While the host is not
// connected a read ends at once with nothing (EOF): that is polled.
func waitForHost(f *os.File) ([]byte, error) {
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			return buf[:n], nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading %s: %w", f.Name(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *portListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return nil
}

func (l *portListener) Addr() net.Addr { return portAddr(l.device) }

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }

// portConn is one connection of the host over the port.
type portConn struct {
	f       *os.File
	pending []byte
	once    sync.Once
	done    chan struct{}
}

func (c *portConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.f.Read(p)
}

func (c *portConn) Write(p []byte) (int, error) { return c.f.Write(p) }

func (c *portConn) Close() error {
	var err error
	c.once.Do(func() {
		err = c.f.Close()
		close(c.done)
	})
	return err
}

func (c *portConn) LocalAddr() net.Addr                { return portAddr(c.f.Name()) }
func (c *portConn) RemoteAddr() net.Addr               { return portAddr("host") }
func (c *portConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *portConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *portConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }
