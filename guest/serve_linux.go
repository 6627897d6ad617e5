package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// Serve serves a on the virtio-serial port device until it fails: the
// host's clients are streams of a session over the port (see HostMux);
// when the host's end goes away, the port is opened again for the next.
func Serve(a *Agent, device string) error {
	s := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	pb.RegisterAgentServer(s, a)
	return s.Serve(newSessionListener(portAddr(device), func(ctx context.Context) (io.ReadWriteCloser, error) {
		return openPort(ctx, device)
	}))
}

// openPort opens the port and returns once the host sent something: while
// the host's side of a virtio-serial port is not connected, what the
// guest writes is lost and reads end at once with nothing (EOF).
func openPort(ctx context.Context, device string) (io.ReadWriteCloser, error) {
	f, err := os.OpenFile(device, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", device, err)
	}
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			return &portConn{f: f, pending: buf[:n]}, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			return nil, fmt.Errorf("reading %s: %w", device, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }

// portConn is the port, with the first bytes the host sent.
type portConn struct {
	f       *os.File
	pending []byte
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
func (c *portConn) Close() error                { return c.f.Close() }
