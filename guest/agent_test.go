package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/guest/internal/pb"
	"github.com/berthci/berth/internal/testenv"
)

// serveAgent serves an agent running scripts on this host (NoChroot, root
// dir) over a unix socket and returns a client of it.
func serveAgent(t *testing.T, root string) (*Client, *Agent) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{Root: root, Version: "test", NoChroot: true}
	s := grpc.NewServer()
	pb.RegisterAgentServer(s, a)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	c, err := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, a
}

func TestHelloReadsTheImageConfig(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/sh"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(ImageConfigPath)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, ImageConfigPath), []byte(`{"env":["PATH=/opt/tool/bin:/bin"],"working_dir":"/src","user":"1000"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := serveAgent(t, root)
	info, err := c.Wait(context.Background(), 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != "test" || len(info.Shells) != 1 || info.Shells[0] != "sh" {
		t.Errorf("info %+v: want version test and shells [sh]", info)
	}
	if len(info.Image.Env) != 1 || info.Image.Env[0] != "PATH=/opt/tool/bin:/bin" || info.Image.WorkingDir != "/src" || info.Image.User != "1000" {
		t.Errorf("image config %+v", info.Image)
	}
}

func TestRunExitStatusOutputAndScript(t *testing.T) {
	dir := t.TempDir()
	c, _ := serveAgent(t, "/")
	ctx := context.Background()
	var out bytes.Buffer
	err := c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", filepath.Join(dir, "s.sh")}, Dir: dir, Env: []string{"X=from-env"},
		Script: "echo out $X; echo err >&2; pwd; exit 7", ScriptPath: filepath.Join(dir, "s.sh"), Output: &out})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 7 {
		t.Fatalf("Run: %v, want exit status 7", err)
	}
	for _, want := range []string{"out from-env", "err", dir} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "s.sh")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the script file stays after the run: %v", err)
	}
	out.Reset()
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/cat"}, Stdin: []byte("from stdin"), Output: &out}); err != nil || out.String() != "from stdin" {
		t.Errorf("stdin: %v %q", err, out.String())
	}
	if err := c.Run(ctx, RunOptions{Argv: []string{"/nonexistent/cmd"}}); err == nil || errors.As(err, &ee) {
		t.Errorf("a command that cannot start: %v, want a failure that is no exit status", err)
	}
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", "kill -9 $$"}}); !errors.As(err, &ee) || ee.Code != 128+9 {
		t.Errorf("a killed command: %v, want exit status 137", err)
	}
}

// syncBuf is a buffer written by the client and read by the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil && !zombie(pid) }

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] == 'Z'
}

func TestCancelStopsTheRunAfterTheGrace(t *testing.T) {
	c, _ := serveAgent(t, "/")
	why := errors.New("the job was canceled")
	ctx, cancel := context.WithCancelCause(context.Background())
	var out syncBuf
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", `trap "" TERM; echo "pid:$$"; while :; do sleep 0.1; done`},
			Grace: 300 * time.Millisecond, Output: &out})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "pid:") {
		if time.Now().After(deadline) {
			t.Fatal("the script did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var pid int
	fmt.Sscanf(strings.TrimSpace(out.String()), "pid:%d", &pid)
	cancel(why)
	select {
	case err := <-done:
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) || !errors.Is(err, why) {
			t.Fatalf("Run: %v, want ErrCanceled, context.Canceled and the cause", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if alive(pid) {
		t.Errorf("the script ignoring SIGTERM (pid %d) still runs after the grace", pid)
	}
}

func TestDetachedAndJobRuns(t *testing.T) {
	c, _ := serveAgent(t, "/")
	ctx := context.Background()
	var out syncBuf
	// A job script leaves a process in its group: killed at its end.
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", `sleep 1000 & echo "pid:$!"`}, Output: &out}); err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscanf(strings.TrimSpace(out.String()), "pid:%d", &pid)
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the job's leftover %d still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Only one job script at a time; detached runs beside it.
	started := make(chan struct{})
	var first syncBuf
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", "echo started; sleep 2"}, Output: io.MultiWriter(&first, signalWriter(started))})
	}()
	<-started
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/true"}}); err == nil || !strings.Contains(err.Error(), "another job script") {
		t.Errorf("a second job script while one runs: %v", err)
	}
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/true"}, Detached: true}); err != nil {
		t.Errorf("a detached run beside a job script: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestKeepProcesses: a job script with KeepProcesses that exits by
// itself leaves its processes running — one still writing to the
// script's output, which neither holds the run up nor fails its writes —
// for the next job script.
func TestKeepProcesses(t *testing.T) {
	c, _ := serveAgent(t, "/")
	ctx := context.Background()
	var out syncBuf
	began := time.Now()
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", `(while echo tick; do sleep 0.05; done) & echo "pid:$!"`}, Output: &out, KeepProcesses: true}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 4*time.Second {
		t.Errorf("the run waited %v for the output of the process it left", d)
	}
	var pid int
	for _, l := range strings.Split(out.String(), "\n") {
		fmt.Sscanf(l, "pid:%d", &pid)
	}
	if pid == 0 {
		t.Fatalf("no pid in %q", out.String())
	}
	time.Sleep(300 * time.Millisecond) // it writes on after the run
	if !alive(pid) {
		t.Fatal("the process a KeepProcesses run left is gone")
	}
	if err := c.Run(ctx, RunOptions{Argv: []string{"/bin/sh", "-c", fmt.Sprintf("kill -0 %d", pid)}}); err != nil {
		t.Fatalf("the next script does not see it: %v", err)
	}
	// (On a host, NoChroot, the agent ends only a script's own process
	// group; in a VM the next script's end takes every process.)
	syscall.Kill(pid, syscall.SIGKILL)
}

type signalWriter chan struct{}

func (s signalWriter) Write(p []byte) (int, error) {
	select {
	case <-s:
	default:
		close(s)
	}
	return len(p), nil
}

func TestExposeTunnelsConnectionsBothWays(t *testing.T) {
	c, _ := serveAgent(t, "/")
	// The target on the "host" side: an echo server that upper-cases
	// and closes after the client's half-close.
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			conn, err := target.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b, _ := io.ReadAll(conn)
				conn.Write(bytes.ToUpper(b))
			}()
		}
	}()
	// The "guest" address: a free port of this host.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	guestAddr := free.Addr().String()
	free.Close()
	ctx := context.Background()
	stop, err := c.Expose(ctx, guestAddr, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target.Addr().String())
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", guestAddr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			msg := strings.Repeat(fmt.Sprintf("conn %d ", i), 20000) // more than a chunk
			if _, err := conn.Write([]byte(msg)); err != nil {
				t.Error(err)
				return
			}
			conn.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(conn)
			if err != nil || string(got) != strings.ToUpper(msg) {
				t.Errorf("conn %d: %v, %d bytes back, want %d upper-cased", i, err, len(got), len(msg))
			}
		}()
	}
	wg.Wait()
	stop()
	// The guest closes its listener when it sees the stream end.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", guestAddr, time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("the guest still listens after stop")
		}
	}
	// A second listener on a port in use is refused with the reason.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := c.Expose(ctx, l.Addr().String(), nil); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Expose on a port in use: %v", err)
	}
}

