package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
	"github.com/berthci/berth/runnerapi"
)

// testImage is the image the tests' VMs run (built by .ci/images).
const testImage = "berth-test/busybox:latest"

var images struct {
	once sync.Once
	dir  string
}

// The test binary is also the local fleeting plugin's instance server.
func TestMain(m *testing.M) {
	local.RunServerIfAsked()
	code := m.Run()
	if images.dir != "" {
		os.RemoveAll(images.dir)
	}
	testenv.RemoveBuilt()
	os.Exit(code)
}

// needVMs skips (fails with BERTH_REQUIRE_DEPS=1) unless VMs can boot
// here: root, QEMU, qemu-img, a kernel, mkfs.ext4, Go and the Docker
// engine with testImage.
func needVMs(t *testing.T) {
	t.Helper()
	testenv.VMs(t)
	testenv.LookPath(t, "go")
	testenv.DockerImage(t, testImage)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newTestProvider is a microvm provider with its own nesting daemon in
// process on QEMU (TCG, small VMs) and a state directory of its own; the
// image store is shared by the test process. It is shut down, and its
// state directory checked to hold no VM, at the end of the test.
func newTestProvider(t *testing.T, c config.MicroVM, o Options) *Provider {
	t.Helper()
	needVMs(t)
	berth := testenv.Berth(t)
	images.once.Do(func() {
		images.dir, _ = os.MkdirTemp("", "microvm-test-images-")
	})
	state, err := os.MkdirTemp("", "bm") // short: agent socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	nc := map[string]any{"accel": "tcg", "memory_mb": 256, "state_dir": state, "image_dir": images.dir, "agent": berth}
	for k, v := range c.NestingConfig {
		nc[k] = v
	}
	c.NestingConfig = nc
	o.Config = c
	o.StateDir = state
	o.Hypervisor = func(l *slog.Logger) nesting.Hypervisor { return qemu.New(l) }
	o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
			t.Errorf("after Shutdown, %s/vms holds %v", state, ents)
		}
		if ps := testenv.Processes(state); len(ps) != 0 {
			t.Errorf("processes of %s still run after Shutdown: %v", state, ps)
		}
		os.RemoveAll(state)
	})
	return p
}

// inVMs runs a POSIX sh snippet in every VM of p's nesting daemon,
// through a client of its own on the VM's address (beside the job's), and
// reports whether it succeeded in any.
func inVMs(p *Provider, script string, args ...string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := p.nestingClient(ctx)
	if err != nil {
		return false
	}
	vms, err := nc.List(ctx)
	if err != nil {
		return false
	}
	ok := false
	for _, vm := range vms {
		network, addr, err := nesting.ParseTarget(vm.Addr)
		if err != nil {
			continue
		}
		c, err := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		})
		if err != nil {
			continue
		}
		err = c.Run(ctx, guest.RunOptions{Argv: append([]string{"/bin/sh", "-c", script, "sh"}, args...), Env: []string{"PATH=/bin:/usr/bin"}, Detached: true, Output: io.Discard})
		c.Close()
		if err == nil {
			ok = true
		}
	}
	return ok
}

// aliveScript succeeds when process $1 exists and is not a zombie.
const aliveScript = `st=$(cat /proc/$1/stat 2>/dev/null) || exit 1
case "$st" in *") Z "*) exit 1 ;; esac`

func busyboxJob() *runnerapi.JobResponse {
	return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: testImage}}
}

// TestConformance: the executor suite, every job in a microVM of its own.
func TestConformance(t *testing.T) {
	var p *Provider
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			p = newTestProvider(t, config.MicroVM{}, Options{})
			return p
		},
		ProcessAlive: func(pid int) bool { return inVMs(p, aliveScript, strconv.Itoa(pid)) },
		FileExists:   func(path string) bool { return inVMs(p, `test -e "$1"`, path) },
		CreateFile: func(path string) error {
			if !inVMs(p, `: > "$1"`, path) {
				return fmt.Errorf("creating %s in the VM failed", path)
			}
			return nil
		},
		Job:        busyboxJob,
		Disposable: true,
	})
}

