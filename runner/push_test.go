package runner

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
	"google.golang.org/grpc/codes"
)

// withJobRouter turns the push channel on for an entry.
func withJobRouter(rc *config.Runner) {
	rc.FeatureFlags = map[string]bool{jobpush.FeatureFlag: true}
}

// fastRetries makes the push channel's retries quick for tests.
func fastRetries(o *Options) {
	o.JobRouter = JobRouterOptions{Retry: 20 * time.Millisecond, BreakerOpen: 200 * time.Millisecond,
		Rediscover: time.Hour, DialTimeout: 5 * time.Second, BreakerGrace: 50 * time.Millisecond}
}

// counter reads one of the manager's counters by name and labels.
func counter(t *testing.T, m *Manager, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := m.gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			total += mt.GetCounter().GetValue()
		}
	}
	return total
}

func pushSpec(name string) dispatch.JobSpec {
	return dispatch.JobSpec{Name: name, ProjectID: 1, Variables: []runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "none"}},
		Steps: script("echo ran-" + name)}
}

func TestPushJobsRunEndToEnd(t *testing.T) {
	e := newE2E(t)
	e.options = fastRetries
	m, _ := e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, withJobRouter, nil)
	waitFor(t, "the push stream", func() bool { return m.currentWorkers()[0].pushing() })
	// Nothing long-polls while the stream is up: the only waiter in the
	// queue is the stream (concurrent = 2, so room for two jobs).
	waitFor(t, "the stream to wait for a job", func() bool { return e.srv.Queue().Waiting() == 1 })
	var ids []int64
	for _, name := range []string{"one", "two", "three"} {
		ids = append(ids, e.enqueue(t, pushSpec(name)))
	}
	for i, id := range ids {
		j := e.waitDone(t, id)
		if tr := e.trace(t, id); j.Status != "success" || !strings.Contains(tr, "ran-") {
			t.Fatalf("job %d: %s\n%s", i, j.Status, tr)
		}
	}
	if got := counter(t, m, "berth_runner_push_jobs_total", map[string]string{"outcome": "admitted"}); got != 3 {
		t.Errorf("%v jobs admitted through the stream, want 3", got)
	}
	if got := counter(t, m, "berth_runner_job_requests_total", map[string]string{"outcome": "no_job"}); got != 0 {
		t.Errorf("%v long polls while pushing, want none", got)
	}
	// Each admit was the job's acknowledgement, answered on the stream.
	resp, err := http.Get(e.url + "/-/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if want := `berth_coordinator_push_jobs_total{outcome="acknowledged"} 3`; !strings.Contains(string(body), want) {
		t.Errorf("coordinator metrics lack %q", want)
	}
}

// pushProxy stands in front of a coordinator: it proxies everything but
// answers discovery and the push channel's path as told.
func pushProxy(t *testing.T, target string, discovery func(self string) (int, string), upgrade int) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	var self string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/"+jobpush.DiscoveryPath):
			code, body := discovery(self)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		case r.URL.Path == jobpush.Path && upgrade != 0:
			http.Error(w, "not here", upgrade)
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	self = hs.URL
	return hs.URL
}

func TestPushFallsBackToLongPolling(t *testing.T) {
	tests := []struct {
		name      string
		discovery func(self string) (int, string)
		upgrade   int
		reason    string
	}{
		{"discovery not served", func(string) (int, string) { return 404, `{"message":"404 Not Found"}` }, 0, "no_discovery"},
		{"discovery names nothing", func(string) (int, string) { return 200, `{"server_url":""}` }, 0, "no_discovery"},
		// A Job Router nothing answers at: its breaker trips.
		{"discovery names a plain gRPC router that is down", func(string) (int, string) { return 200, `{"server_url":"grpc://127.0.0.1:1"}` }, 0, "breaker_tripped"},
		{"discovery names another scheme", func(string) (int, string) { return 200, `{"server_url":"https://kas.example.com"}` }, 0, "no_discovery"},
		{"the channel's path answers 404", func(self string) (int, string) {
			u, _ := jobpush.ServerURL(self)
			return 200, `{"server_url":"` + u + `"}`
		}, http.StatusNotFound, "router_disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newE2E(t)
			e.options = fastRetries
			proxy := pushProxy(t, e.url, tt.discovery, tt.upgrade)
			m, _ := e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
				withJobRouter(rc)
				rc.URL = proxy
			}, nil)
			id := e.enqueue(t, pushSpec("polled"))
			if j := e.waitDone(t, id); j.Status != "success" {
				t.Fatalf("job: %s\n%s", j.Status, e.trace(t, id))
			}
			if got := counter(t, m, "berth_runner_push_fallbacks_total", map[string]string{"reason": tt.reason}); got < 1 {
				t.Errorf("no fallback with reason %s", tt.reason)
			}
			if m.currentWorkers()[0].pushing() {
				t.Error("the entry says it is pushing")
			}
			if got := counter(t, m, "berth_runner_push_jobs_total", nil); got != 0 {
				t.Errorf("%v jobs pushed, want none", got)
			}
		})
	}
}

