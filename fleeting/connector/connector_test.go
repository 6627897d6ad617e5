package connector_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
)

func TestMain(m *testing.M) {
	local.RunServerIfAsked()
	os.Exit(m.Run())
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newKey(t *testing.T) (pemBytes []byte, signer ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	pemBytes = pem.EncodeToMemory(block)
	signer, err = ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	return pemBytes, signer
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startSSHD runs Debian's OpenSSH server on a loopback port with a host key
// and an authorized key of the test's own, and returns how to connect.
func startSSHD(t *testing.T) (fleeting.ConnectInfo, ssh.PublicKey) {
	t.Helper()
	sshd := testenv.LookPath(t, "sshd")
	if !filepath.IsAbs(sshd) {
		sshd, _ = filepath.Abs(sshd)
	}
	dir := t.TempDir()
	hostPEM, hostSigner := newKey(t)
	clientPEM, clientSigner := newKey(t)
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if err := os.WriteFile(hostKey, hostPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(auth, ssh.MarshalAuthorizedKey(clientSigner.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// sshd insists on its privilege separation directory.
		os.MkdirAll("/run/sshd", 0o755)
	}
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join([]string{
		"ListenAddress 127.0.0.1",
		"HostKey " + hostKey,
		"AuthorizedKeysFile " + auth,
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"StrictModes no",
		"UsePAM no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PubkeyAuthentication yes",
		"PermitRootLogin prohibit-password",
		"AllowTcpForwarding yes",
		"AllowStreamLocalForwarding yes",
		"LogLevel VERBOSE",
		"",
	}, "\n")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	logs := &testenv.SyncBuffer{}
	cmd := exec.Command(sshd, "-D", "-e", "-f", cfg, "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd log:\n%s", logs.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd does not listen on %s: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return fleeting.ConnectInfo{
		ConnectorConfig: fleeting.ConnectorConfig{Protocol: fleeting.ProtocolSSH, Username: u.Username, Key: clientPEM, Timeout: 20 * time.Second},
		ID:              "sshd",
		InternalAddr:    addr,
	}, hostSigner.PublicKey()
}

// startLocal creates one instance of the local plugin (in-process group,
// server processes of this test binary) and returns its connect info.
func startLocal(t *testing.T, settings fleeting.Settings) fleeting.ConnectInfo {
	t.Helper()
	ctx := testCtx(t)
	g := local.New(local.Config{StateDir: t.TempDir(), MaxInstances: 2})
	if _, err := g.Init(ctx, fleetingtest.TestLogger(t), settings); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Increase(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var id string
	for deadline := time.Now().Add(time.Minute); ; {
		var st fleeting.State
		g.Update(ctx, func(i string, s fleeting.State) { id, st = i, s })
		if st == fleeting.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local instance not running: %s %s", id, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		c := context.Background()
		g.Decrease(c, []string{id})
		for range 200 {
			n := 0
			g.Update(c, func(string, fleeting.State) { n++ })
			if n == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		g.Shutdown(c)
	})
	info, err := g.ConnectInfo(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func dial(t *testing.T, info fleeting.ConnectInfo, opts connector.Options) *connector.Client {
	t.Helper()
	c, err := connector.Dial(testCtx(t), info, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exercise runs the connector's features against one server.
func exercise(t *testing.T, info fleeting.ConnectInfo) {
	c := dial(t, info, connector.Options{})
	t.Run("exec with streams and exit status", func(t *testing.T) {
		var out, errb bytes.Buffer
		err := c.Run(testCtx(t), connector.Command{Cmd: "echo out; echo err >&2; exit 3", Stdout: &out, Stderr: &errb})
		var ee *connector.ExitError
		if !errors.As(err, &ee) || ee.Code != 3 {
			t.Fatalf("Run = %v, want exit status 3", err)
		}
		if out.String() != "out\n" || errb.String() != "err\n" {
			t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
		}
		if err := c.Run(testCtx(t), connector.Command{Cmd: "true"}); err != nil {
			t.Fatalf("Run(true) = %v", err)
		}
	})
	t.Run("stdin and env", func(t *testing.T) {
		var out bytes.Buffer
		err := c.Run(testCtx(t), connector.Command{
			Cmd:    `printf '%s:' "$GREETING"; cat`,
			Env:    map[string]string{"GREETING": "it's me"},
			Stdin:  strings.NewReader("hello from stdin"),
			Stdout: &out,
		})
		if err != nil || out.String() != "it's me:hello from stdin" {
			t.Fatalf("Run = %v, output %q", err, out.String())
		}
	})
	t.Run("killed by signal", func(t *testing.T) {
		err := c.Run(testCtx(t), connector.Command{Cmd: "kill -9 $$"})
		var ee *connector.ExitError
		if !errors.As(err, &ee) || ee.Signal != "KILL" {
			t.Fatalf("Run = %v, want killed by KILL", err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testCtx(t))
		marker := filepath.Join(t.TempDir(), "started")
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx, connector.Command{Cmd: "touch " + marker + "; exec sleep 60"}) }()
		for deadline := time.Now().Add(30 * time.Second); ; {
			if _, err := os.Stat(marker); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("command did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel = %v, want context.Canceled", err)
		}
	})
	t.Run("tcp forwarding", func(t *testing.T) {
		addr := echoServer(t, "tcp", "127.0.0.1:0")
		conn, err := c.Dial(testCtx(t), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, conn)
	})
	t.Run("unix socket forwarding", func(t *testing.T) {
		path := echoServer(t, "unix", filepath.Join(t.TempDir(), "docker.sock"))
		conn, err := c.Dial(testCtx(t), "unix", path)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, conn)
	})
	t.Run("forward a local listener", func(t *testing.T) {
		remote := echoServer(t, "unix", filepath.Join(t.TempDir(), "nesting.sock"))
		l, err := net.Listen("unix", filepath.Join(t.TempDir(), "local.sock"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(testCtx(t))
		done := make(chan error, 1)
		go func() { done <- c.Forward(ctx, l, "unix", remote) }()
		for range 2 {
			conn, err := net.Dial("unix", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, conn)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Forward = %v", err)
		}
	})
	t.Run("hop through the connection", func(t *testing.T) {
		hop := dial(t, info, connector.Options{Via: c})
		var out bytes.Buffer
		if err := hop.Run(testCtx(t), connector.Command{Cmd: "echo hop", Stdout: &out}); err != nil || out.String() != "hop\n" {
			t.Fatalf("Run over hop = %v, %q", err, out.String())
		}
	})
}

// echoServer listens on network/addr and echoes every connection.
func echoServer(t *testing.T, network, addr string) string {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func roundTrip(t *testing.T, conn net.Conn) {
	t.Helper()
	defer conn.Close()
	msg := []byte("ping through ssh")
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, buf); err != nil || !bytes.Equal(buf, msg) {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

func TestOpenSSH(t *testing.T) {
	info, _ := startSSHD(t)
	exercise(t, info)
}

func TestLocalPluginServer(t *testing.T) {
	info := startLocal(t, fleeting.Settings{})
	if info.InternalAddr == "" || len(info.Key) == 0 {
		t.Fatalf("ConnectInfo %+v", info)
	}
	exercise(t, info)
}

func TestPasswordAuth(t *testing.T) {
	info := startLocal(t, fleeting.Settings{ConnectorConfig: fleeting.ConnectorConfig{Password: "s3cret"}})
	info.Key = nil
	c := dial(t, info, connector.Options{})
	if err := c.Run(testCtx(t), connector.Command{Cmd: "true"}); err != nil {
		t.Fatal(err)
	}
	info.Password = "wrong"
	if _, err := connector.Dial(testCtx(t), info, connector.Options{}); err == nil {
		t.Fatal("Dial with a wrong password succeeded")
	}
}

func TestHostKeyPolicies(t *testing.T) {
	info, hostKey := startSSHD(t)
	_, other := newKey(t)
	ctx := testCtx(t)

	if _, err := connector.Dial(ctx, info, connector.Options{HostKey: connector.FixedHostKeys(other.PublicKey())}); !errors.Is(err, connector.ErrHostKeyMismatch) {
		t.Errorf("Dial with a wrong fixed key = %v, want ErrHostKeyMismatch", err)
	}
	dial(t, info, connector.Options{HostKey: connector.FixedHostKeys(hostKey)})

	kh := filepath.Join(t.TempDir(), "known_hosts")
	host, port, _ := net.SplitHostPort(info.InternalAddr)
	line := fmt.Sprintf("[%s]:%s %s", host, port, ssh.MarshalAuthorizedKey(hostKey))
	os.WriteFile(kh, []byte(line), 0o600)
	policy, err := connector.KnownHosts(kh)
	if err != nil {
		t.Fatal(err)
	}
	dial(t, info, connector.Options{HostKey: policy})
	os.WriteFile(kh, []byte(fmt.Sprintf("[%s]:%s %s", host, port, ssh.MarshalAuthorizedKey(other.PublicKey()))), 0o600)
	policy, _ = connector.KnownHosts(kh)
	if _, err := connector.Dial(ctx, info, connector.Options{HostKey: policy}); !errors.Is(err, connector.ErrHostKeyMismatch) {
		t.Errorf("Dial with a known_hosts of another key = %v, want ErrHostKeyMismatch", err)
	}

	tofu := connector.NewTrustOnFirstUse()
	dial(t, info, connector.Options{HostKey: tofu})
	dial(t, info, connector.Options{HostKey: tofu})
	// The same instance and address answering with another key is refused.
	other2 := info
	other2.ID = "other"
	if err := tofu.Check(info.ID, info.InternalAddr, other.PublicKey()); !errors.Is(err, connector.ErrHostKeyMismatch) {
		t.Errorf("TOFU accepted a changed key: %v", err)
	}
	if err := tofu.Check("other", info.InternalAddr, other.PublicKey()); err != nil {
		t.Errorf("TOFU refused a new instance on a reused address: %v", err)
	}
	tofu.Forget(info.ID)
	if err := tofu.Check(info.ID, info.InternalAddr, other.PublicKey()); err != nil {
		t.Errorf("TOFU after Forget: %v", err)
	}
}

// freezer is a TCP proxy that can stop forwarding while keeping both
// connections open: a peer that vanished without closing anything.
type freezer struct {
	l      net.Listener
	mu     sync.Mutex
	frozen bool
}

func newFreezer(t *testing.T, target string) *freezer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{l: l}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			a, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			t.Cleanup(func() { a.Close(); b.Close() })
			go f.copy(a, b)
			go f.copy(b, a)
		}
	}()
	return f
}

func (f *freezer) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		f.mu.Lock()
		frozen := f.frozen
		f.mu.Unlock()
		if frozen {
			continue // swallow
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

func TestKeepaliveDetectsDeadPeer(t *testing.T) {
	info := startLocal(t, fleeting.Settings{})
	proxy := newFreezer(t, info.InternalAddr)
	info.InternalAddr = proxy.l.Addr().String()
	info.ExternalAddr = ""
	info.Keepalive = 50 * time.Millisecond
	c := dial(t, info, connector.Options{})
	if err := c.Run(testCtx(t), connector.Command{Cmd: "true"}); err != nil {
		t.Fatal(err)
	}
	proxy.freeze()
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("connection to a dead peer stays up")
	}
	if !errors.Is(c.Err(), connector.ErrKeepaliveTimeout) {
		t.Fatalf("Err = %v, want ErrKeepaliveTimeout", c.Err())
	}
	if err := c.Run(testCtx(t), connector.Command{Cmd: "true"}); err == nil {
		t.Fatal("Run on a dead connection succeeded")
	}
}

func TestDialTimeout(t *testing.T) {
	// A server that accepts and never says a word.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	info := fleeting.ConnectInfo{ID: "mute", InternalAddr: l.Addr().String(),
		ConnectorConfig: fleeting.ConnectorConfig{Username: "x", Password: "y", Timeout: 200 * time.Millisecond}}
	if _, err := connector.Dial(testCtx(t), info, connector.Options{}); err == nil {
		t.Fatal("Dial to a mute server succeeded")
	}
	info.Timeout = time.Hour
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := connector.Dial(ctx, info, connector.Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial cancelled = %v, want context.Canceled", err)
	}
}

func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		info     fleeting.ConnectInfo
		external bool
		want     string
	}{
		{fleeting.ConnectInfo{InternalAddr: "10.0.0.1", ExternalAddr: "203.0.113.1"}, false, "10.0.0.1:22"},
		{fleeting.ConnectInfo{InternalAddr: "10.0.0.1", ExternalAddr: "203.0.113.1"}, true, "203.0.113.1:22"},
		{fleeting.ConnectInfo{InternalAddr: "10.0.0.1:2222"}, true, "10.0.0.1:2222"},
		{fleeting.ConnectInfo{ExternalAddr: "203.0.113.1"}, false, "203.0.113.1:22"},
		{fleeting.ConnectInfo{InternalAddr: "10.0.0.1", ConnectorConfig: fleeting.ConnectorConfig{ProtocolPort: 2022}}, false, "10.0.0.1:2022"},
		{fleeting.ConnectInfo{InternalAddr: "fd00::1"}, false, "[fd00::1]:22"},
		{fleeting.ConnectInfo{InternalAddr: "[fd00::1]:2200"}, false, "[fd00::1]:2200"},
	} {
		got, err := connector.Address(tc.info, tc.external)
		if err != nil || got != tc.want {
			t.Errorf("Address(%+v, %v) = %q, %v; want %q", tc.info, tc.external, got, err, tc.want)
		}
	}
	if _, err := connector.Address(fleeting.ConnectInfo{ID: "i"}, false); !errors.Is(err, connector.ErrNoAddress) {
		t.Errorf("Address without addresses = %v", err)
	}
}

func TestRefusals(t *testing.T) {
	ctx := testCtx(t)
	for _, p := range []fleeting.Protocol{fleeting.ProtocolWinRM, fleeting.ProtocolWinRMHTTPS} {
		info := fleeting.ConnectInfo{ID: "w", InternalAddr: "192.0.2.1", ConnectorConfig: fleeting.ConnectorConfig{Protocol: p, Password: "x"}}
		if _, err := connector.Dial(ctx, info, connector.Options{}); !errors.Is(err, connector.ErrUnsupportedProtocol) {
			t.Errorf("Dial %s = %v, want ErrUnsupportedProtocol", p, err)
		}
	}
	info := fleeting.ConnectInfo{ID: "n", InternalAddr: "192.0.2.1"}
	if _, err := connector.Dial(ctx, info, connector.Options{Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, connector.ErrNoCredentials) {
		t.Errorf("Dial without credentials = %v, want ErrNoCredentials", err)
	}
}
