package ssh

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	xssh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
)

// systemID is unique per test process: Sweep kills by it on this host,
// and another run of these tests may share the host.
var systemID = "s_sshtest" + randomHex(4)

func opts(id int) executor.PrepareOptions {
	return executor.PrepareOptions{JobID: int64(id), ProjectPath: "group/project", ShortToken: "tok12345", ConcurrencyID: id, SystemID: systemID}
}

// prepare creates and prepares an executor; Cleanup is registered.
func prepare(t *testing.T, p *Provider, o executor.PrepareOptions) (executor.Executor, executor.Environment) {
	t.Helper()
	e, err := p.Create(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Cleanup(context.Background()) })
	env, err := e.Prepare(context.Background(), o)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return e, env
}

func run(ctx context.Context, e executor.Executor, script string) (string, error) {
	var out testenv.SyncBuffer
	err := e.Run(ctx, executor.Command{Stage: "step_script", Script: script, Output: &out})
	return out.String(), err
}

func TestNewRefusesBadConfig(t *testing.T) {
	key := filepath.Join(t.TempDir(), "id")
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := writeKey(key, k); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]config.SSH{
		"no host":          {User: "u", IdentityFile: key},
		"host with port":   {Host: "example.com:22", User: "u", IdentityFile: key},
		"bad port":         {Host: "h", Port: "ssh", User: "u", IdentityFile: key},
		"port out of band": {Host: "h", Port: "70000", User: "u", IdentityFile: key},
		"no user":          {Host: "h", IdentityFile: key},
		"no credentials":   {Host: "h", User: "u"},
		"missing key":      {Host: "h", User: "u", IdentityFile: key + ".missing"},
		"not a key":        {Host: "h", User: "u", IdentityFile: "/etc/hostname"},
	} {
		if _, err := New(Options{Config: c}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	p, err := New(Options{Config: config.SSH{Host: "::1", User: "u", Password: "pw"}})
	if err != nil || p.addr != "[::1]:22" {
		t.Fatalf("IPv6 host: %v %q", err, p.addr)
	}
}

// TestHostKeyChecking: strict checking is Berth's default; the host's key
// must be in known_hosts, and the error of a refused key says which key
// and which file.
func TestHostKeyChecking(t *testing.T) {
	needSSHD(t)
	addr := "127.0.0.1:" + sshd.port
	ed, ec := sshd.hostKeys[xssh.KeyAlgoED25519], sshd.hostKeys[xssh.KeyAlgoECDSA256]
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	strangerPub, _ := xssh.NewPublicKey(stranger.Public())
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPub, _ := xssh.NewPublicKey(&rsaKey.PublicKey)
	yes := true
	for _, tc := range []struct {
		name     string
		contents string // known_hosts; "-" for no file
		insecure bool
		want     error // nil: Prepare succeeds
		mention  []string
	}{
		// x/crypto prefers ecdsa; a host known by its ed25519 key only
		// is still accepted, because only known key types are offered.
		{name: "ed25519 known", contents: knownhosts.Line([]string{knownhosts.Normalize(addr)}, ed)},
		{name: "ecdsa known", contents: knownhosts.Line([]string{knownhosts.Normalize(addr)}, ec)},
		{name: "hashed entry", contents: knownhosts.Line([]string{knownhosts.HashHostname(knownhosts.Normalize(addr))}, ed)},
		{name: "unknown host", contents: knownhosts.Line([]string{"[example.com]:2222"}, ed),
			want: ErrUnknownHostKey, mention: []string{"known_hosts", "SHA256:", "ssh-keyscan -p " + sshd.port + " 127.0.0.1"}},
		{name: "no known_hosts file", contents: "-", want: ErrUnknownHostKey, mention: []string{"known_hosts does not exist"}},
		{name: "changed key", contents: knownhosts.Line([]string{knownhosts.Normalize(addr)}, strangerPub),
			want: ErrHostKeyChanged, mention: []string{"known_hosts:1", xssh.FingerprintSHA256(strangerPub), xssh.FingerprintSHA256(ed)}},
		{name: "known by a key type the host does not offer", contents: knownhosts.Line([]string{knownhosts.Normalize(addr)}, rsaPub),
			want: ErrHostKeyChanged, mention: []string{"rsa-sha2-512"}},
		{name: "revoked key", contents: "@revoked * " + string(bytes.TrimSpace(xssh.MarshalAuthorizedKey(ed))) + "\n" + knownhosts.Line([]string{knownhosts.Normalize(addr)}, ed),
			want: ErrHostKeyRevoked, mention: []string{"known_hosts:1"}},
		{name: "strict checking disabled", contents: "-", insecure: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(dir)
			o.Config.KnownHostsFile = filepath.Join(dir, "known_hosts")
			if tc.contents != "-" {
				if err := os.WriteFile(o.Config.KnownHostsFile, []byte(tc.contents+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.insecure {
				o.Config.DisableStrictHostKeyChecking = &yes
			}
			p := newProvider(t, o)
			e, _ := p.Create(context.Background())
			defer e.Cleanup(context.Background())
			_, err := e.Prepare(context.Background(), opts(0))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				return
			}
			t.Logf("Prepare: %v", err)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Prepare: %v, want an error wrapping %v", err, tc.want)
			}
			var hk *HostKeyError
			if tc.name != "known by a key type the host does not offer" && !errors.As(err, &hk) {
				t.Fatalf("Prepare: %v, want a *HostKeyError", err)
			}
			for _, m := range append(tc.mention, o.Config.KnownHostsFile) {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error does not mention %q: %v", m, err)
				}
			}
		})
	}
}

