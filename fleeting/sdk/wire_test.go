package sdk_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/internal/wiretest"
)

// TestServesHostWrittenFromReference drives an SDK plugin binary (fake) with a host
// that knows only the protocol description: it starts the binary with no
// arguments and the magic cookie, parses the handshake line, checks go-plugin's
// health service and calls /proto.InstanceGroup/* with messages built from the
// reference's wire table.
func TestServesHostWrittenFromReference(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-fake")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := wiretest.StartRaw(ctx, bin, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	parts := strings.Split(h.Handshake, "|")
	if len(parts) < 6 || parts[0] != "1" || parts[1] != "0" || parts[2] != "unix" || parts[4] != "grpc" {
		t.Fatalf("handshake line %q, want 1|0|unix|<socket>|grpc|", h.Handshake)
	}
	hc, err := healthpb.NewHealthClient(h.Conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "plugin"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v %v", hc, err)
	}

	cc := wiretest.New("ConnectorConfig")
	wiretest.Set(cc, "username", "ci")
	wiretest.Set(cc, "protocol", "ssh")
	wiretest.Set(cc, "keepalive", int64(30*time.Second))
	wiretest.Set(cc, "protocol_port", int64(2022))
	req := wiretest.New("InitRequest")
	wiretest.Set(req, "config", []byte(`{"name":"wire","max_size":3}`))
	wiretest.Set(req, "settings", wiretest.Set(wiretest.New("Settings"), "connector_config", cc))
	resp, err := h.Call(ctx, "Init", req, "InitResponse")
	if err != nil {
		t.Fatal(err)
	}
	if id, size := wiretest.Get(resp, "id"), wiretest.Get(resp, "max_size"); id != "fake/wire" || size != uint32(3) {
		t.Errorf("InitResponse id %v max_size %v, want fake/wire 3", id, size)
	}
	if v := wiretest.Get(resp, "version"); v != "dev" {
		t.Errorf("InitResponse version %v, want dev", v)
	}

	resp, err = h.Call(ctx, "Increase", wiretest.Set(wiretest.New("IncreaseRequest"), "n", uint32(2)), "IncreaseResponse")
	if err != nil || wiretest.Get(resp, "succeeded") != uint32(2) {
		t.Fatalf("Increase: %v %v", resp, err)
	}
	var ids []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		updates, err := h.Update(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = ids[:0]
		running := 0
		for _, u := range updates {
			ids = append(ids, wiretest.Get(u, "instance").(string))
			if wiretest.Get(u, "state") == protoreflect.EnumNumber(1) {
				running++
			}
		}
		if running == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances not running: %v", updates)
		}
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"wire-1", "wire-2"}) {
		t.Errorf("Update listed %v", ids)
	}

	resp, err = h.Call(ctx, "ConnectInfo", wiretest.Set(wiretest.New("ConnectInfoRequest"), "instance", "wire-1"), "ConnectInfoResponse")
	if err != nil {
		t.Fatal(err)
	}
	conn := wiretest.Get(resp, "connector").(*dynamicpb.Message)
	if wiretest.Get(conn, "username") != "ci" || wiretest.Get(conn, "keepalive") != int64(30*time.Second) ||
		wiretest.Get(conn, "protocol_port") != int64(2022) || wiretest.Get(resp, "InternalAddr") == "" || wiretest.Get(resp, "expires") != int64(0) {
		t.Errorf("ConnectInfoResponse %v", resp)
	}

	resp, err = h.Call(ctx, "Decrease", wiretest.Set(wiretest.New("DecreaseRequest"), "instances", []string{"wire-2", "nope"}), "DecreaseResponse")
	if err != nil || !slices.Equal(wiretest.Get(resp, "succeeded").([]string), []string{"wire-2"}) {
		t.Errorf("Decrease: %v %v", resp, err)
	}
	if _, err := h.Call(ctx, "Heartbeat", wiretest.Set(wiretest.New("HeartbeatRequest"), "instance", "wire-1"), "Empty"); err != nil {
		t.Errorf("Heartbeat: %v", err)
	}
	if _, err := h.Call(ctx, "Shutdown", wiretest.New("Empty"), "Empty"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
