// Package otlptest receives OTLP trace exports in tests, over HTTP
// (protobuf) and gRPC, decoded with OpenTelemetry's own protocol types.
package otlptest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Sink collects the spans sent to it, by transport ("http", "grpc").
type Sink struct {
	coltrace.UnimplementedTraceServiceServer
	// HTTPURL is the OTLP/HTTP endpoint (path /custom/traces), GRPCURL
	// the OTLP/gRPC one (grpc://host:port).
	HTTPURL, GRPCURL string

	mu    sync.Mutex
	spans map[string][]*tracepb.Span
	paths []string
}

// New starts both receivers; they stop when t ends.
func New(t testing.TB) *Sink {
	t.Helper()
	s := &Sink{spans: map[string][]*tracepb.Span{}}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.paths = append(s.paths, r.URL.Path)
		s.mu.Unlock()
		s.add("http", &req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(hs.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(gs, s)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	s.HTTPURL, s.GRPCURL = hs.URL+"/custom/traces", "grpc://"+lis.Addr().String()
	return s
}

func (s *Sink) add(transport string, req *coltrace.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			s.spans[transport] = append(s.spans[transport], ss.GetSpans()...)
		}
	}
}

// Export implements the OTLP/gRPC trace service.
func (s *Sink) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	s.add("grpc", req)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// Spans are the spans received over transport so far.
func (s *Sink) Spans(transport string) []*tracepb.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.spans[transport])
}

// Paths are the URL paths OTLP/HTTP exports were posted to.
func (s *Sink) Paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths)
}