// TestPushComesBackAfterTheCoordinatorReturns: the stream breaks when the
// coordinator stops; the runner long-polls (failing, as nothing answers),
// and pushes again once the coordinator is back on the same address.
func TestPushComesBackAfterTheCoordinatorReturns(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	open := func(ln net.Listener) *embedded.Coordinator {
		c, err := embedded.Open(ctx, embedded.Options{DataDir: dataDir, Listener: ln,
			Config: coordinator.Config{LongPollTimeout: 2 * time.Second, TraceUpdateInterval: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := open(ln)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Shutdown(context.Background())
		}
	})
	adminTok, err := c.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, srv: c.Server, admin: client.New(c.URL, adminTok), url: c.URL, options: fastRetries}
	m, _ := e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, withJobRouter, nil)
	waitFor(t, "the push stream", m.currentWorkers()[0].pushing)
	first := e.enqueue(t, pushSpec("before"))
	if j := e.waitDone(t, first); j.Status != "success" {
		t.Fatalf("first job: %s", j.Status)
	}

	stopped = true
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the runner to fall back", func() bool { return !m.currentWorkers()[0].pushing() })
	time.Sleep(300 * time.Millisecond) // a few failed tries: the breaker opens

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	c = open(ln)
	stopped = false
	e.srv = c.Server
	waitFor(t, "the push stream again", m.currentWorkers()[0].pushing)
	// A long poll of the fallback may still be held by the coordinator
	// when the stream is back, and take the next job: either way is one
	// hand-out. Once it returned the runner polls no more, so the job
	// after it comes through the stream.
	for _, name := range []string{"after", "again"} {
		j := e.enqueue(t, pushSpec(name))
		if done := e.waitDone(t, j); done.Status != "success" {
			t.Fatalf("job %s: %s\n%s", name, done.Status, e.trace(t, j))
		}
	}
	if got := counter(t, m, "berth_runner_push_jobs_total", map[string]string{"outcome": "admitted"}); got < 2 {
		t.Errorf("%v jobs admitted through the stream, want the first and the last at least", got)
	}
	if got := counter(t, m, "berth_runner_push_fallbacks_total", map[string]string{"reason": "stream_ended"}); got < 1 {
		t.Error("no fallback after the stream ended")
	}
}

