package netpipe

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// pair is a connected TCP pair (TCP has CloseWrite, net.Pipe has not).
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); acc <- c }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c, <-acc
}

// TestJoinHalfCloses: each direction ends on its own (a request, then
// the client's EOF, then the reply), and Join returns once both ended.
func TestJoinHalfCloses(t *testing.T) {
	client, a := pair(t)
	b, server := pair(t)
	done := make(chan struct{})
	go func() { Join(context.Background(), a, b); close(done) }()
	client.Write([]byte("request"))
	client.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(server)
	if string(got) != "request" {
		t.Fatalf("server read %q", got)
	}
	server.Write([]byte("reply"))
	server.Close()
	got, _ = io.ReadAll(client)
	if string(got) != "reply" {
		t.Fatalf("client read %q after its own half close", got)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Join did not return once both directions ended")
	}
}

// TestJoinStopsWithContext: an idle join ends when ctx does.
func TestJoinStopsWithContext(t *testing.T) {
	_, a := pair(t)
	b, _ := pair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Join(ctx, a, b); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Join did not return after ctx ended")
	}
}