func TestAuthAndReachability(t *testing.T) {
	needSSHD(t)
	free, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		mod     func(*Options)
		want    error
		mention []string
	}{
		{"key not authorized", func(o *Options) { o.Config.IdentityFile = sshd.otherKey }, ErrAuth, []string{"as root", sshd.otherKey}},
		{"wrong password", func(o *Options) { o.Config.IdentityFile, o.Config.Password = "", "not-the-password" }, ErrAuth, []string{"password"}},
		{"nothing listening", func(o *Options) { o.Config.Port = free }, ErrUnreachable, []string{"127.0.0.1:" + free, "refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(t.TempDir())
			tc.mod(&o)
			p := newProvider(t, o)
			e, _ := p.Create(context.Background())
			defer e.Cleanup(context.Background())
			start := time.Now()
			_, err := e.Prepare(context.Background(), opts(0))
			t.Logf("Prepare: %v", err)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Prepare: %v, want %v", err, tc.want)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error does not mention %q: %v", m, err)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("failing took %s", d)
			}
		})
	}
}

// TestSilentHost: a host that accepts TCP but never speaks SSH fails
// preparation after the connect timeout, or as soon as the job's context
// ends, with the context's error.
func TestSilentHost(t *testing.T) {
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
			defer c.Close()
		}
	}()
	yes := true
	o := Options{
		Config: config.SSH{Host: "127.0.0.1", Port: strconv.Itoa(l.Addr().(*net.TCPAddr).Port), User: "u", Password: "pw",
			DisableStrictHostKeyChecking: &yes},
		Helper:         "/bin/true",
		ConnectTimeout: 300 * time.Millisecond,
	}
	p := newProvider(t, o)
	e, _ := p.Create(context.Background())
	defer e.Cleanup(context.Background())
	if _, err := e.Prepare(context.Background(), opts(0)); !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("Prepare against a silent host: %v, want ErrUnreachable", err)
	}

	o.ConnectTimeout = time.Minute
	p = newProvider(t, o)
	e, _ = p.Create(context.Background())
	defer e.Cleanup(context.Background())
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(200*time.Millisecond, func() { cancel(errors.New("job canceled")) })
	start := time.Now()
	if _, err := e.Prepare(ctx, opts(0)); !errors.Is(err, context.Canceled) {
		t.Errorf("Prepare canceled while connecting: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("canceling took %s", d)
	}
}

