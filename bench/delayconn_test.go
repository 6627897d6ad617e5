package bench

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayConn: bytes written through the delay line reach the peer
// whole and in order, no sooner than the one-way latency, and the peer's
// answer comes back no sooner than another; closing ends both ways.
func TestDelayConn(t *testing.T) {
	const d = 30 * time.Millisecond
	a, b := net.Pipe()
	c := newDelayConn(a, d)
	defer c.Close()
	go func() {
		buf := make([]byte, 6)
		if _, err := io.ReadFull(b, buf); err != nil {
			return
		}
		_, _ = b.Write(append([]byte("re:"), buf...))
		b.Close()
	}()
	start := time.Now()
	for _, m := range []string{"ab", "cd", "ef"} {
		if n, err := c.Write([]byte(m)); n != 2 || err != nil {
			t.Fatalf("Write(%q) = %d, %v", m, n, err)
		}
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte("re:abcdef")) {
		t.Fatalf("read %q, want %q", got, "re:abcdef")
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("a round trip took %v, under the link's %v", rtt, 2*d)
	}
	c.Close()
	if _, err := c.Write([]byte("y")); err == nil {
		t.Error("Write after Close succeeded")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("Read after Close succeeded")
	}
}
