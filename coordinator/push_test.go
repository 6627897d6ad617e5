package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runnerapi"
)

// pushStream is a runner's push stream to the env's coordinator, read by
// a goroutine into jobs.
type pushStream struct {
	*jobpush.Stream
	jobs chan *jobpush.Job
}

// openPush discovers the push channel as a runner does and opens a
// stream for tok offering levels (nil: none named) with free room.
func (e *env) openPush(tok, systemID string, levels []string, free uint32) *pushStream {
	e.t.Helper()
	return e.openPushWith(tok, jobpush.Hello{SystemID: systemID, Info: &runnerapi.Info{Name: "berth", IsolationLevels: levels},
		Capacity: jobpush.Capacity{Free: free}})
}

// openPushWith opens a stream with hello.
func (e *env) openPushWith(tok string, hello jobpush.Hello) *pushStream {
	e.t.Helper()
	u := e.discover(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := jobpush.Dial(ctx, u.String(), tok, jobpush.DialOptions{Hello: hello})
	if err != nil {
		e.t.Fatal(err)
	}
	ps := &pushStream{Stream: s, jobs: make(chan *jobpush.Job, 16)}
	go func() {
		defer close(ps.jobs)
		for {
			j, err := s.Recv()
			if err != nil {
				return
			}
			ps.jobs <- j
		}
	}()
	e.t.Cleanup(func() { s.Close() })
	return ps
}

// discover asks for the push channel's (and Job Router's) URL as a
// runner does.
func (e *env) discover(tok string) *url.URL {
	e.t.Helper()
	r := e.do("GET", "/api/v4/runners/router/discovery", nil, map[string]string{runnerapi.HeaderRunnerToken: tok})
	expectCode(e.t, "discovery", r, http.StatusOK)
	u, err := jobpush.ParseDiscovery(r.body)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// next waits for a pushed job and decodes it as a runner does.
func (ps *pushStream) next(t *testing.T) (*jobpush.Job, *runnerapi.JobResponse) {
	t.Helper()
	select {
	case j, ok := <-ps.jobs:
		if !ok {
			t.Fatal("the stream ended")
		}
		var job runnerapi.JobResponse
		if err := json.Unmarshal(j.Payload, &job); err != nil {
			t.Fatalf("pushed payload: %v", err)
		}
		if job.ID != j.ID {
			t.Fatalf("pushed job %d carries the payload of %d", j.ID, job.ID)
		}
		return j, &job
	case <-time.After(20 * time.Second):
		t.Fatal("nothing pushed within 20 s")
	}
	return nil, nil
}

// nothing checks that no job is pushed for a while (how long is a
// judgement, not a timing assertion: a push would come in milliseconds).
func (ps *pushStream) nothing(t *testing.T) {
	t.Helper()
	select {
	case j, ok := <-ps.jobs:
		if ok {
			t.Fatalf("job %d pushed, want none", j.ID)
		}
	case <-time.After(300 * time.Millisecond):
	}
}

func TestPushJobEnqueuedAfterTheStreamOpened(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPush(tok, "s_push", nil, 1)
	waitFor(t, "the stream to wait for a job", func() bool { return e.srv.Queue().Waiting() == 1 })
	id := e.enqueue(simpleSpec("pushed"))
	j, job := ps.next(t)
	if j.ID != id || job.Token == "" {
		t.Fatalf("pushed %d (token %q), want job %d", j.ID, job.Token, id)
	}
	if ps.Acknowledges() {
		t.Fatal("a stream whose hello did not ask for it acknowledges admits")
	}
	if wait, err := ps.Admit(j.ID); err != nil || wait != nil {
		t.Fatalf("admit: %v (a wait for an answer: %v)", err, wait != nil)
	}
	if st := e.job(id); st.Status != "pending" {
		t.Fatalf("job after an admit that does not acknowledge: %s", st.Status)
	}
	expectCode(t, "ack on REST", e.update(job, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning}), http.StatusOK)
	if st := e.job(id); st.Status != "running" || st.RunnerManagerID == 0 {
		t.Fatalf("job after the ack: %s, manager %d", st.Status, st.RunnerManagerID)
	}
	// Its room taken, the runner gets the next job only when it says it
	// has room again.
	id2 := e.enqueue(simpleSpec("second"))
	ps.nothing(t)
	if err := ps.Announce(jobpush.Capacity{Free: 1, Seen: 1}); err != nil {
		t.Fatal(err)
	}
	if j, _ := ps.next(t); j.ID != id2 {
		t.Fatalf("second push %d, want %d", j.ID, id2)
	}
}

func TestPushWithoutCapacityPushesNothing(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPush(tok, "s_push", nil, 0)
	id := e.enqueue(simpleSpec("waits"))
	ps.nothing(t)
	if !e.srv.Queue().Has(id) {
		t.Fatal("the job left the queue for a runner without room")
	}
	if err := ps.Announce(jobpush.Capacity{Free: 1}); err != nil {
		t.Fatal(err)
	}
	if j, _ := ps.next(t); j.ID != id {
		t.Fatalf("pushed %d, want %d", j.ID, id)
	}
}

func TestPushRejectedJobGoesToAnotherRunner(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	full := e.createRunner(restapi.CreateRunnerRequest{})
	other := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPush(full, "s_full", nil, 1)
	id := e.enqueue(simpleSpec("bounced"))
	j, job := ps.next(t)
	if err := ps.Reject(j.ID, codes.ResourceExhausted, "full"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job back in the queue", func() bool { return e.srv.Queue().Has(id) })
	// The rejected hand-out's token is dead.
	expectCode(t, "ack of a rejected job", e.update(job, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning}), http.StatusForbidden)
	got := e.take(other)
	if got.ID != id {
		t.Fatalf("other runner got %d, want %d", got.ID, id)
	}
	expectCode(t, "ack by the other runner", e.update(got, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning}), http.StatusOK)
	// A full runner gets nothing more until it announces room.
	e.enqueue(simpleSpec("next"))
	ps.nothing(t)
}