// freshHelper copies the test's berth binary with some random bytes
// appended: a helper with a SHA-256 no host has seen yet.
func freshHelper(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(sshd.berth)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, []byte(randomHex(16))...)
	p := filepath.Join(t.TempDir(), "berth")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestHelperUploadedOnce: the first job on a host uploads the helper,
// later jobs (also of a new provider, as after a runner restart) find it
// by its SHA-256; a damaged copy is replaced.
func TestHelperUploadedOnce(t *testing.T) {
	needSSHD(t)
	helper := freshHelper(t)
	var logs logCounter
	o := testOptions(t.TempDir())
	o.Helper, o.Logger = helper, slog.New(&logs)
	p := newProvider(t, o)

	e1, env1 := prepare(t, p, opts(0))
	want := filepath.Join(sshd.home, ".cache/berth/helper")
	if !strings.HasPrefix(env1.Helper, want) || filepath.Base(env1.Helper) != "berth" {
		t.Fatalf("Environment.Helper %q, want under %s", env1.Helper, want)
	}
	if n := logs.count("uploaded the helper"); n != 1 {
		t.Fatalf("%d uploads for the first job, want 1", n)
	}
	if out, err := run(context.Background(), e1, shq(env1.Helper)+" --version"); err != nil || !strings.Contains(out, "berth version") {
		t.Fatalf("the uploaded helper does not run in a stage: %v %q", err, out)
	}
	ino := inode(t, env1.Helper)
	e1.Cleanup(context.Background())

	_, env2 := prepare(t, p, opts(1))
	var logs2 logCounter
	o2 := o
	o2.Logger = slog.New(&logs2)
	_, env3 := prepare(t, newProvider(t, o2), opts(2))
	if n := logs.count("uploaded the helper") + logs2.count("uploaded the helper"); n != 1 {
		t.Errorf("%d uploads after three jobs, want 1", n)
	}
	if env2.Helper != env1.Helper || env3.Helper != env1.Helper || inode(t, env1.Helper) != ino {
		t.Error("a later job replaced the helper")
	}

	// A damaged copy (wrong size) is uploaded again.
	if err := os.Truncate(env1.Helper, 1000); err != nil {
		t.Fatal(err)
	}
	prepare(t, p, opts(3))
	if n := logs.count("uploaded the helper"); n != 2 {
		t.Errorf("%d uploads after damaging the helper, want 2", n)
	}
	if fi, err := os.Stat(env1.Helper); err != nil || fi.Size() <= 1000 {
		t.Errorf("helper not restored: %v", err)
	}
	// No temporary upload files remain.
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(env1.Helper), ".upload.*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestConcurrentJobsOnOneHost: jobs of two providers (two runner
// managers) start at once on one host with a helper it has never seen:
// each provider uploads at most once, nobody sees a partial helper, and
// every job runs its stages in its own directory.
func TestConcurrentJobsOnOneHost(t *testing.T) {
	needSSHD(t)
	helper := freshHelper(t)
	dir := t.TempDir()
	var logs [2]logCounter
	var ps [2]*Provider
	for i := range ps {
		o := testOptions(dir)
		o.Helper, o.Logger = helper, slog.New(&logs[i])
		ps[i] = newProvider(t, o)
	}
	const jobs = 8
	var wg sync.WaitGroup
	errs := make([]error, jobs)
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				ctx := context.Background()
				e, err := ps[i%2].Create(ctx)
				if err != nil {
					return err
				}
				defer e.Cleanup(ctx)
				o := opts(i)
				o.ShortToken = "runner" + strconv.Itoa(i%2)
				env, err := e.Prepare(ctx, o)
				if err != nil {
					return err
				}
				if _, err := run(ctx, e, fmt.Sprintf("echo job-%d > owner; %s --version >/dev/null", i, shq(env.Helper))); err != nil {
					return err
				}
				out, err := run(ctx, e, "sleep 0.1; cat owner")
				if err != nil {
					return err
				}
				if strings.TrimSpace(out) != fmt.Sprintf("job-%d", i) {
					return fmt.Errorf("read %q: directories are shared", out)
				}
				return e.Cleanup(ctx)
			}()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("job %d: %v", i, err)
		}
	}
	for i := range ps {
		if n := logs[i].count("uploaded the helper"); n > 1 {
			t.Errorf("provider %d uploaded %d times, want at most 1", i, n)
		}
	}
	if logs[0].count("uploaded the helper")+logs[1].count("uploaded the helper") == 0 {
		t.Error("nobody uploaded the new helper")
	}
}

