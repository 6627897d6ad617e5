package local_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/connector"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
)

// TestNetworkNamespace gives an instance its own network namespace and IP
// and checks it is reachable there, sees only its own interfaces, and that
// deleting it removes the namespace.
func TestNetworkNamespace(t *testing.T) {
	testenv.Root(t)
	testenv.LookPath(t, "ip")
	ctx := context.Background()
	cfg := local.Config{StateDir: t.TempDir(), MaxInstances: 2, NetNS: true, NetNSRange: "10.213.240.0/24"}
	cleanup(t, cfg)
	g := local.New(cfg)
	if _, err := g.Init(ctx, fleetingtest.TestLogger(t), fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(ctx)
	id := runningInstance(t, g)
	info, err := g.ConnectInfo(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := netip.ParseAddrPort(info.InternalAddr)
	if err != nil || !netip.MustParsePrefix("10.213.240.0/24").Contains(ap.Addr()) || ap.Port() != 22 {
		t.Fatalf("instance address %q, want 10.213.240.x:22", info.InternalAddr)
	}
	info.Keepalive = 100 * time.Millisecond
	c, err := connector.Dial(ctx, info, connector.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out bytes.Buffer
	if err := c.Run(ctx, connector.Command{Cmd: "ip -o -4 addr show", Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out.Bytes(), []byte(ap.Addr().String()+"/30")) {
		t.Fatalf("inside the namespace: %s; want the instance's own %s/30", out.String(), ap.Addr())
	}
	entries, _ := os.ReadDir("/run/netns")
	var before []string
	for _, e := range entries {
		before = append(before, e.Name())
	}
	if _, err := g.Decrease(ctx, []string{id}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); len(states(t, g)) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("instance not deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The connection notices the instance is gone.
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("connection to a deleted instance stays up")
	}
	for _, name := range before {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); os.IsNotExist(err) {
			return // the instance's namespace went away
		}
	}
	t.Fatalf("no network namespace was removed (had %v)", before)
}
