package ssh

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	xssh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
)

// The tests of this package run against a real OpenSSH sshd on a free
// loopback port, started once by TestMain as root with its own host keys
// (ed25519 and ecdsa), the test's client key authorized for root, HOME of
// the sessions set to a directory of the test, and the berth binary built
// from this module as the helper. The host is this machine, so the
// conformance suite's default process and file hooks see the remote side.
var sshd struct {
	skip string // why the sshd tests cannot run ("" when they can)

	dir        string
	berth      string // berth binary built for the tests
	port       string
	home       string // HOME of the remote sessions
	key        string // client identity file, authorized for root
	otherKey   string // a client key sshd does not accept
	knownHosts string // lists the ed25519 host key only
	hostKeys   map[string]xssh.PublicKey
	log        string // sshd's stderr
	cmd        *exec.Cmd
}

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "berth-ssh-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		sshd.dir = dir
		if err := startSSHD(dir); err != nil {
			if sshd.skip == "" {
				fmt.Fprintln(os.Stderr, "setting up sshd:", err)
				return 1
			}
		}
		defer stopSSHD()
		return m.Run()
	}())
}

// needSSHD skips (or fails under BERTH_REQUIRE_DEPS=1) a test that needs
// the sshd TestMain could not start.
func needSSHD(t testing.TB) {
	t.Helper()
	if sshd.skip != "" {
		testenv.Missing(t, "%s", sshd.skip)
	}
}

func startSSHD(dir string) error {
	const bin = "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		sshd.skip = "OpenSSH sshd not installed (" + bin + ")"
		return nil
	}
	if os.Geteuid() != 0 {
		sshd.skip = "sshd tests need root (sshd logs in as root to this host)"
		return nil
	}
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		sshd.skip = "no /proc"
		return nil
	}
	// The helper: the berth binary of this module.
	sshd.berth = filepath.Join(dir, "berth")
	build := exec.Command("go", "build", "-o", sshd.berth, "github.com/berthci/berth/cmd/berth")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building berth: %v\n%s", err, out)
	}
	// sshd refuses to start without its privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		return err
	}
	sshd.home = filepath.Join(dir, "home")
	if err := os.MkdirAll(sshd.home, 0o700); err != nil {
		return err
	}
	sshd.hostKeys = map[string]xssh.PublicKey{}
	_, edHost, _ := ed25519.GenerateKey(rand.Reader)
	ecHost, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	for name, k := range map[string]any{"host_ed25519": edHost, "host_ecdsa": ecHost} {
		pub, err := writeKey(filepath.Join(dir, name), k)
		if err != nil {
			return err
		}
		sshd.hostKeys[pub.Type()] = pub
	}
	_, client, _ := ed25519.GenerateKey(rand.Reader)
	sshd.key = filepath.Join(dir, "id_ed25519")
	clientPub, err := writeKey(sshd.key, client)
	if err != nil {
		return err
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	sshd.otherKey = filepath.Join(dir, "id_other")
	if _, err := writeKey(sshd.otherKey, other); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), xssh.MarshalAuthorizedKey(clientPub), 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	sshd.port = port
	sshd.knownHosts = filepath.Join(dir, "known_hosts")
	if err := writeKnownHosts(sshd.knownHosts, "127.0.0.1:"+port, sshd.hostKeys[xssh.KeyAlgoED25519]); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(cfg, []byte(strings.Join([]string{
		"ListenAddress 127.0.0.1",
		"HostKey " + filepath.Join(dir, "host_ed25519"),
		"HostKey " + filepath.Join(dir, "host_ecdsa"),
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
		"PidFile none",
		"UsePAM no",
		"StrictModes no",
		"PermitRootLogin yes",
		"PubkeyAuthentication yes",
		"PasswordAuthentication yes",
		"KbdInteractiveAuthentication no",
		"SetEnv HOME=" + sshd.home,
		"MaxSessions 100",
		"MaxStartups 200",
		"LogLevel INFO",
		"",
	}, "\n")), 0o600); err != nil {
		return err
	}
	sshd.log = filepath.Join(dir, "sshd.log")
	logf, err := os.Create(sshd.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	sshd.cmd = exec.Command(bin, "-D", "-e", "-f", cfg, "-p", port)
	sshd.cmd.Stdout, sshd.cmd.Stderr = logf, logf
	if err := sshd.cmd.Start(); err != nil {
		return fmt.Errorf("starting sshd: %w", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if banner(net.JoinHostPort("127.0.0.1", port)) {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(sshd.log)
			return fmt.Errorf("sshd did not come up on port %s:\n%s", port, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stopSSHD() {
	if sshd.cmd != nil && sshd.cmd.Process != nil {
		sshd.cmd.Process.Signal(syscall.SIGTERM)
		sshd.cmd.Wait()
	}
}

// banner reports whether an SSH server answers at addr.
func banner(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "SSH-2.0-")
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// writeKey writes a private key in OpenSSH format and returns its public
// key.
func writeKey(path string, key any) (xssh.PublicKey, error) {
	block, err := xssh.MarshalPrivateKey(key, "")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	signer, err := xssh.NewSignerFromKey(key)
	if err != nil {
		return nil, err
	}
	return signer.PublicKey(), nil
}

func writeKnownHosts(path, addr string, keys ...xssh.PublicKey) error {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, k) + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// testOptions are Options for the test sshd with builds and caches under
// dir.
func testOptions(dir string) Options {
	return Options{
		Config: config.SSH{
			Host: "127.0.0.1", Port: sshd.port, User: "root",
			IdentityFile: sshd.key, KnownHostsFile: sshd.knownHosts,
		},
		Helper:           sshd.berth,
		KillGrace:        200 * time.Millisecond,
		DefaultBuildsDir: filepath.Join(dir, "builds"),
		DefaultCacheDir:  filepath.Join(dir, "cache"),
	}
}

func newProvider(t testing.TB, o Options) *Provider {
	t.Helper()
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	return p
}

// logCounter is a slog handler that counts messages.
type logCounter struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.msgs == nil {
		l.msgs = map[string]int{}
	}
	l.msgs[r.Message]++
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
func (l *logCounter) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msgs[msg]
}

// alive reports whether pid runs on this host and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// proxy is a TCP forwarder to sshd that a test can make vanish: freeze
// black-holes the connections it carries (a host that is gone without a
// word), close drops them and stops listening (a host that is down).
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []*proxyConn
	closed bool
}

type proxyConn struct {
	a, b   net.Conn
	frozen chan struct{}
	once   sync.Once
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(p.close)
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			pc := &proxyConn{a: a, b: b, frozen: make(chan struct{})}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				a.Close()
				b.Close()
				return
			}
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			go pc.pipe(a, b)
			go pc.pipe(b, a)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (pc *proxyConn) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-pc.frozen:
			// Black hole: swallow everything, answer nothing.
			if err != nil {
				return
			}
			continue
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// freeze black-holes the current connections; new ones still work.
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.once.Do(func() { close(pc.frozen) })
	}
}

// close drops every connection and stops accepting new ones.
func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.ln.Close()
	for _, pc := range p.conns {
		pc.a.Close()
		pc.b.Close()
	}
}