func TestExposeTargetDownClosesTheGuestConnection(t *testing.T) {
	c, _ := serveAgent(t, "/")
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	guestAddr := free.Addr().String()
	free.Close()
	stop, err := c.Expose(context.Background(), guestAddr, func(ctx context.Context) (net.Conn, error) {
		return nil, errors.New("coordinator down")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	conn, err := net.Dial("tcp", guestAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read from a connection whose target is down: %d, %v; want it closed", n, err)
	}
}

func TestAddHost(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(p, []byte("127.0.0.1 localhost\n10.1.1.1 gitlab.example.com\n"), 0o644)
	for range 2 {
		if err := addHost(p, "gitlab.example.com"); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(p)
	want := "127.0.0.1 gitlab.example.com # berth: the coordinator, through the agent\n127.0.0.1 localhost\n10.1.1.1 gitlab.example.com\n"
	if string(b) != want {
		t.Errorf("hosts:\n%s\nwant:\n%s", b, want)
	}
}

// TestRestoredOnAHost: Restored wants a real seed; an agent that is not a
// VM's (here: run on the host for tests) changes nothing of its host —
// host name, /etc/hostname of its root, clock.
func TestRestoredOnAHost(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	c, _ := serveAgent(t, root)
	before, _ := os.Hostname()
	if _, err := c.c.Restored(context.Background(), &pb.RestoredRequest{Hostname: "nesting-other", Seed: make([]byte, 8)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an 8-byte seed: %v, want InvalidArgument", err)
	}
	if err := c.Restored(context.Background(), "nesting-other"); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Hostname(); after != before {
		t.Errorf("the host's name changed from %q to %q", before, after)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/hostname")); err == nil {
		t.Error("an agent that is not a VM's wrote /etc/hostname")
	}
}

// TestRunStreamsStdin: with StdinStream the command reads what the host
// sends as it comes, one shell keeping its state between lines, and the
// stream's end closes the command's stdin.
func TestRunStreamsStdin(t *testing.T) {
	c, _ := serveAgent(t, "/")
	pr, pw := io.Pipe()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- c.Run(context.Background(), RunOptions{Argv: []string{"/bin/sh"}, Env: []string{"PATH=/bin:/usr/bin"}, StdinStream: pr, Output: &out})
	}()
	io.WriteString(pw, "cd /tmp && X=kept\n")
	io.WriteString(pw, "echo \"$PWD $X\"\n")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "/tmp kept") {
		if time.Now().After(deadline) {
			t.Fatalf("the second line did not see the first one's state: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	io.WriteString(pw, "exit 7\n")
	pw.Close()
	var ee *ExitError
	if err := <-done; !errors.As(err, &ee) || ee.Code != 7 {
		t.Errorf("Run = %v, want exit status 7", err)
	}
}
