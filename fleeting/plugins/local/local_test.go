package local_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/fleeting/sdk"
)

func TestMain(m *testing.M) {
	local.RunServerIfAsked()
	os.Exit(m.Run())
}

func TestConformance(t *testing.T) {
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return local.New(local.Config{StateDir: t.TempDir(), MaxInstances: 3})
	})
}

func states(t *testing.T, g fleeting.InstanceGroup) map[string]fleeting.State {
	t.Helper()
	out := map[string]fleeting.State{}
	if err := g.Update(context.Background(), func(id string, s fleeting.State) { out[id] = s }); err != nil {
		t.Fatal(err)
	}
	return out
}

func waitState(t *testing.T, g fleeting.InstanceGroup, id string, want fleeting.State) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s := states(t, g)
		if s[id] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s: %v, want %s", id, s, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runningInstance asks g for one instance, its first, and waits until it
// runs.
func runningInstance(t *testing.T, g fleeting.InstanceGroup) string {
	t.Helper()
	if n, err := g.Increase(context.Background(), 1); n != 1 || err != nil {
		t.Fatalf("Increase = %d, %v", n, err)
	}
	var id string
	for k := range states(t, g) {
		id = k
	}
	waitState(t, g, id, fleeting.StateRunning)
	return id
}

func initGroup(t *testing.T, cfg local.Config) *local.Group {
	t.Helper()
	g := local.New(cfg)
	if _, err := g.Init(context.Background(), fleetingtest.TestLogger(t), fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	return g
}

// cleanup deletes every instance of the state dir.
func cleanup(t *testing.T, cfg local.Config) {
	t.Cleanup(func() {
		g := local.New(cfg)
		if _, err := g.Init(context.Background(), slog.New(slog.DiscardHandler), fleeting.Settings{}); err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer g.Shutdown(context.Background())
		for range 200 {
			s := states(t, g)
			if len(s) == 0 {
				return
			}
			var ids []string
			for id := range s {
				ids = append(ids, id)
			}
			g.Decrease(context.Background(), ids)
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestStateSurvivesRestart: a new plugin on the same state directory finds
// the instances, and a server process that died is started again on the
// same address.
func TestStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	cfg := local.Config{StateDir: t.TempDir(), MaxInstances: 2}
	cleanup(t, cfg)
	g := initGroup(t, cfg)
	id := runningInstance(t, g)
	info, err := g.ConnectInfo(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	// A second plugin on the same directory is refused while the first holds it.
	if _, err := local.New(cfg).Init(ctx, slog.New(slog.DiscardHandler), fleeting.Settings{}); err == nil {
		t.Fatal("a second plugin initialised on a locked state dir")
	}
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	g2 := initGroup(t, cfg)
	defer g2.Shutdown(ctx)
	if s := states(t, g2); len(s) != 1 || s[id] != fleeting.StateRunning {
		t.Fatalf("after restart: %v, want %s running", s, id)
	}
	info2, err := g2.ConnectInfo(ctx, id)
	if err != nil || info2.InternalAddr != info.InternalAddr || string(info2.Key) != string(info.Key) {
		t.Fatalf("after restart ConnectInfo = %+v, %v; want address %s and the same key", info2, err, info.InternalAddr)
	}

	// The server dies (as on a reboot): Heartbeat says unhealthy, Update
	// starts it again on the same address.
	pidFile, err := os.ReadFile(cfg.StateDir + "/instances/" + id + "/instance.json")
	if err != nil {
		t.Fatal(err)
	}
	pid := pidOf(t, pidFile)
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(30 * time.Second); g2.Heartbeat(ctx, id) == nil; {
		if time.Now().After(deadline) {
			t.Fatal("Heartbeat stays healthy after the server was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitState(t, g2, id, fleeting.StateRunning)
	info3, err := g2.ConnectInfo(ctx, id)
	if err != nil || info3.InternalAddr != info.InternalAddr {
		t.Fatalf("after server restart ConnectInfo = %+v, %v; want address %s", info3, err, info.InternalAddr)
	}
	if err := g2.Heartbeat(ctx, id); err != nil {
		t.Fatalf("Heartbeat after server restart: %v", err)
	}
}

func pidOf(t *testing.T, instanceJSON []byte) int {
	t.Helper()
	var in struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(instanceJSON, &in); err != nil || in.PID <= 0 {
		t.Fatalf("no pid in %s (%v)", instanceJSON, err)
	}
	return in.PID
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []local.Config{
		{StateDir: t.TempDir(), AddressRange: "10.0.0.0/8"},
		{StateDir: t.TempDir(), AddressRange: "127.1.2.0/30", MaxInstances: 5},
		{StateDir: t.TempDir(), Port: 70000},
		{StateDir: t.TempDir(), Name: "a/b"},
	} {
		if _, err := local.New(cfg).Init(context.Background(), slog.New(slog.DiscardHandler), fleeting.Settings{}); err == nil {
			t.Errorf("Init with %+v succeeded", cfg)
		}
	}
}

func FuzzConfig(f *testing.F) {
	f.Add([]byte(`{"state_dir":"/tmp/x","max_instances":3,"address_range":"127.5.0.0/24","netns":true,"netns_range":"10.1.0.0/20"}`))
	f.Add([]byte(`{"port":22,"shell":"/bin/bash"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var g local.Group
		if err := sdk.DecodeConfig(data, &g); err != nil {
			return
		}
		if len(g.ServerArgv) != 0 {
			t.Fatalf("plugin_config %q set the server command", data)
		}
		_ = g.Config.Validate()
	})
}

// TestDeleteKillsEverythingOnTheInstance: a process that left the SSH
// session's process group and session on an instance dies with the
// instance, as on a machine that is switched off.
func TestDeleteKillsEverythingOnTheInstance(t *testing.T) {
	ctx := context.Background()
	cfg := local.Config{StateDir: t.TempDir(), MaxInstances: 1}
	cleanup(t, cfg)
	g := initGroup(t, cfg)
	defer g.Shutdown(ctx)
	id := runningInstance(t, g)
	info, err := g.ConnectInfo(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := connector.Dial(ctx, info, connector.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := c.Run(ctx, connector.Command{Cmd: `setsid sh -c 'sleep 1000 </dev/null >/dev/null 2>&1 & echo $!' </dev/null`, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("pid %q: %v", out.String(), err)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatalf("the escaped process %d is not running", pid)
	}
	if _, err := g.Decrease(ctx, []string{id}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(states(t, g)) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("the instance was not deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Fatalf("process %d outlived its instance", pid)
	}
}

// TestHalfCreatedInstanceRemoved: a plugin process that died between
// starting an instance's server and saving its record (the runner manager
// and its plugin killed at that moment) leaves an instance no Update
// lists, so nobody would delete it; the next plugin process removes it,
// server included, at Init.
func TestHalfCreatedInstanceRemoved(t *testing.T) {
	ctx := context.Background()
	cfg := local.Config{StateDir: t.TempDir(), MaxInstances: 2}
	cleanup(t, cfg)
	g := initGroup(t, cfg)
	id := runningInstance(t, g)
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	dir := cfg.StateDir + "/instances/" + id
	record, err := os.ReadFile(dir + "/instance.json")
	if err != nil {
		t.Fatal(err)
	}
	pid := pidOf(t, record)
	os.Remove(dir + "/instance.json") // as if the plugin died before saving it

	g2 := initGroup(t, cfg)
	defer g2.Shutdown(ctx)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the half-created instance's directory is still there (%v)", err)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Errorf("the half-created instance's server %d still runs", pid)
	}
	if s := states(t, g2); len(s) != 0 {
		t.Errorf("instances after Init: %v, want none", s)
	}
	// The slot is free again.
	if n, err := g2.Increase(ctx, 2); n != 2 || err != nil {
		t.Errorf("Increase(2) after the removal = %d, %v", n, err)
	}
}
