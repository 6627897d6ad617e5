package transport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/pb"
	"github.com/berthci/berth/fleeting/internal/transport"
	"github.com/berthci/berth/fleeting/internal/wiretest"
)

// TestSchemaMatchesReference compares Berth's generated schema with the
// reference's wire table, written out independently in wiretest: same
// package, service, methods, messages, field names, numbers, types and
// cardinalities, and nothing more.
func TestSchemaMatchesReference(t *testing.T) {
	ours := pb.File_fleeting_proto
	if ours.Package() != "proto" {
		t.Fatalf("protobuf package %q, want proto", ours.Package())
	}
	svc := ours.Services().ByName("InstanceGroup")
	if svc == nil || string(svc.FullName()) != wiretest.Service {
		t.Fatalf("no service %s", wiretest.Service)
	}
	if svc.Methods().Len() != len(wiretest.Methods) {
		t.Errorf("service has %d methods, reference %d", svc.Methods().Len(), len(wiretest.Methods))
	}
	for _, m := range wiretest.Methods {
		md := svc.Methods().ByName(protoreflect.Name(m.Name))
		if md == nil {
			t.Errorf("method %s missing", m.Name)
			continue
		}
		if string(md.Input().Name()) != m.Input || string(md.Output().Name()) != m.Output ||
			md.IsStreamingServer() != m.ServerStreaming || md.IsStreamingClient() {
			t.Errorf("method %s: %s → %s (server streaming %v), want %s → %s (%v)", m.Name,
				md.Input().Name(), md.Output().Name(), md.IsStreamingServer(), m.Input, m.Output, m.ServerStreaming)
		}
		if string(md.Input().ParentFile().Package()) != "proto" {
			t.Errorf("method %s input is not in package proto (google.protobuf.Empty is not the reference's Empty)", m.Name)
		}
	}
	for name, fields := range wiretest.Messages {
		md := ours.Messages().ByName(protoreflect.Name(name))
		if md == nil {
			t.Errorf("message %s missing", name)
			continue
		}
		if md.Fields().Len() != len(fields) {
			t.Errorf("message %s has %d fields, reference %d", name, md.Fields().Len(), len(fields))
		}
		for _, f := range fields {
			fd := md.Fields().ByNumber(protoreflect.FieldNumber(f.Number))
			if fd == nil {
				t.Errorf("%s: no field number %d (%s)", name, f.Number, f.Name)
				continue
			}
			if string(fd.Name()) != f.Name || fd.Kind() != f.Kind || fd.IsList() != f.Repeated {
				t.Errorf("%s field %d: %s %v list=%v, want %s %v list=%v", name, f.Number, fd.Name(), fd.Kind(), fd.IsList(), f.Name, f.Kind, f.Repeated)
			}
			switch f.Kind {
			case protoreflect.MessageKind:
				if string(fd.Message().Name()) != f.Message {
					t.Errorf("%s.%s is a %s, want %s", name, f.Name, fd.Message().Name(), f.Message)
				}
			case protoreflect.EnumKind:
				vals := fd.Enum().Values()
				if vals.Len() != len(wiretest.StateValues) {
					t.Errorf("%s.%s enum has %d values, want %d", name, f.Name, vals.Len(), len(wiretest.StateValues))
				}
				for i, v := range wiretest.StateValues {
					if ev := vals.ByNumber(protoreflect.EnumNumber(i)); ev == nil || string(ev.Name()) != v {
						t.Errorf("%s.%s enum value %d is not %s", name, f.Name, i, v)
					}
				}
			}
		}
	}
	if len(wiretest.Messages) != ours.Messages().Len() {
		t.Errorf("schema has %d messages, reference %d", ours.Messages().Len(), len(wiretest.Messages))
	}
	if transport.MagicCookieKey != wiretest.CookieKey || transport.MagicCookieValue != wiretest.CookieValue ||
		transport.ProtocolVersion != 0 || transport.PluginName != "instancegroup" {
		t.Errorf("handshake differs from the reference")
	}
}

// scripted is an InstanceGroup whose methods fail with a given error.
type scripted struct {
	fleeting.InstanceGroup
	err error
}

func (s scripted) Heartbeat(context.Context, string) error { return s.err }
func (s scripted) Increase(context.Context, int) (int, error) {
	return 0, s.err
}

func connect(t *testing.T, impl fleeting.InstanceGroup) *transport.Client {
	t.Helper()
	l := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	pb.RegisterInstanceGroupServer(s, &transport.Server{Impl: impl, Logger: slog.New(slog.DiscardHandler)})
	go s.Serve(l)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///buf",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return transport.NewClient(conn, nil)
}

// TestErrorClassesCrossTheWire checks that the contract's sentinel errors
// survive the trip through gRPC.
func TestErrorClassesCrossTheWire(t *testing.T) {
	for _, sentinel := range []error{fleeting.ErrInstanceNotFound, fleeting.ErrInstanceUnhealthy, fleeting.ErrQuotaExceeded, fleeting.ErrNotInitialized} {
		c := connect(t, scripted{err: fmt.Errorf("instance i-9: %w", sentinel)})
		err := c.Heartbeat(context.Background(), "i-9")
		if !errors.Is(err, sentinel) {
			t.Errorf("Heartbeat error %v does not wrap %v", err, sentinel)
		}
		if err == nil || err.Error() != "instance i-9: "+sentinel.Error() {
			t.Errorf("Heartbeat error reads %q, want the plugin's message", err)
		}
	}
	c := connect(t, scripted{err: errors.New("cloud said no")})
	if _, err := c.Increase(context.Background(), 1); err == nil || err.Error() != "cloud said no" {
		t.Errorf("Increase error = %v, want the plugin's message", err)
	}
}

func TestDecodeConfig(t *testing.T) {
	type cfg struct {
		Region string `json:"region"`
		Max    int    `json:"max"`
	}
	for _, tc := range []struct {
		in   string
		want cfg
		bad  bool
	}{
		{in: `{"region":"eu","max":3}`, want: cfg{"eu", 3}},
		{in: ``, want: cfg{}},
		{in: `null`, want: cfg{}},
		{in: ` {} `, want: cfg{}},
		{in: `{"regoin":"eu"}`, bad: true},
		{in: `[1]`, bad: true},
		{in: `{"region":"eu"} {}`, bad: true},
		{in: `{"max":"3"}`, bad: true},
	} {
		var got cfg
		err := transport.DecodeConfig([]byte(tc.in), &got)
		if tc.bad != (err != nil) || (!tc.bad && got != tc.want) {
			t.Errorf("DecodeConfig(%s) = %+v, %v", tc.in, got, err)
		}
	}
}

func FuzzDecodeConfig(f *testing.F) {
	type nested struct {
		A []string       `json:"a"`
		M map[string]int `json:"m"`
	}
	type cfg struct {
		Name   string  `json:"name"`
		N      int     `json:"n"`
		F      float64 `json:"f"`
		Nested *nested `json:"nested"`
	}
	f.Add([]byte(`{"name":"x","n":1,"f":0.5,"nested":{"a":["b"],"m":{"k":1}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c cfg
		if err := transport.DecodeConfig(data, &c); err != nil {
			return
		}
		// Whatever decodes was a single JSON object (or empty).
		var again cfg
		if err := transport.DecodeConfig(data, &again); err != nil {
			t.Fatalf("second decode of %q failed: %v", data, err)
		}
	})
}