func TestPushUnansweredJobIsReleasedWhenTheStreamCloses(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPush(tok, "s_push", nil, 1)
	id := e.enqueue(simpleSpec("dropped"))
	ps.next(t)
	if e.srv.Queue().Has(id) {
		t.Fatal("a pushed job is still queued")
	}
	ps.Close()
	waitFor(t, "the job back in the queue", func() bool { return e.srv.Queue().Has(id) })
	if j := e.job(id); j.Status != "pending" || j.RunnerManagerID != 0 {
		t.Fatalf("released job: %s, manager %d", j.Status, j.RunnerManagerID)
	}
	if got := e.take(tok); got.ID != id {
		t.Fatalf("jobs/request got %d, want %d", got.ID, id)
	}
}

func TestPushPausedRunnerGetsNothing(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{Paused: true})
	ps := e.openPush(tok, "s_paused", nil, 1)
	id := e.enqueue(simpleSpec("not for a paused runner"))
	ps.nothing(t)
	if !e.srv.Queue().Has(id) {
		t.Fatal("a paused runner's stream took the job")
	}
	// Resumed, it gets the job without opening a new stream.
	rn := e.runnerByToken(tok)
	r := e.adminDo("PUT", "/api/v4/runners/"+strconv.FormatInt(rn.ID, 10), restapi.UpdateRunnerRequest{Paused: ptr(false)})
	expectCode(t, "resume", r, http.StatusOK)
	if j, _ := ps.next(t); j.ID != id {
		t.Fatalf("pushed %d, want %d", j.ID, id)
	}
	if _, err := ps.Admit(id); err != nil {
		t.Fatal(err)
	}
	// Paused while its stream waits: the job that comes goes back.
	if err := ps.Announce(jobpush.Capacity{Free: 1, Seen: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream to wait for a job", func() bool { return e.srv.Queue().Waiting() == 1 })
	r = e.adminDo("PUT", "/api/v4/runners/"+strconv.FormatInt(rn.ID, 10), restapi.UpdateRunnerRequest{Paused: ptr(true)})
	expectCode(t, "pause", r, http.StatusOK)
	id2 := e.enqueue(simpleSpec("after the pause"))
	ps.nothing(t)
	waitFor(t, "the job in the queue", func() bool { return e.srv.Queue().Has(id2) })
}

func TestPushDeletedRunnerStreamEnds(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPush(tok, "s_push", nil, 1)
	waitFor(t, "the stream to wait for a job", func() bool { return e.srv.Queue().Waiting() == 1 })
	rn := e.runnerByToken(tok)
	expectCode(t, "delete runner", e.adminDo("DELETE", "/api/v4/runners/"+strconv.FormatInt(rn.ID, 10), nil), http.StatusNoContent)
	id := e.enqueue(simpleSpec("nobody's"))
	select {
	case j, ok := <-ps.jobs:
		if ok {
			t.Fatalf("a deleted runner got job %d", j.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the deleted runner's stream did not end")
	}
	if _, err := ps.Recv(); !errors.Is(err, jobpush.ErrUnauthenticated) {
		t.Errorf("the stream ended with %v, want Unauthenticated", err)
	}
	waitFor(t, "the job in the queue", func() bool { return e.srv.Queue().Has(id) })
}

func TestPushRefusesWrongTokens(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	e.createRunner(restapi.CreateRunnerRequest{})
	r := e.do("GET", "/api/v4/runners/router/discovery", nil, map[string]string{runnerapi.HeaderRunnerToken: "glrt-wrong"})
	expectCode(t, "discovery with a wrong token", r, http.StatusForbidden)
	u, err := jobpush.ServerURL(e.http.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = jobpush.Dial(context.Background(), u, "glrt-wrong", jobpush.DialOptions{})
	var he *jobpush.HandshakeError
	if !errors.Is(err, jobpush.ErrUnauthenticated) || !errors.As(err, &he) || he.StatusCode != http.StatusForbidden {
		t.Fatalf("dial with a wrong token: %v, want a 403 handshake", err)
	}
	// Without a token at all the upgrade is refused too.
	r = e.do("GET", jobpush.Path, nil, map[string]string{"Connection": "Upgrade", "Upgrade": "websocket"})
	expectCode(t, "upgrade without a token", r, http.StatusForbidden)
}

func TestPushDiscoveryNamesTheExternalURL(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: "https://ci.example.com/berth/"})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	r := e.do("GET", "/api/v4/runners/router/discovery", nil, map[string]string{runnerapi.HeaderRunnerToken: tok})
	expectCode(t, "discovery", r, http.StatusOK)
	var d jobpush.DiscoveryResponse
	r.json(t, &d)
	if d.ServerURL != "wss://ci.example.com/berth/api/v4/berth/job-router" {
		t.Fatalf("server_url %q", d.ServerURL)
	}
}

func TestPushRespectsIsolationLevels(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	weak := e.openPush(tok, "s_weak", []string{"none", "container"}, 1)
	id := e.enqueue(isolationSpec("needs vm", "vm"))
	weak.nothing(t)
	strong := e.openPush(tok, "s_vm", []string{"vm"}, 1)
	_, job := strong.next(t)
	if job.ID != id {
		t.Fatalf("vm stream got %d, want %d", job.ID, id)
	}
	if vars := isolationVars(job); len(vars) != 1 || vars[0].Value != "vm" {
		t.Fatalf("BERTH_ISOLATION of the pushed job: %+v", vars)
	}
	// The weak stream still gets what it may run.
	id2 := e.enqueue(isolationSpec("container", "container"))
	if _, job := weak.next(t); job.ID != id2 {
		t.Fatalf("weak stream got %d, want %d", job.ID, id2)
	}
}

// TestPushPayloadIsTheJobsRequestPayload: the same job handed out by a
// push and by jobs/request carries the same JSON but for what each
// hand-out mints.
func TestPushPayloadIsTheJobsRequestPayload(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	spec := simpleSpec("compared")
	spec.Variables = []runnerapi.Variable{{Key: "A", Value: "1"}, {Key: "SECRET", Value: "s3cr3t", Masked: true}}
	spec.Tags = nil
	dep := e.enqueue(simpleSpec("dependency"))
	spec.Dependencies = []int64{dep}
	e.take(tok) // the dependency, out of the way
	id := e.enqueue(spec)
	ps := e.openPush(tok, "s_cmp", []string{"none"}, 1)
	j, pushed := ps.next(t)
	if err := ps.Reject(j.ID, codes.ResourceExhausted, "full"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job back in the queue", func() bool { return e.srv.Queue().Has(id) })
	r, polled := e.requestAt(tok, "s_cmp", "", []string{"none"})
	expectCode(t, "jobs/request", r, http.StatusCreated)
	if polled.ID != pushed.ID {
		t.Fatalf("jobs/request got %d, want %d", polled.ID, pushed.ID)
	}
	if !strings.HasSuffix(string(j.Payload), "}\n") || !strings.HasSuffix(string(r.body), "}\n") {
		t.Errorf("payload framing differs: push %q…, jobs/request %q…", j.Payload[len(j.Payload)-2:], r.body[len(r.body)-2:])
	}
	var a, b map[string]any
	if err := json.Unmarshal(j.Payload, &a); err != nil {
		t.Fatal(err)
	}
	r.json(t, &b)
	// What each hand-out mints: the tokens (in the payload, the
	// repository URL, the variables and the dependencies) and the time
	// in the queue.
	for _, m := range []map[string]any{a, b} {
		delete(m, "token")
		delete(m, "variables")
		delete(m, "dependencies")
		delete(m["job_info"].(map[string]any), "time_in_queue_seconds")
	}
	if !reflect.DeepEqual(a, b) {
		pa, _ := json.MarshalIndent(a, "", " ")
		pb, _ := json.MarshalIndent(b, "", " ")
		t.Fatalf("payloads differ:\npush %s\njobs/request %s", pa, pb)
	}
	keys := func(vs []runnerapi.Variable) []string {
		var out []string
		for _, v := range vs {
			if !strings.Contains(v.Value, "glcbt-") {
				out = append(out, v.Key+"="+v.Value)
			} else {
				out = append(out, v.Key)
			}
		}
		return out
	}
	if ka, kb := keys(pushed.Variables), keys(polled.Variables); !reflect.DeepEqual(ka, kb) {
		t.Fatalf("variables differ:\npush %v\njobs/request %v", ka, kb)
	}
	if len(pushed.Dependencies) != 1 || len(polled.Dependencies) != 1 || pushed.Dependencies[0].ID != polled.Dependencies[0].ID {
		t.Fatalf("dependencies: push %+v, jobs/request %+v", pushed.Dependencies, polled.Dependencies)
	}
}

// admitAcked admits job id on a stream that acknowledges and waits
// (bounded) for the coordinator's answer.
func (ps *pushStream) admitAcked(t *testing.T, id int64) jobpush.Ack {
	t.Helper()
	wait, err := ps.Admit(id)
	if err != nil || wait == nil {
		t.Fatalf("admit of job %d: %v (a wait: %v)", id, err, wait != nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := wait(ctx)
	if err != nil {
		t.Fatalf("acknowledgement of job %d: %v", id, err)
	}
	return a
}

func TestPushAdmitAcknowledgesTheJob(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL, TraceUpdateInterval: 7 * time.Second})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPushWith(tok, jobpush.Hello{SystemID: "s_ack", Capacity: jobpush.Capacity{Free: 2}, Acknowledge: true})
	if !ps.Acknowledges() {
		t.Fatal("the coordinator did not agree to acknowledge admits")
	}
	id := e.enqueue(simpleSpec("acknowledged"))
	j, job := ps.next(t)
	if st := e.job(id); st.Status != "pending" {
		t.Fatalf("pushed job before its admit: %s", st.Status)
	}
	a := ps.admitAcked(t, j.ID)
	if a.JobID != id || a.Code != codes.OK || a.JobStatus != "running" || a.TraceUpdateInterval != 7*time.Second {
		t.Fatalf("acknowledgement: %+v", a)
	}
	st := e.job(id)
	if st.Status != "running" || st.StartedAt.IsZero() || st.RunnerManagerID == 0 {
		t.Fatalf("job after its admit: %s, started %v, manager %d", st.Status, st.StartedAt, st.RunnerManagerID)
	}
	// The job token works as after a REST ack; a REST ack of its own (a
	// runner that did not see the answer) finds it running and keeps it.
	expectCode(t, "ack on REST after the stream's", e.update(job, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning}), http.StatusOK)
	expectCode(t, "trace", e.patch(job, "0-1", []byte("ok")), http.StatusAccepted)
	if st := e.job(id); st.Status != "running" {
		t.Fatalf("job after a second ack: %s", st.Status)
	}
}

func TestPushAdmitOfACanceledJobIsRefused(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPushWith(tok, jobpush.Hello{SystemID: "s_ack", Capacity: jobpush.Capacity{Free: 1}, Acknowledge: true})
	id := e.enqueue(simpleSpec("canceled before its admit"))
	j, _ := ps.next(t)
	expectCode(t, "cancel", e.adminDo("POST", "/api/v4/projects/1/jobs/"+strconv.FormatInt(id, 10)+"/cancel", nil), http.StatusCreated)
	if a := ps.admitAcked(t, j.ID); a.Code != codes.FailedPrecondition || a.JobStatus != "canceled" {
		t.Fatalf("acknowledgement of a canceled job: %+v", a)
	}
	if st := e.job(id); st.Status != "canceled" {
		t.Fatalf("job after the refused admit: %s", st.Status)
	}
}

func TestPushAdmitAfterARejectIsRefused(t *testing.T) {
	// An admit for a job the stream no longer holds (rejected and back
	// in the queue, or never pushed here) is answered, not ignored: the
	// runner must not wait for it.
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ps := e.openPushWith(tok, jobpush.Hello{SystemID: "s_ack", Capacity: jobpush.Capacity{Free: 1}, Acknowledge: true})
	id := e.enqueue(simpleSpec("rejected"))
	j, _ := ps.next(t)
	if err := ps.Reject(j.ID, codes.ResourceExhausted, "full"); err != nil {
		t.Fatal(err)
	}
	if a := ps.admitAcked(t, j.ID); a.Code != codes.FailedPrecondition {
		t.Fatalf("acknowledgement of a rejected job: %+v", a)
	}
	waitFor(t, "the job back in the queue", func() bool { return e.srv.Queue().Has(id) })
	if st := e.job(id); st.Status != "pending" || st.RunnerManagerID != 0 {
		t.Fatalf("rejected job: %s, manager %d", st.Status, st.RunnerManagerID)
	}
}
