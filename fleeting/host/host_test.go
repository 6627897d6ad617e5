package host_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/host"
	"github.com/berthci/berth/fleeting/internal/wiretest"
)

// records collects log records.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs(as []slog.Attr) slog.Handler { return &withAttrs{r, as} }
func (r *records) WithGroup(string) slog.Handler         { return r }

type withAttrs struct {
	*records
	attrs []slog.Attr
}

func (w *withAttrs) Handle(ctx context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(w.attrs...)
	return w.records.Handle(ctx, rec)
}

// find waits for a record with message msg and returns its attributes.
func (r *records) find(t *testing.T, msg string) (slog.Level, map[string]string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		for _, rec := range r.recs {
			if rec.Message == msg {
				attrs := map[string]string{}
				rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
				r.mu.Unlock()
				return rec.Level, attrs
			}
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no log record %q", msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDrivesPluginWrittenFromReference starts a plugin that knows nothing of
// Berth's code — a gRPC server built from the reference's service and
// message names with dynamic messages, doing the handshake by hand — and
// drives every method through the host.
func TestDrivesPluginWrittenFromReference(t *testing.T) {
	ctx := testCtx(t)
	logs := &records{}
	p, err := host.Start(ctx, host.Config{
		Plugin:       os.Args[0],
		Name:         "raw",
		PluginConfig: []byte(`{"region":"eu"}`),
		Env:          []string{"BERTH_TEST_ROLE=rawplugin"},
		Logger:       slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	info, err := p.Init(ctx, nil, fleeting.Settings{ConnectorConfig: fleeting.ConnectorConfig{
		Username: "u", Protocol: fleeting.ProtocolSSH, Keepalive: 3 * time.Second, Key: []byte("K"),
		UseStaticCredentials: true, ProtocolPort: 2200,
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := fleeting.ProviderInfo{ID: `raw:{"region":"eu"}`, MaxSize: wiretest.RawMaxSize, Version: "u|ssh|3000000000|K|true|2200", BuildInfo: "raw"}
	if info != want {
		t.Errorf("Init = %+v, want %+v", info, want)
	}

	var got []string
	if err := p.Update(ctx, func(id string, s fleeting.State) { got = append(got, id+"="+string(s)) }); err != nil {
		t.Fatal(err)
	}
	wantStates := []string{"i-creating=creating", "i-running=running", "i-deleting=deleting", "i-deleted=deleted", "i-timeout=timeout"}
	if !slices.Equal(got, wantStates) {
		t.Errorf("Update = %v, want %v", got, wantStates)
	}

	if n, err := p.Increase(ctx, 3); n != 2 || err != nil {
		t.Errorf("Increase(3) = %d, %v; want 2 (the raw plugin answers n-1)", n, err)
	}
	if ids, err := p.Decrease(ctx, []string{"a", "b", "c"}); !slices.Equal(ids, []string{"c", "b", "a"}) || err != nil {
		t.Errorf("Decrease = %v, %v; want [c b a]", ids, err)
	}

	ci, err := p.ConnectInfo(ctx, "i-running")
	if err != nil {
		t.Fatal(err)
	}
	wantCI := fleeting.ConnectInfo{
		ConnectorConfig: fleeting.ConnectorConfig{
			OS: "linux", Arch: "arm64", Protocol: "ssh", Username: "i-running", Password: "pw", Key: []byte("KEY"),
			UseStaticCredentials: true, Keepalive: 5 * time.Second, Timeout: 7 * time.Second, ProtocolPort: 2222,
		},
		ID: "i-running", ExternalAddr: "203.0.113.1", InternalAddr: "10.0.0.1", Expires: time.Unix(wiretest.RawExpires, 0),
	}
	if string(ci.Key) != "KEY" || !ci.Expires.Equal(wantCI.Expires) {
		t.Errorf("ConnectInfo = %+v, want %+v", ci, wantCI)
	}
	ci.Key, wantCI.Key = nil, nil
	ci.Expires, wantCI.Expires = time.Time{}, time.Time{}
	if !reflect.DeepEqual(ci, wantCI) {
		t.Errorf("ConnectInfo = %+v, want %+v", ci, wantCI)
	}
	if _, err := p.ConnectInfo(ctx, "missing"); !errors.Is(err, fleeting.ErrInstanceNotFound) {
		t.Errorf("ConnectInfo(missing) = %v, want ErrInstanceNotFound (gRPC NotFound)", err)
	}
	// The raw plugin has no Heartbeat: like upstream, that counts as healthy.
	if err := p.Heartbeat(ctx, "i-running"); err != nil {
		t.Errorf("Heartbeat on a plugin without it = %v, want nil", err)
	}

	// Its hclog line on stderr arrives as a structured record.
	level, attrs := logs.find(t, wiretest.RawLogMessage)
	if level != slog.LevelWarn || attrs["answer"] != "42" || attrs["plugin"] != "raw" {
		t.Errorf("relayed log: level %v attrs %v; want WARN with answer=42 plugin=raw", level, attrs)
	}

	pid := p.Pid()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "raw plugin after Shutdown")
	if _, err := p.Increase(ctx, 1); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Increase after Shutdown = %v, want ErrClosed", err)
	}
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleeting-plugin-script")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHandshakeTimeout(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	bin := script(t, "echo $$ > "+pidFile+"\nexec sleep 60\n")
	_, err := host.Start(testCtx(t), host.Config{Plugin: bin, StartTimeout: 300 * time.Millisecond})
	if !errors.Is(err, host.ErrHandshakeTimeout) {
		t.Fatalf("Start = %v, want ErrHandshakeTimeout", err)
	}
	if !strings.Contains(err.Error(), "fleeting-plugin-script") {
		t.Errorf("error %q does not name the plugin", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitGone(t, pid, "plugin that timed out")
}

// A start canceled while the plugin has not answered the handshake ends
// at once (not after StartTimeout) and leaves no plugin process.
func TestStartCanceledDuringHandshake(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	bin := script(t, "echo $$ > "+pidFile+"\nexec sleep 600\n")
	ctx, cancel := context.WithCancel(context.Background()) // no deadline: it would bound the handshake too
	defer cancel()
	go func() {
		for {
			if _, err := os.Stat(pidFile); err == nil {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	// A liveness check, not a speed one: without the cancel ending the
	// handshake, Start would wait out its 10-minute StartTimeout.
	done := make(chan error, 1)
	go func() {
		_, err := host.Start(ctx, host.Config{Plugin: bin, StartTimeout: 10 * time.Minute})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Start still waits for the handshake two minutes after its context was canceled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v, want context.Canceled", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitGone(t, pid, "plugin whose start was canceled")
}

func TestPluginExitsBeforeHandshake(t *testing.T) {
	bin := script(t, "echo 'config file is broken' >&2\nexit 3\n")
	_, err := host.Start(testCtx(t), host.Config{Plugin: bin})
	if !errors.Is(err, host.ErrPluginExited) {
		t.Fatalf("Start = %v, want ErrPluginExited", err)
	}
	if !strings.Contains(err.Error(), "config file is broken") {
		t.Errorf("error %q does not carry the plugin's last words", err)
	}
}

func TestNotAPlugin(t *testing.T) {
	bin := script(t, "echo hello\nsleep 5\n")
	_, err := host.Start(testCtx(t), host.Config{Plugin: bin, StartTimeout: 20 * time.Second})
	if err == nil || errors.Is(err, host.ErrHandshakeTimeout) || !strings.Contains(err.Error(), "hello") {
		t.Fatalf("Start = %v, want an error quoting the unexpected line", err)
	}
}

// TestCrashRestart kills the plugin process; the host restarts it, replays
// Init, and the instances are still there.
func TestCrashRestart(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-static")
	ctx := testCtx(t)
	logs := &records{}
	cfg := `{"hosts":[{"id":"a","address":"192.0.2.1"},{"id":"b","address":"192.0.2.2"},{"id":"c","address":"192.0.2.3"}],"state_file":"` +
		filepath.Join(t.TempDir(), "state.json") + `"}`
	p, err := host.Start(ctx, host.Config{Plugin: bin, PluginConfig: []byte(cfg), Logger: slog.New(logs), RestartBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Init(ctx, nil, fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Increase(ctx, 2); n != 2 || err != nil {
		t.Fatalf("Increase = %d, %v", n, err)
	}
	list := func() ([]string, error) {
		var ids []string
		err := p.Update(ctx, func(id string, _ fleeting.State) { ids = append(ids, id) })
		return ids, err
	}
	before, err := list()
	if err != nil {
		t.Fatal(err)
	}

	pid := p.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "killed plugin")
	logs.find(t, "plugin process exited unexpectedly; restarting")

	// Calls made while the plugin is down either wait for the restart or
	// fail with ErrPluginExited; once restarted they succeed.
	var after []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, err = list()
		if err == nil {
			break
		}
		if !errors.Is(err, host.ErrPluginExited) {
			t.Fatalf("Update during restart: %v, want success or ErrPluginExited", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin not back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !slices.Equal(before, after) {
		t.Errorf("after restart Update lists %v, want %v", after, before)
	}
	if p.Restarts() != 1 {
		t.Errorf("Restarts = %d, want 1", p.Restarts())
	}
	if np := p.Pid(); np == pid || np == 0 {
		t.Errorf("pid after restart = %d (before %d)", np, pid)
	}
	// Init was replayed: the new process accepts calls that need it.
	if n, err := p.Increase(ctx, 1); n != 1 || err != nil {
		t.Errorf("Increase after restart = %d, %v", n, err)
	}
}

// TestNoOrphanAfterHostKilled starts a host process that starts a plugin,
// kills the host with SIGKILL and checks the plugin goes away: through the
// kernel's parent-death signal, and — with that disabled — through the
// SDK's own watch on its parent.
func TestNoOrphanAfterHostKilled(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-fake")
	for _, tc := range []struct {
		name     string
		noDeathS string
	}{{"parent death signal", "0"}, {"sdk watches parent", "1"}} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "BERTH_TEST_ROLE=host", "BERTH_TEST_PLUGIN="+bin, "BERTH_TEST_NODEATHSIG="+tc.noDeathS)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(out)
			if !sc.Scan() {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("helper host printed no plugin pid")
			}
			pid, err := strconv.Atoi(sc.Text())
			if err != nil || !alive(pid) {
				t.Fatalf("plugin pid %q not running (%v)", sc.Text(), err)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			waitGone(t, pid, "plugin of the killed host")
		})
	}
}
