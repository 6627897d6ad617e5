package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/nestingtest"
)

// The tests' hypervisor, also in the test binary run as berth by startBerth.
func init() {
	hypervisors["fake"] = func(*slog.Logger) nesting.Hypervisor { return &nestingtest.Fake{} }
}

// nestingSocket is a socket path short enough for sun_path.
func nestingSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "nesting.sock")
}

// waitDaemon waits until a daemon answers on path.
func waitDaemon(t *testing.T, path string, failed func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := nesting.Dial(ctx, "unix://"+path)
		cancel()
		if err == nil {
			c.Close()
			return
		}
		if ferr := failed(); ferr != nil {
			t.Fatalf("nesting serve ended: %v", ferr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no nesting daemon on %s: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNestingCLIAgainstAServedFake(t *testing.T) {
	sock := nestingSocket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	var serveErr bytes.Buffer
	go func() {
		root := newRootCmd()
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&serveErr)
		root.SetArgs([]string{"nesting", "serve", "--hypervisor", "fake", "--socket", sock, "--log-level", "warn"})
		served <- root.ExecuteContext(ctx)
	}()
	waitDaemon(t, sock, func() error {
		select {
		case err := <-served:
			return errors.Join(err, errors.New(serveErr.String()))
		default:
			return nil
		}
	})
	host := []string{"--host", "unix://" + sock}
	run := func(args ...string) (string, error) {
		t.Helper()
		return runCLI(t, append(args, host...)...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("berth %s: %v", strings.Join(args, " "), err)
		}
		return out
	}

	if _, err := run("nesting", "list"); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("list before init = %v, want not initialized", err)
	}
	cfg := filepath.Join(t.TempDir(), "nesting.json")
	os.WriteFile(cfg, []byte(`{"image_directory":"/images"}`), 0o600)
	must("nesting", "init", "--config", cfg)
	if _, err := run("nesting", "init"); !errors.Is(err, nesting.ErrAlreadyInitialized) {
		t.Errorf("second init = %v, want already initialized", err)
	}

	line := regexp.MustCompile(`^(nesting-[a-z0-9]{8}) debian fake:(nesting-[a-z0-9]{8})\n$`)
	out := must("nesting", "create", "debian", "0")
	m := line.FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("create printed %q, want `id name addr`", out)
	}
	first := m[1]
	out = must("nesting", "create", "debian", "0")
	lines := strings.SplitAfter(out, "\n")
	if len(lines) != 3 || !line.MatchString(lines[0]) || lines[1] != `stomped vm id "`+first+`"`+"\n" {
		t.Fatalf("create in a taken slot printed %q, want the VM and `stomped vm id %q`", out, first)
	}
	second := strings.Fields(lines[0])[0]
	out = must("nesting", "create", "alpine")
	third := strings.Fields(out)[0]

	// The default host: $NESTING_SOCKET.
	t.Setenv("NESTING_SOCKET", sock)
	out, err := runCLI(t, "nesting", "list")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{second: second + " debian fake:" + second, third: third + " alpine fake:" + third}
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(got) != 2 || got[0] != want[strings.Fields(got[0])[0]] || got[1] != want[strings.Fields(got[1])[0]] {
		t.Errorf("list printed %q, want the lines %q", out, want)
	}
	var vms []nesting.VirtualMachine
	if err := json.Unmarshal([]byte(must("nesting", "list", "--json")), &vms); err != nil || len(vms) != 2 {
		t.Errorf("list --json: %v %v", vms, err)
	}

	must("nesting", "delete", third)
	if _, err := run("nesting", "delete", third); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("delete of a deleted VM = %v, want not found", err)
	}
	var ee *exitError
	if _, err := run("nesting", "create", "debian", "one"); !errors.As(err, &ee) || ee.code != 2 {
		t.Errorf("create with a bad slot = %v, want exit status 2", err)
	}
	must("nesting", "shutdown")
	if _, err := run("nesting", "create", "debian"); !errors.Is(err, nesting.ErrNotInitialized) {
		t.Errorf("create after shutdown = %v, want not initialized", err)
	}
	if out, err := runCLI(t, "nesting", "version"); err != nil || !strings.HasPrefix(out, "berth nesting ") {
		t.Errorf("version printed %q, %v", out, err)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve = %v, want nil after its context ended", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not end")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after serve: %v, want it removed", err)
	}
}

func TestNestingServeUnknownHypervisor(t *testing.T) {
	_, err := runCLI(t, "nesting", "serve", "--hypervisor", "parallels", "--socket", nestingSocket(t))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), `unknown hypervisor "parallels"`) || !strings.Contains(err.Error(), "fake") {
		t.Errorf("serve --hypervisor parallels = %v, want exit status 2 naming the known hypervisors", err)
	}
}

func TestNestingServeRefusedConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(cfg, []byte(`[1,2]`), 0o600)
	sock := nestingSocket(t)
	_, err := runCLI(t, "nesting", "serve", "--hypervisor", "fake", "--socket", sock, "--config", cfg)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("serve with a refused --config = %v", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after a failed serve: %v, want none", err)
	}
}

// A daemon process initialized by --config serves at once, and SIGTERM
// stops it cleanly: exit status 0, socket removed.
func TestNestingServeProcessStopsOnSIGTERM(t *testing.T) {
	sock := nestingSocket(t)
	cfg := filepath.Join(t.TempDir(), "nesting.json")
	os.WriteFile(cfg, []byte(`{}`), 0o600)
	p := startBerth(t, "nesting", "serve", "--hypervisor", "fake", "--socket", sock, "--config", cfg)
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	waitDaemon(t, sock, func() error {
		select {
		case err := <-exited:
			return errors.Join(err, errors.New(p.out.String()))
		default:
			return nil
		}
	})
	if out, err := runCLI(t, "nesting", "create", "debian", "1", "--host", "unix:"+sock); err != nil || !strings.HasPrefix(out, "nesting-") {
		t.Fatalf("create on a daemon started with --config: %q %v", out, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v\n%s", err, p.out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("serve did not stop on SIGTERM\n%s", p.out.String())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after SIGTERM: %v, want it removed", err)
	}
}
