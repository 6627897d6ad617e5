package runner

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// getJobMethod is GitLab's Job Router call (gitlab-agent's
// internal/module/job_router/rpc/rpc.proto).
const getJobMethod = "/gitlab.agent.job_router.rpc.JobRouter/GetJob"

// kas stands in for GitLab's KAS serving the Job Router on plain gRPC: it
// relays each GetJob's body to the coordinator's POST /jobs/request, as
// KAS relays it to GitLab. It is written against the wire, not Berth's
// generated code: GetJobRequest and GetJobResponse are each one bytes
// field numbered 1, as is protobuf's BytesValue.
type kas struct {
	t        *testing.T
	api      string // the coordinator's URL
	disabled atomic.Bool

	mu    sync.Mutex
	calls []metadata.MD
}

func (k *kas) handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	if method != getJobMethod {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	k.mu.Lock()
	k.calls = append(k.calls, md)
	k.mu.Unlock()
	if k.disabled.Load() {
		return status.Error(codes.Unimplemented, "job router is disabled")
	}
	var req wrapperspb.BytesValue
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(stream.Context(), "POST", k.api+"/api/v4/jobs/request", bytes.NewReader(req.GetValue()))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if lu := resp.Header.Get(runnerapi.HeaderLastUpdate); lu != "" {
		_ = stream.SetHeader(metadata.Pairs("x-gitlab-last-update", lu))
	}
	switch resp.StatusCode {
	case http.StatusCreated:
	case http.StatusNoContent:
		body = nil
	case http.StatusForbidden:
		return status.Error(codes.Unauthenticated, "403 Forbidden")
	default:
		return status.Errorf(codes.Internal, "jobs/request: %d", resp.StatusCode)
	}
	return stream.SendMsg(&wrapperspb.BytesValue{Value: body})
}

func (k *kas) seen() []metadata.MD {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]metadata.MD(nil), k.calls...)
}

// serveKAS starts a KAS stand-in relaying to api and returns its grpc://
// URL.
func serveKAS(t *testing.T, api string) (*kas, string) {
	t.Helper()
	k := &kas{t: t, api: api}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnknownServiceHandler(k.handle))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return k, "grpc://" + lis.Addr().String()
}

// restCounter proxies a coordinator, answers discovery with router, and
// counts the job requests that reach it over REST.
func restCounter(t *testing.T, target, router string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	var rest atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/"+jobpush.DiscoveryPath):
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"server_url":"` + router + `"}`))
			return
		case strings.HasSuffix(r.URL.Path, "/jobs/request"):
			rest.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs.URL, &rest
}

// routing reports whether w pulls through a Job Router now.
func (w *worker) routing() bool {
	rc, done := w.routerOf()
	if rc != nil {
		done()
	}
	return rc != nil
}

// TestJobRouterPull: discovery names GitLab's Job Router on plain gRPC;
// the runner sends every job request through its GetJob, as GitLab's
// runner does, with the token as Bearer and gitlab-agent-type: runner,
// and none to POST /jobs/request.
func TestJobRouterPull(t *testing.T) {
	e := newE2E(t)
	e.options = fastRetries
	k, router := serveKAS(t, e.url)
	proxy, rest := restCounter(t, e.url, router)
	m, tok := e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
		withJobRouter(rc)
		rc.URL = proxy
	}, nil)
	waitFor(t, "routing", func() bool { return m.currentWorkers()[0].routing() })
	var ids []int64
	for _, name := range []string{"one", "two", "three"} {
		ids = append(ids, e.enqueue(t, pushSpec(name)))
	}
	for i, id := range ids {
		if j := e.waitDone(t, id); j.Status != "success" || !strings.Contains(e.trace(t, id), "ran-") {
			t.Fatalf("job %d: %s\n%s", i, j.Status, e.trace(t, id))
		}
	}
	if n := rest.Load(); n != 0 {
		t.Errorf("%d job requests over REST while routing, want none", n)
	}
	calls := k.seen()
	if len(calls) < 3 {
		t.Fatalf("%d GetJob calls, want at least 3", len(calls))
	}
	for key, want := range map[string]string{"authorization": "Bearer " + tok, "gitlab-agent-type": "runner"} {
		if got := calls[0].Get(key); len(got) != 1 || got[0] != want {
			t.Errorf("metadata %s = %q, want %q", key, got, want)
		}
	}
	if id := calls[0].Get("x-request-id"); len(id) != 1 || id[0] == "" {
		t.Errorf("x-request-id %q", id)
	}
	if got := counter(t, m, "berth_runner_push_fallbacks_total", nil); got != 0 {
		t.Errorf("%v fallbacks, want none", got)
	}
}

// TestJobRouterDisabled: a router that answers Unimplemented (GitLab's
// way to turn it off) sends the runner back to REST for that request on:
// the job runs, and the fallback is router_disabled.
func TestJobRouterDisabled(t *testing.T) {
	e := newE2E(t)
	e.options = fastRetries
	k, router := serveKAS(t, e.url)
	k.disabled.Store(true)
	proxy, rest := restCounter(t, e.url, router)
	m, _ := e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
		withJobRouter(rc)
		rc.URL = proxy
	}, nil)
	id := e.enqueue(t, pushSpec("after the router"))
	if j := e.waitDone(t, id); j.Status != "success" {
		t.Fatalf("job: %s\n%s", j.Status, e.trace(t, id))
	}
	if got := counter(t, m, "berth_runner_push_fallbacks_total", map[string]string{"reason": "router_disabled"}); got < 1 {
		t.Error("no router_disabled fallback")
	}
	if rest.Load() == 0 || len(k.seen()) == 0 {
		t.Errorf("%d REST requests, %d router calls; want both", rest.Load(), len(k.seen()))
	}
	if m.currentWorkers()[0].routing() {
		t.Error("still routing through a disabled router")
	}
}

// The router's breaker trips on BreakerFailures transport failures in a
// row that last at least the grace, and at once on a trial's failure.
func TestJobRouterBreaker(t *testing.T) {
	w := &worker{push: newPushState()}
	if w.routerFailed(0) || w.routerFailed(0) {
		t.Fatal("tripped before three failures")
	}
	if !w.routerFailed(0) {
		t.Fatal("three failures did not trip it")
	}
	w.routerAnswered()
	for i := 0; i < 5; i++ {
		if w.routerFailed(time.Hour) {
			t.Fatalf("failure %d tripped it within the grace", i+1)
		}
	}
	w.push.breaker = routerBreaker{trial: true}
	if !w.routerFailed(time.Hour) {
		t.Error("a failed trial did not trip it")
	}
	w.routerAnswered()
	if w.routerFailed(time.Hour) {
		t.Error("an answer did not reset it")
	}
}
