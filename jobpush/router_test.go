package jobpush

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush/internal/pb"
)

// kasStandIn is a plain gRPC Job Router, as GitLab's KAS serves it at a
// grpc:// URL: GetJob only.
type kasStandIn struct {
	pb.UnimplementedJobRouterServer
	seen chan metadata.MD
	job  []byte
	err  error
}

func (k *kasStandIn) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	job, err := k.job, k.err // read before the test goes on
	k.seen <- md
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(req.GetJobRequest()), `"token":"glrt-good"`) {
		return nil, status.Error(codes.InvalidArgument, "unexpected body "+string(req.GetJobRequest()))
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(lastUpdateKey, "v7"))
	return &pb.GetJobResponse{JobResponse: job}, nil
}

func serveKAS(t *testing.T, k *kasStandIn) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterJobRouterServer(gs, k)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return "grpc://" + lis.Addr().String()
}

func TestRouterClientPlainGRPC(t *testing.T) {
	k := &kasStandIn{seen: make(chan metadata.MD, 10), job: []byte(`{"id":1}`)}
	u := serveKAS(t, k)
	c, err := DialRouter(u, "glrt-good", DialOptions{Header: http.Header{"User-Agent": {"berth-test/1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job, last, err := c.GetJob(ctx, []byte(`{"token":"glrt-good"}`), "req-9")
	if err != nil || string(job) != `{"id":1}` || last != "v7" {
		t.Fatalf("GetJob: %s %q %v", job, last, err)
	}
	md := <-k.seen
	for key, want := range map[string]string{"authorization": "Bearer glrt-good", "gitlab-agent-type": "runner", "x-request-id": "req-9"} {
		if got := md.Get(key); len(got) != 1 || got[0] != want {
			t.Errorf("metadata %s = %q, want %q", key, got, want)
		}
	}
	if ua := md.Get("user-agent"); len(ua) != 1 || !strings.HasPrefix(ua[0], "berth-test/1") {
		t.Errorf("user-agent %q", ua)
	}

	// No job: empty bytes.
	k.job = nil
	if job, _, err := c.GetJob(ctx, []byte(`{"token":"glrt-good"}`), ""); err != nil || job != nil {
		t.Errorf("no job: %s %v", job, err)
	}
	<-k.seen
	// GitLab's "router disabled" is Unimplemented: ErrNotServed.
	k.err = status.Error(codes.Unimplemented, "job router disabled")
	if _, _, err := c.GetJob(ctx, []byte(`{}`), ""); !errors.Is(err, ErrNotServed) {
		t.Errorf("Unimplemented: %v, want ErrNotServed", err)
	}
	<-k.seen
	k.err = status.Error(codes.Unauthenticated, "bad token")
	if _, _, err := c.GetJob(ctx, []byte(`{}`), ""); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Unauthenticated: %v, want ErrUnauthenticated", err)
	}
}

// A ws(s) router whose upgrade is refused: the handshake's status decides
// (gRPC alone would say Unavailable for both).
func TestRouterClientTunnelRefused(t *testing.T) {
	for code, want := range map[int]error{http.StatusNotFound: ErrNotServed, http.StatusForbidden: ErrUnauthenticated} {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no", code)
		}))
		c, err := DialRouter("ws"+strings.TrimPrefix(hs.URL, "http")+Path, "glrt-x", DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _, err = c.GetJob(ctx, []byte(`{}`), "")
		cancel()
		c.Close()
		hs.Close()
		if !errors.Is(err, want) {
			t.Errorf("upgrade answered %d: %v, want %v", code, err, want)
		}
	}
	for _, bad := range []string{"https://kas", "grpc://", "::"} {
		if _, err := DialRouter(bad, "t", DialOptions{}); err == nil {
			t.Errorf("DialRouter(%q) accepted", bad)
		}
	}
}