// TestHostVanishesMidStage: the host stops answering while a stage runs
// (a black hole, no TCP reset): keepalives notice, Run returns a system
// failure, and Cleanup connects again to kill the stage's processes,
// which outlived the connection on the host.
func TestHostVanishesMidStage(t *testing.T) {
	needSSHD(t)
	px := startProxy(t, "127.0.0.1:"+sshd.port)
	dir := t.TempDir()
	o := testOptions(dir)
	o.Config.Port = strconv.Itoa(px.ln.Addr().(*net.TCPAddr).Port)
	o.Config.KnownHostsFile = filepath.Join(dir, "known_hosts")
	if err := writeKnownHosts(o.Config.KnownHostsFile, px.addr(), sshd.hostKeys[xssh.KeyAlgoED25519]); err != nil {
		t.Fatal(err)
	}
	o.Keepalive = 100 * time.Millisecond
	p := newProvider(t, o)
	e, env := prepare(t, p, opts(0))

	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(context.Background(), executor.Command{Stage: "step_script", Script: `sleep 1000 & echo "pid:$!"; wait`, Output: &out})
	}()
	pid := waitPid(t, &out)
	px.freeze()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not notice the host is gone")
	}
	var ee *executor.ExitError
	if errors.As(err, &ee) || !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrKeepaliveTimeout) {
		t.Fatalf("Run: %v, want a system failure wrapping ErrConnectionLost and ErrKeepaliveTimeout", err)
	}
	if _, err := run(context.Background(), e, "echo more"); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("Run on a lost connection: %v", err)
	}
	if !alive(pid) {
		t.Fatal("the stage died with the connection: the test shows nothing")
	}
	if err := e.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	waitGone(t, pid)
	if _, err := os.Stat(env.TmpDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TmpDir survives Cleanup: %v", err)
	}
}

// TestHostDownMidStage: the connection drops and the host cannot be
// reached again: Run and Cleanup fail with errors that say so, and the
// next runner start's Sweep kills what the job left on the host.
func TestHostDownMidStage(t *testing.T) {
	needSSHD(t)
	px := startProxy(t, "127.0.0.1:"+sshd.port)
	dir := t.TempDir()
	o := testOptions(dir)
	o.Config.Port = strconv.Itoa(px.ln.Addr().(*net.TCPAddr).Port)
	o.Config.KnownHostsFile = filepath.Join(dir, "known_hosts")
	if err := writeKnownHosts(o.Config.KnownHostsFile, px.addr(), sshd.hostKeys[xssh.KeyAlgoED25519]); err != nil {
		t.Fatal(err)
	}
	o.ConnectTimeout = 2 * time.Second
	p := newProvider(t, o)
	e, _ := prepare(t, p, opts(0))

	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(context.Background(), executor.Command{Stage: "step_script", Script: `setsid sleep 1000 & echo "pid:$!"; wait`, Output: &out})
	}()
	pid := waitPid(t, &out)
	px.close()
	select {
	case err := <-done:
		var ee *executor.ExitError
		if errors.As(err, &ee) || !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("Run: %v, want a system failure wrapping ErrConnectionLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the connection dropped")
	}
	if err := e.Cleanup(context.Background()); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Cleanup with the host down: %v, want ErrUnreachable", err)
	}
	if !alive(pid) {
		t.Fatal("the stage died with the connection: the test shows nothing")
	}
	// The runner manager restarts; the host is back.
	direct := newProvider(t, testOptions(dir))
	if err := direct.Sweep(context.Background(), executor.SweepOptions{SystemID: systemID, ShortToken: "tok12345"}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// TestSweepSparesOtherRunners: Sweep kills by the runner's marker scope.
func TestSweepSparesOtherRunners(t *testing.T) {
	needSSHD(t)
	p := newProvider(t, testOptions(t.TempDir()))
	o := opts(0)
	o.ShortToken = "otherrunner"
	e, _ := prepare(t, p, o)
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- e.Run(ctx, executor.Command{Stage: "step_script", Script: `sleep 1000 & echo "pid:$!"; wait`, Output: &out})
	}()
	pid := waitPid(t, &out)
	if err := p.Sweep(context.Background(), executor.SweepOptions{SystemID: systemID, ShortToken: "tok12345"}); err != nil {
		t.Fatal(err)
	}
	if !alive(pid) {
		t.Fatal("Sweep killed another runner's stage")
	}
	cancel()
	<-done
	waitGone(t, pid)
}