// TestPushFullRunnerRejects: a job pushed to a runner without room (the
// room went to another entry after it was announced) is rejected and goes
// back to the queue.
// pushManager is a runner manager of one push entry named name on e's
// coordinator, with concurrent room and prov's executor, not started.
func pushManager(t *testing.T, e *e2e, name string, concurrent int, prov executor.Provider) *Manager {
	t.Helper()
	tok, err := e.admin.CreateRunner(context.Background(), restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rc := &config.Runner{Name: name, URL: e.url, Token: tok.Token, Executor: "shell",
		BuildsDir: filepath.Join(dir, "builds"), CacheDir: filepath.Join(dir, "cache")}
	withJobRouter(rc)
	cfg := &config.Config{Concurrent: concurrent, Runners: []*config.Runner{rc}}
	m, err := New(cfg, Options{NewProvider: func(*config.Runner) (executor.Provider, error) { return prov, nil },
		PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// openPush opens the push stream of m's first entry by hand, with the
// room it would announce, which it returns too.
func openPush(t *testing.T, e *e2e, m *Manager) (*jobpush.Stream, jobpush.Capacity) {
	t.Helper()
	w := m.currentWorkers()[0]
	w.push.mu.Lock()
	hello := jobpush.Hello{SystemID: m.systemID, Info: w.infoCopy(), Capacity: m.pushCapacity(w)}
	w.push.mu.Unlock()
	u, err := jobpush.ServerURL(e.url)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jobpush.Dial(context.Background(), u, w.creds().Token, jobpush.DialOptions{Hello: hello})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, hello.Capacity
}

func TestPushFullRunnerRejects(t *testing.T) {
	e := newE2E(t)
	m := pushManager(t, e, "full", 1, shell.New(shell.Config{}))
	w := m.currentWorkers()[0]
	s, announced := openPush(t, e, m)
	if announced.Free != 1 {
		t.Fatalf("announced %d, want 1", announced.Free)
	}
	if !m.room.tryTake() { // the room goes elsewhere
		t.Fatal("no room to take")
	}
	id := e.enqueue(t, pushSpec("bounced"))
	j, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if j.ID != id {
		t.Fatalf("pushed %d, want %d", j.ID, id)
	}
	m.admit(context.Background(), w, s, j, make(chan struct{}, 1))
	waitFor(t, "the job back in the queue", func() bool { return e.srv.Queue().Has(id) })
	if got := counter(t, m, "berth_runner_push_jobs_total", map[string]string{"outcome": "rejected"}); got != 1 {
		t.Errorf("%v rejects, want 1", got)
	}
	if free := m.room.free(); free != 0 {
		t.Errorf("the reject left %d of the room free, want 0 (the 1 taken before)", free)
	}
}

// headroomProvider is a shell provider whose executor reports a settable
// headroom, as an autoscaled one reports its fleet's.
type headroomProvider struct {
	executor.Provider
	headroom atomic.Int32
}

func (p *headroomProvider) Reserve(context.Context, string) error {
	if p.headroom.Load() == 0 {
		return executor.ErrNoCapacity
	}
	return nil
}
func (p *headroomProvider) Unreserve(string) {}
func (p *headroomProvider) Headroom() int    { return int(p.headroom.Load()) }

// TestPushAnnouncesTheFleetsHeadroom: a runner whose autoscaled executor
// could reserve capacity for fewer jobs than its concurrency allows
// announces that, so the coordinator pushes nothing it would reject; when
// the fleet grows, the runner announces the room within check_interval
// and gets the job.
func TestPushAnnouncesTheFleetsHeadroom(t *testing.T) {
	e := newE2E(t)
	prov := &headroomProvider{Provider: shell.New(shell.Config{})}
	m := pushManager(t, e, "fleet", 4, prov)
	w := m.currentWorkers()[0]
	capacity := func() uint32 {
		w.push.mu.Lock()
		defer w.push.mu.Unlock()
		return m.pushCapacity(w).Free
	}
	for _, c := range []struct {
		headroom int32
		want     uint32
	}{{-1, 4}, {2, 2}, {9, 4}, {0, 0}} {
		prov.headroom.Store(c.headroom)
		if got := capacity(); got != c.want {
			t.Errorf("headroom %d, concurrent 4: announces %d, want %d", c.headroom, got, c.want)
		}
	}
	s, announced := openPush(t, e, m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.announceRoom(ctx, w, s, announced, make(chan struct{}, 1))
	id := e.enqueue(t, pushSpec("waits-for-the-fleet"))
	time.Sleep(200 * time.Millisecond) // four check intervals with no headroom
	if !e.srv.Queue().Has(id) {
		t.Fatal("a job was pushed to a runner that announced no room")
	}
	prov.headroom.Store(1) // an instance became ready
	got := make(chan *jobpush.Job, 1)
	go func() {
		j, _ := s.Recv()
		got <- j
	}()
	select {
	case j := <-got:
		if j == nil || j.ID != id {
			t.Fatalf("pushed %+v, want job %d", j, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fleet's new headroom was not announced: nothing pushed within 10 s")
	}
}

func TestAcknowledgeOnTheStreamOrOnREST(t *testing.T) {
	f := newFake(t)
	h := newHarness(t, f, nil)
	w := h.m.currentWorkers()[0]
	tests := []struct {
		name      string
		streamAck func(context.Context) (jobpush.Ack, error)
		want      network.UpdateResult
		rest      bool // acknowledged on REST
	}{
		{"no stream acknowledgement", nil, network.UpdateResult{Code: 200, JobStatus: "running", State: network.StateOK, TraceUpdateInterval: time.Second}, true},
		{"recorded on the stream", func(context.Context) (jobpush.Ack, error) {
			return jobpush.Ack{Code: codes.OK, JobStatus: "running", TraceUpdateInterval: 4 * time.Second}, nil
		}, network.UpdateResult{Code: 200, JobStatus: "running", State: network.StateOK, TraceUpdateInterval: 4 * time.Second}, false},
		{"canceling, on the stream", func(context.Context) (jobpush.Ack, error) {
			return jobpush.Ack{Code: codes.OK, JobStatus: "canceling"}, nil
		}, network.UpdateResult{Code: 200, JobStatus: "canceling", State: network.StateCancel}, false},
		{"refused on the stream", func(context.Context) (jobpush.Ack, error) {
			return jobpush.Ack{Code: codes.FailedPrecondition, JobStatus: "canceled"}, nil
		}, network.UpdateResult{Code: 403, JobStatus: "canceled", State: network.StateAbort}, false},
		{"not recorded now: REST", func(context.Context) (jobpush.Ack, error) {
			return jobpush.Ack{Code: codes.Unavailable}, nil
		}, network.UpdateResult{Code: 200, JobStatus: "running", State: network.StateOK, TraceUpdateInterval: time.Second}, true},
		{"the stream ended first: REST", func(context.Context) (jobpush.Ack, error) {
			return jobpush.Ack{}, jobpush.ErrStreamEnded
		}, network.UpdateResult{Code: 200, JobStatus: "running", State: network.StateOK, TraceUpdateInterval: time.Second}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := &runnerapi.JobResponse{ID: int64(100 + i), Token: "glcbt-job" + strconv.Itoa(i)}
			f.add(job)
			r := newJobRun(h.m, w, job, 0)
			r.streamAck = tt.streamAck
			got, err := r.acknowledge(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("result %+v, want %+v", got, tt.want)
			}
			f.mu.Lock()
			puts := len(f.updates[job.ID])
			f.mu.Unlock()
			if rest := puts > 0; rest != tt.rest {
				t.Errorf("%d acknowledgements on REST, want REST %v", puts, tt.rest)
			}
		})
	}
	// The two admits the stream did not answer are counted.
	if got := counter(t, h.m, "berth_runner_push_jobs_total", map[string]string{"outcome": "ack_on_rest"}); got != 2 {
		t.Errorf("%v admits acknowledged on REST counted, want 2", got)
	}
}
