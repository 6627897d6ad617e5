package static_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/plugins/static"
	"github.com/berthci/berth/fleeting/sdk"
)

func hosts() []static.Host {
	return []static.Host{
		{ID: "a", Address: "192.0.2.1:22"},
		{ID: "b", Address: "192.0.2.2", ExternalAddress: "198.51.100.2", Username: "ci"},
		{Address: "192.0.2.3:2222"},
	}
}

func TestConformance(t *testing.T) {
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return static.New(static.Config{Hosts: hosts()})
	})
}

func TestStatePersists(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state.json")
	cfg := static.Config{Hosts: hosts(), StateFile: state}
	g := static.New(cfg)
	if _, err := g.Init(ctx, slog.New(slog.DiscardHandler), fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Increase(ctx, 2); n != 2 || err != nil {
		t.Fatalf("Increase = %d, %v", n, err)
	}
	if got, err := g.Decrease(ctx, []string{"a"}); err != nil || len(got) != 1 {
		t.Fatalf("Decrease = %v, %v", got, err)
	}
	// A restarted plugin sees "b" still handed out.
	g2 := static.New(cfg)
	if _, err := g2.Init(ctx, slog.New(slog.DiscardHandler), fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	g2.Update(ctx, func(id string, _ fleeting.State) { ids = append(ids, id) })
	if len(ids) != 1 || ids[0] != "b" {
		t.Fatalf("after restart Update lists %v, want [b]", ids)
	}
	// The next hand-out is the first free host, "a".
	if n, _ := g2.Increase(ctx, 1); n != 1 {
		t.Fatalf("Increase = %d", n)
	}
	ids = nil
	g2.Update(ctx, func(id string, _ fleeting.State) { ids = append(ids, id) })
	if len(ids) != 2 || ids[1] != "a" {
		t.Fatalf("Update lists %v, want [b a]", ids)
	}
}

func TestConnectInfoMergesSettings(t *testing.T) {
	ctx := context.Background()
	g := static.New(static.Config{Hosts: hosts()})
	settings := fleeting.Settings{ConnectorConfig: fleeting.ConnectorConfig{Username: "root", Password: "pw", OS: "linux"}}
	if _, err := g.Init(ctx, slog.New(slog.DiscardHandler), settings); err != nil {
		t.Fatal(err)
	}
	info, err := g.ConnectInfo(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if info.Username != "ci" || info.Password != "pw" || info.OS != "linux" || info.Protocol != fleeting.ProtocolSSH ||
		info.InternalAddr != "192.0.2.2" || info.ExternalAddr != "198.51.100.2" {
		t.Fatalf("ConnectInfo(b) = %+v", info)
	}
	if info, _ := g.ConnectInfo(ctx, "192.0.2.3:2222"); info.Username != "root" {
		t.Fatalf("host without id: ConnectInfo = %+v", info)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []static.Config{
		{},
		{Hosts: []static.Host{{ID: "a"}}},
		{Hosts: []static.Host{{ID: "a", Address: "x"}, {ID: "a", Address: "y"}}},
		{Hosts: []static.Host{{Address: "x", KeyPath: "/nonexistent/key"}}},
	} {
		if _, err := static.New(cfg).Init(context.Background(), slog.New(slog.DiscardHandler), fleeting.Settings{}); err == nil {
			t.Errorf("Init with %+v succeeded", cfg)
		}
	}
}

func FuzzConfig(f *testing.F) {
	f.Add([]byte(`{"hosts": [{"id": "a", "address": "10.0.0.1:22", "username": "u"}], "state_file": "/x"}`))
	f.Add([]byte(`{"hosts": []}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var g static.Group
		if err := sdk.DecodeConfig(data, &g); err != nil {
			return
		}
		_ = g.Config.Validate()
	})
}