func waitPid(t *testing.T, out *testenv.SyncBuffer) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, f := range strings.Fields(out.String()) {
			if n, ok := strings.CutPrefix(f, "pid:"); ok {
				if pid, err := strconv.Atoi(n); err == nil {
					return pid
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid printed: %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestShutdownClosesConnections(t *testing.T) {
	needSSHD(t)
	p := newProvider(t, testOptions(t.TempDir()))
	e, _ := prepare(t, p, opts(0))
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), e, "echo x"); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if _, err := p.Create(context.Background()); err == nil {
		t.Fatal("Create after Shutdown accepted")
	}
}

// TestStages covers what the conformance suite does not: the shell
// choice, directories relative to the remote home, stdin, signals and a
// stage that cannot start.
func TestStages(t *testing.T) {
	needSSHD(t)
	o := testOptions(t.TempDir())
	o.DefaultBuildsDir, o.DefaultCacheDir = "", ""
	p := newProvider(t, o)
	ctx := context.Background()

	po := opts(0)
	po.Shell = "sh"
	po.CacheDir = "~/cache-" + randomHex(4)
	e, env := prepare(t, p, po)
	if env.Shell != "sh" {
		t.Errorf("shell %q, want sh", env.Shell)
	}
	if want := filepath.Join(sshd.home, "builds", "tok12345/0/group/project"); env.BuildDir != want {
		t.Errorf("build dir %q, want %q (builds under the remote home)", env.BuildDir, want)
	}
	if want := filepath.Join(sshd.home, strings.TrimPrefix(po.CacheDir, "~/")); env.CacheDir != want {
		t.Errorf("cache dir %q, want %q", env.CacheDir, want)
	}
	if fi, err := os.Stat(env.TmpDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("TmpDir: %v, mode %v, want 0700", err, fi.Mode())
	}
	if env.Hostname == "" {
		t.Error("no hostname")
	}
	if out, err := run(ctx, e, `echo "[$0]"; cat; read x || echo stdin-closed`); err != nil || !strings.Contains(out, "stdin-closed") || !strings.Contains(out, env.TmpDir) {
		t.Errorf("stdin: %v %q", err, out)
	}
	var ee *executor.ExitError
	if _, err := run(ctx, e, "kill -KILL $$"); !errors.As(err, &ee) || ee.Code != 137 {
		t.Errorf("killed by SIGKILL: %v, want exit status 137", err)
	}
	// A stage that removes the build directory breaks the next one: a
	// system failure, not a script's exit status.
	if _, err := run(ctx, e, `cd /; rm -rf `+shq(env.BuildDir)); err != nil {
		t.Fatal(err)
	}
	_, err := run(ctx, e, "echo unreachable")
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "build directory") {
		t.Errorf("stage without its build directory: %v", err)
	}

	e2, _ := p.Create(ctx)
	defer e2.Cleanup(ctx)
	po.Shell = "pwsh"
	if _, err := e2.Prepare(ctx, po); err == nil {
		t.Error("pwsh accepted")
	}
}

