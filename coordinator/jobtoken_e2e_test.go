package coordinator

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// scriptToken is the job's CI_JOB_TOKEN.
func scriptToken(t *testing.T, job *runnerapi.JobResponse) string {
	t.Helper()
	for _, v := range job.Variables {
		if v.Key == "CI_JOB_TOKEN" {
			return v.Value
		}
	}
	t.Fatal("no CI_JOB_TOKEN")
	return ""
}

// as is job with another token.
func as(job *runnerapi.JobResponse, tok string) *runnerapi.JobResponse {
	c := *job
	c.Token = tok
	return &c
}

// TestJobTokenScopes: the job's script token (CI_JOB_TOKEN) may download
// artifacts but not act as the runner; the runner's token may do all;
// every scope is checked on its own endpoint.
func TestJobTokenScopes(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("a"))
	job := e.take(tok)
	script := as(job, scriptToken(t, job))

	expectCode(t, "ack with the script's token", e.update(script, runnerapi.UpdateJobRequest{State: "running"}), http.StatusForbidden)
	expectCode(t, "ack with the runner's token", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	r := e.update(script, runnerapi.UpdateJobRequest{State: "success"})
	if r.code != http.StatusForbidden || !strings.Contains(string(r.body), "does not allow job") {
		t.Fatalf("final update with the script's token: %d %s", r.code, r.body)
	}
	expectCode(t, "trace with the script's token", e.patch(script, "0-1", []byte("hi")), http.StatusForbidden)
	expectCode(t, "trace with the runner's token", e.patch(job, "0-1", []byte("hi")), http.StatusAccepted)
	expectCode(t, "upload with the script's token", uploadArtifact(e, script, "", []byte("PK")), http.StatusForbidden)
	expectCode(t, "upload with the runner's token", uploadArtifact(e, job, "", []byte("PK")), http.StatusCreated)
	path := fmt.Sprintf("/api/v4/jobs/%d/artifacts", job.ID)
	expectCode(t, "download with the script's token", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: script.Token}), http.StatusOK)
	if j := e.job(job.ID); j.Status != store.StatusRunning {
		t.Fatalf("the script's token changed its job: %s", j.Status)
	}
	expectCode(t, "final", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	expectCode(t, "download after the job ended", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: script.Token}), http.StatusForbidden)
}

// TestJobTokenExpiry: a token past its expiry is refused though its job
// still runs (a runner that vanished: the reaper fails the job next).
func TestJobTokenExpiry(t *testing.T) {
	e := newEnv(t, Config{AckTimeout: time.Minute, TimeoutGrace: time.Minute})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	spec := simpleSpec("a")
	spec.Timeout = 600
	e.enqueue(spec)
	job := e.take(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	e.clock.Advance(12 * time.Minute) // ack + timeout + grace = 12 min: still valid for its last minute
	expectCode(t, "keep-alive before expiry", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	e.clock.Advance(time.Minute)
	r := e.patch(job, "0-1", []byte("hi"))
	if r.code != http.StatusForbidden || !strings.Contains(string(r.body), "expired") {
		t.Fatalf("trace with an expired token: %d %s", r.code, r.body)
	}
}

// TestJobTokenOfAnotherCell: a token one cell minted is refused by
// another, even for a job of the same id.
func TestJobTokenOfAnotherCell(t *testing.T) {
	a, b := newEnv(t, Config{CellID: 1}), newEnv(t, Config{CellID: 2})
	ta, tb := a.createRunner(restapi.CreateRunnerRequest{}), b.createRunner(restapi.CreateRunnerRequest{})
	a.enqueue(simpleSpec("a"))
	b.enqueue(simpleSpec("b"))
	ja, jb := a.take(ta), b.take(tb)
	if ja.ID != jb.ID {
		t.Fatalf("the cells' jobs have ids %d and %d", ja.ID, jb.ID)
	}
	expectCode(t, "cell 1's token in cell 2", b.update(as(jb, ja.Token), runnerapi.UpdateJobRequest{State: "running"}), http.StatusForbidden)
	expectCode(t, "cell 2's own token", b.update(jb, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	r, err := token.ParseRoutable(tb)
	if err != nil || r.Cell != 2 {
		t.Fatalf("cell 2's runner token %q routes to %+v (%v)", token.Short(tb), r, err)
	}
}

// TestLegacyJobToken: a job handed out with a random token (by a
// coordinator before job tokens were JWTs) keeps working after an
// upgrade, with every scope.
func TestLegacyJobToken(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	id := e.enqueue(simpleSpec("a"))
	job := e.take(tok)
	legacy := token.NewJob()
	ctx := context.Background()
	if err := e.st.UnassignJob(ctx, id, e.job(id).RunnerManagerID); err != nil {
		t.Fatal(err)
	}
	if err := e.st.AssignJob(ctx, store.Assignment{JobID: id, RunnerID: e.job(id).RunnerID, ManagerID: 1,
		TokenDigest: token.Digest(legacy), At: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	e.srv.dispatch.Forget(id)
	expectCode(t, "the JWT of the hand-out the store no longer has", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusForbidden)
	old := as(job, legacy)
	expectCode(t, "ack with a legacy token", e.update(old, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "trace with a legacy token", e.patch(old, "0-1", []byte("hi")), http.StatusAccepted)
}
