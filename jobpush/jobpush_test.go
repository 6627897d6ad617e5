package jobpush

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berthci/berth/runnerapi"
)

// fakeSource hands out the jobs put into its channel and records what
// became of them.
type fakeSource struct {
	token string
	jobs  chan int64

	mu       sync.Mutex
	hellos   []Hello
	admitted []int64
	released []int64
	waiting  int
	// acked are the jobs acknowledged by their admit; ack, when set,
	// answers them (it may block), else OK.
	acked []int64
	ack   func(id int64) Ack
}

func newFakeSource() *fakeSource {
	return &fakeSource{token: "glrt-good", jobs: make(chan int64, 100)}
}

func (f *fakeSource) Open(_ context.Context, token string, h Hello) (Session, error) {
	if token != f.token {
		return nil, ErrUnauthenticated
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, h)
	f.mu.Unlock()
	return &fakeSession{f: f}, nil
}

type fakeSession struct{ f *fakeSource }

func (s *fakeSession) Next(ctx context.Context) (*Job, error) {
	s.f.mu.Lock()
	s.f.waiting++
	s.f.mu.Unlock()
	defer func() {
		s.f.mu.Lock()
		s.f.waiting--
		s.f.mu.Unlock()
	}()
	select {
	case id := <-s.f.jobs:
		return &Job{ID: id, Payload: []byte(`{"id":` + itoa(id) + `}`)}, nil
	case <-ctx.Done():
		return nil, nil
	}
}

func (s *fakeSession) Admitted(id int64) {
	s.f.mu.Lock()
	s.f.admitted = append(s.f.admitted, id)
	s.f.mu.Unlock()
}

func (s *fakeSession) Acknowledge(_ context.Context, id int64) Ack {
	s.f.mu.Lock()
	s.f.acked = append(s.f.acked, id)
	f := s.f.ack
	s.f.mu.Unlock()
	if f != nil {
		return f(id)
	}
	return Ack{Code: codes.OK, JobStatus: "running", TraceUpdateInterval: 3 * time.Second}
}

func (s *fakeSession) Release(_ context.Context, id int64) error {
	s.f.mu.Lock()
	s.f.released = append(s.f.released, id)
	s.f.mu.Unlock()
	// As the coordinator's queue: a released job can be handed out again.
	s.f.jobs <- id
	return nil
}

func (s *fakeSession) Close() {}

func (f *fakeSource) snapshot() (admitted, released []int64, waiting int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64{}, f.admitted...), append([]int64{}, f.released...), f.waiting
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// serve serves src's push channel on a test server and returns its ws://
// URL.
func serve(t *testing.T, src Source) string {
	t.Helper()
	u, _ := serveWith(t, src)
	return u
}

func serveWith(t *testing.T, src Source) (string, *Server) {
	t.Helper()
	s := NewServer(src, ServerOptions{HelloTimeout: 2 * time.Second})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		s.Upgrade(w, r)
	}))
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	u, err := ServerURL(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u, s
}