// TestUnreachableLeftoverDoesNotHang: a process that cleared its
// environment and left the stage's group is beyond the marker, and holds
// the session's output: the stage still ends with its status once the
// wait for leftovers is over.
func TestUnreachableLeftoverDoesNotHang(t *testing.T) {
	needSSHD(t)
	defer func(d time.Duration) { leftoverWait = d }(leftoverWait)
	leftoverWait = 300 * time.Millisecond
	p := newProvider(t, testOptions(t.TempDir()))
	e, _ := prepare(t, p, opts(0))
	var buf testenv.SyncBuffer
	t.Cleanup(func() { killPrinted(buf.String()) })
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = e.Run(context.Background(), executor.Command{Stage: "step_script", Output: &buf, Script: `env -i /bin/sh -c 'setsid /bin/sh -c "echo pid:\$\$; exec sleep 1000" &'; sleep 0.2; exit 3`})
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the stage hangs on a process holding its output")
	}
	var ee *executor.ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("Run: %v, want exit status 3 (output %q)", err, buf.String())
	}
}

// TestWrapperKilled: the wrapper on the host dies (killed from outside)
// while a process beyond the marker holds the stage's output: Run does
// not wait for that process, and reports a system failure.
func TestWrapperKilled(t *testing.T) {
	needSSHD(t)
	defer func(d time.Duration) { leftoverWait = d }(leftoverWait)
	leftoverWait = 300 * time.Millisecond
	p := newProvider(t, testOptions(t.TempDir()))
	e, _ := prepare(t, p, opts(0))
	var buf testenv.SyncBuffer
	t.Cleanup(func() { killPrinted(buf.String()) })
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = e.Run(context.Background(), executor.Command{Stage: "step_script", Output: &buf, Script: `env -i /bin/sh -c 'setsid /bin/sh -c "echo pid:\$\$; exec sleep 1000" &'; sleep 0.2; kill -KILL $PPID; sleep 1000`})
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run hangs after the wrapper died")
	}
	var ee *executor.ExitError
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "SIGKILL") {
		t.Fatalf("Run: %v, want a system failure naming SIGKILL (output %q)", err, buf.String())
	}
}

// killPrinted kills the processes whose "pid:N" out holds: processes
// beyond the executor's reach that a test started on purpose.
func killPrinted(out string) {
	for _, f := range strings.Fields(out) {
		if n, ok := strings.CutPrefix(f, "pid:"); ok {
			if pid, err := strconv.Atoi(n); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// TestCleanupIsIdempotent: twice, and without Prepare.
func TestCleanupIsIdempotent(t *testing.T) {
	needSSHD(t)
	p := newProvider(t, testOptions(t.TempDir()))
	e, env := prepare(t, p, opts(0))
	for range 2 {
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(env.TmpDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TmpDir: %v", err)
	}
	e2, _ := p.Create(context.Background())
	if err := e2.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestHelperPlatform(t *testing.T) {
	hb := helperBinary{path: "/b", goos: "linux", goarch: "amd64"}
	for _, tc := range []struct {
		os, machine string
		bin         helperBinary
		ok          bool
	}{
		{"Linux", "x86_64", hb, true},
		{"Linux", "aarch64", hb, false},
		{"Linux", "mips", hb, true}, // unknown to us: not refused
		{"Darwin", "x86_64", hb, false},
		{"Linux", "x86_64", helperBinary{path: "/b"}, false}, // not ELF
	} {
		err := checkPlatform(probeResult{os: tc.os, machine: tc.machine}, tc.bin)
		if (err == nil) != tc.ok {
			t.Errorf("%s %s %+v: %v", tc.os, tc.machine, tc.bin, err)
		}
	}
	if runtime.GOOS != "linux" {
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if goos, goarch := elfPlatform(f); goos != "linux" || goarch != unameArch(uname(t)) {
		t.Errorf("elfPlatform of the test binary: %s/%s", goos, goarch)
	}
}

func uname(t *testing.T) string {
	out, err := exec.Command("uname", "-m").Output()
	if err != nil {
		t.Skip("uname: ", err)
	}
	return strings.TrimSpace(string(out))
}