// prepared prepares an executor of p with o; Cleanup is registered.
func prepared(t *testing.T, p *Provider, o executor.PrepareOptions) (*Executor, executor.Environment, string) {
	t.Helper()
	e, _ := p.Create(context.Background())
	t.Cleanup(func() {
		if err := e.Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	var out bytes.Buffer
	o.Output = &out
	if o.ShortToken == "" {
		o.ShortToken, o.ProjectPath = "abcdefghi", "group/project"
	}
	env, err := e.Prepare(context.Background(), o)
	if err != nil {
		t.Fatalf("Prepare: %v\n%s", err, out.String())
	}
	return e.(*Executor), env, out.String()
}

func runScript(t *testing.T, e executor.Executor, script string) string {
	t.Helper()
	var out bytes.Buffer
	if err := e.Run(context.Background(), executor.Command{Stage: "step_script", Script: script, Output: &out}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	return out.String()
}

// TestJobSeesItsOwnMachine: the job runs on a kernel booted for it (its
// boot id is not the host's; its command line is the hypervisor's), under the
// guest's init as PID 1, with none of the host's processes (a marked one
// is looked for), under the VM's hostname.
func TestJobSeesItsOwnMachine(t *testing.T) {
	p := newTestProvider(t, config.MicroVM{}, Options{})
	marker := fmt.Sprintf("host-marker-%d", time.Now().UnixNano())
	sleeper := exec.Command("sh", "-c", "exec -a "+marker+" sleep 600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	hostBoot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	e, env, prep := prepared(t, p, executor.PrepareOptions{Job: busyboxJob()})
	if !strings.Contains(prep, "Running in microVM "+e.vm.ID) {
		t.Errorf("Prepare's output does not say which VM:\n%s", prep)
	}
	out := runScript(t, e, `cat /proc/sys/kernel/random/boot_id; hostname; tr '\0' ' ' < /proc/1/cmdline; echo; cat /proc/cmdline
for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f 2>/dev/null)" in *`+marker+`*) echo "SEES THE ""HOST";; esac; done`)
	t.Logf("in the VM:\n%s", out)
	lines := strings.Split(out, "\n")
	if len(lines) < 4 {
		t.Fatalf("short output:\n%s", out)
	}
	if lines[0] == "" || lines[0] == strings.TrimSpace(string(hostBoot)) {
		t.Errorf("boot id %q: want one of its own (the host's is %s)", lines[0], hostBoot)
	}
	if lines[1] != env.Hostname || lines[1] != e.vm.ID {
		t.Errorf("hostname %q; want the VM's %q (env %q)", lines[1], e.vm.ID, env.Hostname)
	}
	if !strings.Contains(lines[2], "berth guest --init") {
		t.Errorf("PID 1 is %q, not the guest's init", lines[2])
	}
	// A VM restored from its image's template runs the template's
	// kernel, booted with the template's name.
	if !strings.Contains(lines[3], "berth.hostname=nesting-") {
		t.Errorf("kernel command line %q is not one the hypervisor booted", lines[3])
	}
	if strings.Contains(out, "SEES THE HOST") {
		t.Error("the job sees a process of the host")
	}
}

// TestVMLevel: machine q35 makes the executor offer isolation vm, and the
// job runs on a PC whose devices sit on PCI.
func TestVMLevel(t *testing.T) {
	p := newTestProvider(t, config.MicroVM{NestingConfig: map[string]any{"machine": "q35", "network": "none"}}, Options{})
	if l := p.IsolationLevels(); len(l) != 1 || l[0] != executor.IsolationVM {
		t.Fatalf("isolation levels %v, want [vm]", l)
	}
	e, _, prep := prepared(t, p, executor.PrepareOptions{Job: busyboxJob()})
	if !strings.Contains(prep, "Running in VM "+e.vm.ID) {
		t.Errorf("Prepare's output:\n%s", prep)
	}
	out := runScript(t, e, `ls /sys/bus/pci/drivers/virtio-pci`)
	if !strings.Contains(out, "0000:00:") {
		t.Errorf("no virtio device on PCI:\n%s", out)
	}
}

// TestPrepareRefuses: what the executor refuses before any VM boots.
func TestPrepareRefuses(t *testing.T) {
	p, err := New(Options{Config: config.MicroVM{NestingHost: "unix:///nonexistent/nesting.sock", AllowedImages: []string{"berth-test/*"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	for name, c := range map[string]struct {
		job  *runnerapi.JobResponse
		want error
		text string
	}{
		"services":         {&runnerapi.JobResponse{Image: &runnerapi.Image{Name: testImage}, Services: []runnerapi.Image{{Name: "postgres"}}}, executor.ErrNotAllowed, "services: are not supported at the microvm level"},
		"not allowed":      {&runnerapi.JobResponse{Image: &runnerapi.Image{Name: "debian:12"}}, executor.ErrNotAllowed, `image "debian:12" is not in allowed_images`},
		"no image":         {&runnerapi.JobResponse{}, ErrNoImage, "no image: in the job"},
		"expanded, denied": {&runnerapi.JobResponse{Image: &runnerapi.Image{Name: "$IMG"}, Variables: []runnerapi.Variable{{Key: "IMG", Value: "evil/x"}}}, executor.ErrNotAllowed, `"evil/x" is not in allowed_images`},
	} {
		e, _ := p.Create(context.Background())
		_, err := e.Prepare(context.Background(), executor.PrepareOptions{Job: c.job, ShortToken: "abcdefghi", ProjectPath: "g/p"})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: Prepare = %v; want %v with %q", name, err, c.want, c.text)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Errorf("%s: Cleanup: %v", name, err)
		}
	}
	// A nesting daemon that is not there: a clear error naming it.
	e, _ := p.Create(context.Background())
	_, err = e.Prepare(context.Background(), executor.PrepareOptions{Job: busyboxJob(), ShortToken: "abcdefghi", ProjectPath: "g/p"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/nesting.sock") {
		t.Errorf("Prepare with no daemon: %v", err)
	}
	e.Cleanup(context.Background())
}

// TestCoordinatorThroughTheAgent: the job reaches the coordinator by the
// URL the runner uses — here a host name only the host can resolve, on
// the host's loopback — whatever the VM's network (none here): the guest
// resolves the name to its loopback and the agent carries the connection
// to the host.
func TestCoordinatorThroughTheAgent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "coordinator says hi to %s for %s\n", r.Header.Get("User-Agent"), r.Host)
	})}
	go srv.Serve(l)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	serverURL := "http://coordinator.berth.test:" + port
	dialed := make(chan string, 10)
	p := newTestProvider(t, config.MicroVM{NestingConfig: map[string]any{"network": "none"}}, Options{
		ServerDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialed <- addr
			var d net.Dialer
			return d.DialContext(ctx, network, l.Addr().String())
		},
	})
	e, _, _ := prepared(t, p, executor.PrepareOptions{Job: busyboxJob(), ServerURL: serverURL})
	out := runScript(t, e, `ls /sys/class/net; wget -q -U job -O - `+serverURL+`/api/v4/jobs`)
	if strings.Contains(out, "eth0") {
		t.Errorf("network none: the VM has eth0:\n%s", out)
	}
	if !strings.Contains(out, "coordinator says hi to job for coordinator.berth.test:"+port) {
		t.Errorf("the job did not reach the coordinator:\n%s", out)
	}
	select {
	case a := <-dialed:
		if a != "coordinator.berth.test:"+port {
			t.Errorf("the host dialled %q", a)
		}
	default:
		t.Error("the host never dialled the coordinator for the VM")
	}
}

// TestCancelDestroysTheVM: a job canceled mid-stage ends at once, and its
// Cleanup removes the VM: its QEMU and its files are gone.
func TestCancelDestroysTheVM(t *testing.T) {
	p := newTestProvider(t, config.MicroVM{}, Options{})
	e, _, _ := prepared(t, p, executor.PrepareOptions{Job: busyboxJob()})
	state := p.opts.StateDir
	dir := filepath.Join(state, "vms", e.vm.ID)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the VM's directory: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, executor.Command{Stage: "step_script", Script: "echo started; sleep 600", Output: &out})
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "started") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, guest.ErrCanceled) {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after cancel")
	}
	if err := e.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM's directory after Cleanup: %v", err)
	}
	if ps := testenv.Processes(dir); len(ps) != 0 {
		t.Errorf("the VM's QEMU still runs after Cleanup: %v", ps)
	}
}

// TestDefaultImagePrewarmed: the runner's own daemon starts at once and
// makes the template of [runners.microvm] image before any job, so the
// first job of that image is already restored from it.
func TestDefaultImagePrewarmed(t *testing.T) {
	p := newTestProvider(t, config.MicroVM{Image: testImage}, Options{})
	templates := filepath.Join(p.opts.StateDir, "templates")
	count := func() int {
		ents, _ := os.ReadDir(templates)
		n := 0
		for _, e := range ents {
			if _, err := os.Stat(filepath.Join(templates, e.Name(), "meta.json")); err == nil {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Minute)
	for count() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no template in %s five minutes after the runner started, before any job", templates)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e, _, _ := prepared(t, p, executor.PrepareOptions{Job: &runnerapi.JobResponse{}})
	if !inVMs(p, `grep -q "berth.hostname=$1" /proc/cmdline && exit 1; exit 0`, e.VM().ID) {
		t.Error("the first job's VM was booted (its kernel command line names it), not restored from the template")
	}
	if n := count(); n != 1 {
		t.Errorf("%d templates after the first job, want the one made at start", n)
	}
}