func dial(t *testing.T, url, token string, free uint32) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Dial(ctx, url, token, DialOptions{Hello: Hello{SystemID: "s_test", Info: &runnerapi.Info{Name: "berth", IsolationLevels: []string{"none"}}, Capacity: Capacity{Free: free}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// recv reads the next job, failing after a while.
func recv(t *testing.T, s *Stream) *Job {
	t.Helper()
	got := make(chan *Job, 1)
	errc := make(chan error, 1)
	go func() {
		j, err := s.Recv()
		if err != nil {
			errc <- err
			return
		}
		got <- j
	}()
	select {
	case j := <-got:
		return j
	case err := <-errc:
		t.Fatalf("recv: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no job pushed within 30 s")
	}
	return nil
}

// nothingPushed checks that no job comes within d.
func nothingPushed(t *testing.T, s *Stream, f *fakeSource, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	if _, _, waiting := f.snapshot(); waiting != 0 {
		t.Fatalf("the server waits for a job for a runner without room")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPushRespectsCapacity(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	s := dial(t, url, f.token, 0)
	f.mu.Lock()
	if len(f.hellos) != 1 || f.hellos[0].SystemID != "s_test" || f.hellos[0].Info == nil || f.hellos[0].Info.IsolationLevels[0] != "none" {
		t.Fatalf("hello as the source saw it: %+v", f.hellos)
	}
	f.mu.Unlock()
	f.jobs <- 1
	nothingPushed(t, s, f, 100*time.Millisecond)

	// Room for two: two jobs come, the third waits.
	if err := s.Announce(Capacity{Free: 2}); err != nil {
		t.Fatal(err)
	}
	f.jobs <- 2
	f.jobs <- 3
	if j := recv(t, s); j.ID != 1 || string(j.Payload) != `{"id":1}` {
		t.Fatalf("first job %d %q", j.ID, j.Payload)
	}
	if j := recv(t, s); j.ID != 2 {
		t.Fatalf("second job %d", j.ID)
	}
	nothingPushed(t, s, f, 100*time.Millisecond)
	if _, err := s.Admit(1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two admits", func() bool { a, _, _ := f.snapshot(); return len(a) == 2 })

	// An announcement that predates a push (seen 1 of 2 jobs) does not
	// count the room that push took: free 1 - (2 - 1) = 0.
	if err := s.Announce(Capacity{Free: 1, Seen: 1}); err != nil {
		t.Fatal(err)
	}
	nothingPushed(t, s, f, 100*time.Millisecond)
	if err := s.Announce(Capacity{Free: 1, Seen: 2}); err != nil {
		t.Fatal(err)
	}
	if j := recv(t, s); j.ID != 3 {
		t.Fatalf("third job %d", j.ID)
	}
}

func TestPushRejectReleasesAndStops(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	s := dial(t, url, f.token, 5)
	f.jobs <- 7
	j := recv(t, s)
	if err := s.Reject(j.ID, codes.ResourceExhausted, "full"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the release", func() bool { _, r, _ := f.snapshot(); return len(r) == 1 && r[0] == 7 })
	// The released job is back in the source, but a runner that said it
	// is full gets nothing until it announces room again.
	nothingPushed(t, s, f, 100*time.Millisecond)
	if err := s.Announce(Capacity{Free: 1, Seen: 1}); err != nil {
		t.Fatal(err)
	}
	if j := recv(t, s); j.ID != 7 {
		t.Fatalf("job after the announcement %d, want 7 again", j.ID)
	}
}

func TestPushReleasesUnansweredJobsWhenTheStreamEnds(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	s := dial(t, url, f.token, 2)
	f.jobs <- 4
	f.jobs <- 5
	recv(t, s)
	recv(t, s)
	if _, err := s.Admit(4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the admit", func() bool { a, _, _ := f.snapshot(); return len(a) == 1 })
	s.Close()
	waitFor(t, "the release of job 5", func() bool { _, r, _ := f.snapshot(); return len(r) == 1 && r[0] == 5 })
	if a, _, _ := f.snapshot(); len(a) != 1 || a[0] != 4 {
		t.Fatalf("admitted %v", a)
	}
}

func TestPushRefusesABadToken(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	_, err := Dial(context.Background(), url, "glrt-wrong", DialOptions{Hello: Hello{SystemID: "s"}})
	if !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("dial with a wrong token: %v, want ErrUnauthenticated", err)
	}
}

func TestDialNotServed(t *testing.T) {
	hs := httptest.NewServer(http.NotFoundHandler())
	defer hs.Close()
	u, _ := ServerURL(hs.URL)
	_, err := Dial(context.Background(), u, "glrt-x", DialOptions{})
	var he *HandshakeError
	if !errors.Is(err, ErrNotServed) || !errors.As(err, &he) || he.StatusCode != 404 {
		t.Fatalf("dial of a 404: %v, want ErrNotServed", err)
	}
}

func TestServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://ci.example.com":           "ws://ci.example.com/api/v4/berth/job-router",
		"https://ci.example.com:8443/":    "wss://ci.example.com:8443/api/v4/berth/job-router",
		"https://example.com/gitlab?x=1#": "wss://example.com/gitlab/api/v4/berth/job-router",
	} {
		got, err := ServerURL(in)
		if err != nil || got != want {
			t.Errorf("ServerURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ServerURL("ftp://x"); err == nil {
		t.Error("ftp external URL accepted")
	}
}

func TestParseDiscovery(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"server_url":"wss://kas.example.com/api/v4/berth/job-router"}`: true,
		`{"server_url":"ws://127.0.0.1:8080/x"}`:                         true,
		`{"server_url":""}`:                                              false,
		`{}`:                                                             false,
		`{"server_url":null}`:                                            false,
		`{"server_url":"grpcs://kas.gitlab.com"}`:                        true,
		`{"server_url":"grpc://127.0.0.1:8150"}`:                         true,
		`{"server_url":"https://kas.gitlab.com"}`:                        false,
		`{"server_url":"wss://user:pw@h/x"}`:                             false,
		`{"server_url":"wss:///nohost"}`:                                 false,
		`[`:                                                              false,
	} {
		u, err := ParseDiscovery([]byte(body))
		if ok != (err == nil) {
			t.Errorf("%s: %v, %v", body, u, err)
		}
		if !ok && strings.HasPrefix(body, `{`) && !errors.Is(err, ErrNoServer) {
			t.Errorf("%s: %v, want ErrNoServer", body, err)
		}
	}
}

func TestServerCloseReleasesUnansweredJobs(t *testing.T) {
	f := newFakeSource()
	url, srv := serveWith(t, f)
	s := dial(t, url, f.token, 1)
	f.jobs <- 9
	recv(t, s)
	srv.Close() // returns once the streams' handlers are done
	if _, r, _ := f.snapshot(); len(r) != 1 || r[0] != 9 {
		t.Fatalf("released %v when the server closed, want [9]", r)
	}
	if _, err := s.Recv(); err == nil {
		t.Fatal("the stream outlived the server")
	}
}

func TestPushNeedsAHelloFirst(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	_, err := Dial(context.Background(), url, f.token, DialOptions{Hello: Hello{SystemID: strings.Repeat("x", MaxSystemID+1)}})
	if err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("dial with a bad hello: %v, want InvalidArgument", err)
	}
}

// dialAcking opens a stream whose admits acknowledge and reads it in the
// background (the waits for answers need a reader); its jobs come on the channel.
func dialAcking(t *testing.T, url, token string, free uint32) (*Stream, <-chan *Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Dial(ctx, url, token, DialOptions{Hello: Hello{SystemID: "s_ack", Capacity: Capacity{Free: free}, Acknowledge: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	jobs := make(chan *Job, 16)
	go func() {
		defer close(jobs)
		for {
			j, err := s.Recv()
			if err != nil {
				return
			}
			jobs <- j
		}
	}()
	return s, jobs
}

func next(t *testing.T, jobs <-chan *Job) *Job {
	t.Helper()
	select {
	case j, ok := <-jobs:
		if !ok {
			t.Fatal("the stream ended")
		}
		return j
	case <-time.After(30 * time.Second):
		t.Fatal("no job pushed within 30 s")
	}
	return nil
}

func TestPushAdmitsAcknowledge(t *testing.T) {
	f := newFakeSource()
	url := serve(t, f)
	s, jobs := dialAcking(t, url, f.token, 2)
	if !s.Acknowledges() {
		t.Fatal("the server did not agree to acknowledge admits")
	}
	f.jobs <- 1
	f.jobs <- 2
	a, b := next(t, jobs), next(t, jobs)
	waits := map[int64]AckWait{}
	for _, j := range []*Job{a, b} {
		wait, err := s.Admit(j.ID)
		if err != nil || wait == nil {
			t.Fatalf("admit: %v (a wait: %v)", err, wait != nil)
		}
		waits[j.ID] = wait
	}
	// Answers are read by Recv's goroutine and found by their job,
	// awaited in any order.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, id := range []int64{b.ID, a.ID} {
		ack, err := waits[id](ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ack.JobID != id || ack.Code != codes.OK || ack.JobStatus != "running" || ack.TraceUpdateInterval != 3*time.Second {
			t.Fatalf("acknowledgement of job %d: %+v", id, ack)
		}
	}
	f.mu.Lock()
	acked, admitted := len(f.acked), len(f.admitted)
	f.mu.Unlock()
	if acked != 2 || admitted != 0 {
		t.Fatalf("%d acknowledged, %d admitted without acknowledging; want 2 and 0", acked, admitted)
	}
}

func TestPushAcknowledgementRefusedOrUnavailable(t *testing.T) {
	f := newFakeSource()
	f.ack = func(id int64) Ack {
		if id == 1 {
			return Ack{Code: codes.FailedPrecondition, Message: "canceled", JobStatus: "canceled"}
		}
		return Ack{Code: codes.Unavailable, Message: "store down"}
	}
	url := serve(t, f)
	s, jobs := dialAcking(t, url, f.token, 2)
	f.jobs <- 1
	f.jobs <- 2
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, want := range []Ack{{JobID: 1, Code: codes.FailedPrecondition, Message: "canceled", JobStatus: "canceled"},
		{JobID: 2, Code: codes.Unavailable, Message: "store down"}} {
		j := next(t, jobs)
		wait, err := s.Admit(j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := wait(ctx); err != nil || got != want {
			t.Fatalf("acknowledgement of job %d: %+v, %v; want %+v", j.ID, got, err, want)
		}
	}
}

func TestPushStreamEndingBeforeTheAcknowledgement(t *testing.T) {
	f := newFakeSource()
	recording, done := make(chan struct{}), make(chan struct{})
	f.ack = func(int64) Ack {
		close(recording)
		<-done
		return Ack{Code: codes.OK, JobStatus: "running"}
	}
	url := serve(t, f)
	s, jobs := dialAcking(t, url, f.token, 1)
	f.jobs <- 5
	j := next(t, jobs)
	wait, err := s.Admit(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	<-recording
	// The stream ends while the coordinator records the admit: the
	// runner cannot know whether it was recorded.
	s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := wait(ctx); !errors.Is(err, ErrStreamEnded) {
		t.Fatalf("acknowledgement after the stream ended: %v, want ErrStreamEnded", err)
	}
	close(done)
	// The admitted job is not released as unanswered: the recorded
	// acknowledgement stands (the runner learns it on REST).
	time.Sleep(200 * time.Millisecond)
	if _, released, _ := f.snapshot(); len(released) != 0 {
		t.Fatalf("released %v, want nothing", released)
	}
}

func TestVerdict(t *testing.T) {
	for _, tt := range []struct {
		code codes.Code
		err  error
		want AckVerdict
	}{
		{codes.OK, nil, AckAccepted},
		{codes.FailedPrecondition, nil, AckRefused},
		{codes.NotFound, nil, AckRefused},
		{codes.Unavailable, nil, AckOnREST},
		{codes.OK, ErrStreamEnded, AckOnREST},
		{codes.OK, context.Canceled, AckOnREST},
	} {
		if got := Verdict(Ack{Code: tt.code}, tt.err); got != tt.want {
			t.Errorf("Verdict(%s, %v) = %d, want %d", tt.code, tt.err, got, tt.want)
		}
	}
}
