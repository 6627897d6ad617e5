package jobpush

import (
	"testing"

	"github.com/berthci/berth/jobpush/internal/pb"
)

// FuzzParseDiscovery: a discovery answer is outside input to the runner.
func FuzzParseDiscovery(f *testing.F) {
	f.Add([]byte(`{"server_url":"wss://ci.example.com/api/v4/berth/job-router"}`))
	f.Add([]byte(`{"server_url":"grpc://kas"}`))
	f.Add([]byte(`{"server_url":null}`))
	f.Add([]byte(`{"server_url":"ws://[::1]:80"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseDiscovery(b)
		if err != nil {
			return
		}
		switch u.Scheme {
		case "ws", "wss", "grpc", "grpcs":
		default:
			t.Fatalf("accepted %q with scheme %q", b, u.Scheme)
		}
		if u.Host == "" || u.User != nil {
			t.Fatalf("accepted %q as %v", b, u)
		}
	})
}

// FuzzHello: a Hello's system_id and info are outside input to the
// coordinator.
func FuzzHello(f *testing.F) {
	f.Add("s_0123456789ab", []byte(`{"name":"berth","features":{"trace_reset":true},"isolation_levels":["none","vm"]}`))
	f.Add("", []byte(nil))
	f.Add("a\x00b", []byte(`null`))
	f.Add("x", []byte(`{"isolation_levels":"none"}`))
	f.Fuzz(func(t *testing.T, systemID string, info []byte) {
		h, err := helloFromPB(&pb.Hello{SystemId: systemID, Info: info})
		if err != nil {
			return
		}
		if len(h.SystemID) > MaxSystemID || len(info) > MaxInfo {
			t.Fatalf("accepted system_id %q with %d bytes of info", systemID, len(info))
		}
		if CheckSystemID(h.SystemID) != nil {
			t.Fatalf("accepted system_id %q", h.SystemID)
		}
	})
}
