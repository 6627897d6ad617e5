package guest

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/berthci/berth/guest/internal/pb"
)

// muxed serves an agent over a stand-in for the port (a pipe) the way a
// VM does: the guest's session listener on one end, a HostMux serving a
// unix socket on the other. The guest's end opens only once hostUp is
// closed (a guest still booting). It returns the socket's path and the
// mux.
func muxed(t *testing.T, hostUp <-chan struct{}) (string, *HostMux, net.Conn) {
	t.Helper()
	hostEnd, guestEnd := net.Pipe()
	opened := false
	l := newSessionListener(portAddr("test"), func(ctx context.Context) (io.ReadWriteCloser, error) {
		select {
		case <-hostUp:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if opened {
			<-ctx.Done() // the port is gone for good
			return nil, ctx.Err()
		}
		opened = true
		return guestEnd, nil
	})
	a := &Agent{Root: t.TempDir(), Version: "test", NoChroot: true}
	s := grpc.NewServer()
	pb.RegisterAgentServer(s, a)
	go s.Serve(l)
	t.Cleanup(s.Stop)

	sock := filepath.Join(t.TempDir(), "agent.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewHostMux(hostEnd, ul)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return sock, m, hostEnd
}

func dialUnix(sock string) Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
}

func hello(t *testing.T, sock string) {
	t.Helper()
	c, err := NewClient(dialUnix(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if info, err := c.Hello(ctx); err != nil || info.Version != "test" {
		t.Fatalf("Hello: %+v, %v", info, err)
	}
}

// TestMuxClientsOneAfterAnother: clients that connect the moment the
// previous one closed each get their own conversation — with a bare port,
// the guest would read the next client's bytes as the end of the
// previous one's.
func TestMuxClientsOneAfterAnother(t *testing.T) {
	up := make(chan struct{})
	close(up)
	sock, _, _ := muxed(t, up)
	for range 50 {
		hello(t, sock)
	}
}

// TestMuxConcurrentClients: several clients at once, each running
// commands, see only their own output.
func TestMuxConcurrentClients(t *testing.T) {
	up := make(chan struct{})
	close(up)
	sock, _, _ := muxed(t, up)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			c, err := NewClient(dialUnix(sock))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for j := range 5 {
				var out syncBuf
				want := string(rune('a'+i)) + string(rune('0'+j))
				err := c.Run(context.Background(), RunOptions{Argv: []string{"/bin/sh", "-c", "printf %s " + want}, Detached: true, Output: &out})
				if err != nil || out.String() != want {
					t.Errorf("client %d run %d: %q, %v", i, j, out.String(), err)
				}
			}
		})
	}
	wg.Wait()
}

// TestMuxHostFirst: clients that connect while the guest still boots are
// answered once it is up.
func TestMuxHostFirst(t *testing.T) {
	up := make(chan struct{})
	sock, _, _ := muxed(t, up)
	done := make(chan struct{})
	go func() {
		defer close(done)
		hello(t, sock)
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("Hello answered before the guest was up")
	default:
	}
	close(up)
	<-done
}

// TestMuxPortGone: when the port closes (QEMU exited), the mux stops and
// its socket refuses clients.
func TestMuxPortGone(t *testing.T) {
	up := make(chan struct{})
	close(up)
	sock, m, hostEnd := muxed(t, up)
	hello(t, sock)
	hostEnd.Close()
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the mux did not stop when the port closed")
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err == nil {
		c.Close()
		t.Error("the socket still accepts clients")
	}
}
