package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runnerapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// routerClient discovers the Job Router as GitLab's runner does (with
// FF_USE_JOB_ROUTER) and returns its client for tok.
func (e *env) routerClient(tok string) *jobpush.RouterClient {
	e.t.Helper()
	c, err := jobpush.DialRouter(e.discover(tok).String(), tok, jobpush.DialOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// routerRequest is the jobs/request body GitLab's runner sends through
// the router (its PrepareJobRequest).
func routerRequest(t *testing.T, tok, lastUpdate string) []byte {
	t.Helper()
	b, err := json.Marshal(runnerapi.JobRequest{Token: tok, SystemID: "s_router", LastUpdate: lastUpdate,
		Info: &runnerapi.Info{Name: "gitlab-runner", Version: "18.9.0", Features: runnerapi.Features{Variables: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// GitLab's runner with FF_USE_JOB_ROUTER calls JobRouter.GetJob on the
// URL discovery names: it gets the jobs/request payload, empty bytes when
// there is no job (held as a long poll once it sent last_update), the
// queue version in x-gitlab-last-update and its x-request-id back; the job
// then goes on over REST.
func TestJobRouterGetJob(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL, LongPollTimeout: 2 * time.Second})
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	c := e.routerClient(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	job, last, err := c.GetJob(ctx, routerRequest(t, tok, ""), "req-1")
	if err != nil || job != nil || last == "" {
		t.Fatalf("empty queue: job %s, last update %q, %v; want no job and a version", job, last, err)
	}
	// Held with last_update: a job enqueued meanwhile comes on the same call.
	got := make(chan []byte, 1)
	go func() {
		j, _, err := c.GetJob(ctx, routerRequest(t, tok, last), "req-2")
		if err != nil {
			t.Error(err)
		}
		got <- j
	}()
	waitFor(t, "the call to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	id := e.enqueue(simpleSpec("through the router"))
	var p runnerapi.JobResponse
	if err := json.Unmarshal(<-got, &p); err != nil || p.ID != id || p.Token == "" || p.JobInfo.Name != "through the router" {
		t.Fatalf("GetJob: %+v, %v; want job %d with its token", p, err, id)
	}
	expectCode(t, "ack over REST", e.update(&p, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "finish over REST", e.update(&p, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	// The manager checked in as jobs/request does.
	rn := e.runnerByToken(tok)
	ms, err := e.st.ListRunnerManagers(ctx, rn.ID)
	if err != nil || len(ms) != 1 || ms[0].SystemID != "s_router" {
		t.Errorf("managers %+v, %v; want s_router", ms, err)
	}

	// A paused runner gets no job, and the job stays queued.
	expectCode(t, "pause", e.adminDo("PUT", "/api/v4/runners/"+strconv.FormatInt(rn.ID, 10), restapi.UpdateRunnerRequest{Paused: ptr(true)}), http.StatusOK)
	id2 := e.enqueue(simpleSpec("not while paused"))
	if j, _, err := c.GetJob(ctx, routerRequest(t, tok, ""), ""); err != nil || j != nil {
		t.Errorf("paused runner: job %s, %v", j, err)
	}
	if !e.srv.Queue().Has(id2) {
		t.Error("a paused runner took a job through the router")
	}
}

func TestJobRouterRefuses(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: ownURL})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	c := e.routerClient(tok)
	ctx := context.Background()
	if _, _, err := c.GetJob(ctx, []byte("{not json"), ""); err == nil {
		t.Error("a body that is not JSON: no error")
	}
	// The token on the call is what counts: deleted meanwhile, refused.
	rn := e.runnerByToken(tok)
	expectCode(t, "delete runner", e.adminDo("DELETE", "/api/v4/runners/"+strconv.FormatInt(rn.ID, 10), nil), http.StatusNoContent)
	if _, _, err := c.GetJob(ctx, routerRequest(t, tok, ""), ""); !errors.Is(err, jobpush.ErrUnauthenticated) {
		t.Errorf("deleted runner: %v, want unauthenticated", err)
	}
}

// FuzzJobRouterBodies sends arbitrary job_request bodies through GetJob:
// the answer is no job or a refusal of the request, never an internal
// error.
func FuzzJobRouterBodies(f *testing.F) {
	fe := newEnv(f, Config{ExternalURL: ownURL, LongPollTimeout: 10 * time.Millisecond})
	tok := fe.createRunner(restapi.CreateRunnerRequest{})
	c := fe.routerClient(tok)
	f.Add([]byte(`{"token":"x","system_id":"s","last_update":"1"}`))
	f.Add([]byte(`{"info":{"isolation_levels":["vm","bogus",""],"features":{"variables":true}}}`))
	f.Add([]byte(`{"system_id":""}`))
	f.Add([]byte(`null`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		job, _, err := c.GetJob(ctx, body, "")
		if code := status.Code(err); err != nil && code != codes.InvalidArgument && code != codes.FailedPrecondition {
			t.Fatalf("GetJob(%q): %v", body, err)
		}
		if job != nil {
			t.Fatalf("GetJob(%q) handed out a job from an empty queue: %s", body, job)
		}
	})
}
