package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/runnerhttp"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

func TestJobRequestPausedAndEmpty(t *testing.T) {
	e := newEnv(t, Config{})
	paused := e.createRunner(restapi.CreateRunnerRequest{Paused: true})
	e.enqueue(simpleSpec("a"))
	r, job := e.request(paused, "s_p", "")
	if job != nil || r.code != http.StatusNoContent || r.header.Get(runnerapi.HeaderLastUpdate) == "" {
		t.Fatalf("paused runner: %d %v", r.code, r.header)
	}
	tagged := e.createRunner(restapi.CreateRunnerRequest{TagList: []string{"gpu"}})
	r, _ = e.request(tagged, "s_t", "")
	if r.code != http.StatusNoContent || r.header.Get(runnerapi.HeaderLastUpdate) == "" {
		t.Fatalf("no eligible job: %d", r.code)
	}
	expectCode(t, "bad token", e.do("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: "glrt-bad"}, nil), http.StatusForbidden)
	expectCode(t, "malformed body", e.do("POST", "/api/v4/jobs/request", []byte("{"), nil), http.StatusBadRequest)
}

func TestLongPollHoldsAndWakesOnEnqueue(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: time.Minute})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	r, _ := e.request(tok, "s_1", "")
	expectCode(t, "first request", r, http.StatusNoContent)
	version := r.header.Get(runnerapi.HeaderLastUpdate)

	// A stale version is answered at once.
	r, _ = e.request(tok, "s_1", "stale")
	expectCode(t, "stale last_update", r, http.StatusNoContent)

	got := make(chan *runnerapi.JobResponse, 1)
	go func() {
		_, job := e.request(tok, "s_1", version)
		got <- job
	}()
	waitFor(t, "the request to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	id := e.enqueue(simpleSpec("woken"))
	job := <-got
	if job == nil || job.ID != id {
		t.Fatalf("held request got %+v, want job %d", job, id)
	}
}

// TestJobRequestOfARunnerThatWentAway: a job handed out to a request whose
// runner went away (its connection closed as the job came) goes back to
// the queue at once, not at the ack timeout.
func TestJobRequestOfARunnerThatWentAway(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: time.Minute})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	// Asked once, the runner and its manager are known (no store read
	// before the hand-out).
	r, _ := e.request(tok, "s_gone", "")
	expectCode(t, "first request", r, http.StatusNoContent)
	id := e.enqueue(simpleSpec("orphan"))
	body, _ := json.Marshal(runnerapi.JobRequest{Token: tok, SystemID: "s_gone"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // gone already: the queued job is still taken from the backlog
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/v4/jobs/request", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	e.srv.Handler().ServeHTTP(httptest.NewRecorder(), req)
	j, err := e.st.GetJob(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != store.StatusPending || j.RunnerManagerID != 0 || !e.srv.Queue().Has(id) {
		t.Fatalf("job after its runner went away: %s, manager %d, queued %v; want pending, unassigned, queued",
			j.Status, j.RunnerManagerID, e.srv.Queue().Has(id))
	}
	if job := e.take(tok); job.ID != id {
		t.Fatalf("next request got job %d, want %d", job.ID, id)
	}
}

func TestLongPollTimesOutWith204(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: 50 * time.Millisecond})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	r, _ := e.request(tok, "s_1", "")
	r, _ = e.request(tok, "s_1", r.header.Get(runnerapi.HeaderLastUpdate))
	expectCode(t, "held request after timeout", r, http.StatusNoContent)
	if e.srv.Queue().Waiting() != 0 {
		t.Fatal("waiter left behind")
	}
}

// TestGitDepthVariable: GIT_DEPTH, at whichever level it counts, is the
// payload's git_info.depth, the only place gitlab-runner reads it.
func TestGitDepthVariable(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	for _, c := range []struct {
		vars []runnerapi.Variable
		want int
	}{
		{nil, 20},
		{[]runnerapi.Variable{{Key: "GIT_DEPTH", Value: "1", Public: true}}, 1},
		{[]runnerapi.Variable{{Key: "GIT_DEPTH", Value: "1", Public: true}, {Key: "GIT_DEPTH", Value: "0"}}, 0},
	} {
		spec := simpleSpec("fetch")
		spec.Depth, spec.Variables = 20, c.vars
		e.enqueue(spec)
		job := e.take(tok)
		if job.GitInfo.Depth != c.want {
			t.Errorf("variables %v: git_info.depth %d, want %d", c.vars, job.GitInfo.Depth, c.want)
		}
	}
}

func TestPayloadShape(t *testing.T) {
	e := newEnv(t, Config{ExternalURL: "http://coord.test:8080"})
	tok := e.createRunner(restapi.CreateRunnerRequest{MaximumTimeout: 600, Description: "r1"})
	spec := simpleSpec("build")
	spec.Stage = "build"
	spec.ProjectName, spec.ProjectFullPath = "demo", "acme/demo"
	spec.Ref, spec.Sha, spec.RepoURL = "main", "0123456789abcdef0123456789abcdef01234567", "http://coord.test:8080/acme/demo.git"
	spec.Timeout = 3600
	spec.Variables = []runnerapi.Variable{{Key: "SECRET", Value: "s3cr3t", Masked: true}}
	spec.Artifacts = []runnerapi.Artifact{{Name: "a", Paths: []string{"out/"}, When: "on_success", ArtifactType: "archive", ArtifactFormat: "zip"}}
	id := e.enqueue(spec)
	r, job := e.request(tok, "s_1", "")
	expectCode(t, "request", r, http.StatusCreated)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if job.ID != id || !strings.HasPrefix(job.Token, "glcbt-") {
		t.Fatalf("id %d token %q", job.ID, job.Token)
	}
	// The repository URL carries the job script's token (CI_JOB_TOKEN),
	// not the runner's.
	var ciJobToken string
	for _, v := range job.Variables {
		if v.Key == "CI_JOB_TOKEN" {
			ciJobToken = v.Value
		}
	}
	if !strings.HasPrefix(ciJobToken, "glcbt-") || ciJobToken == job.Token {
		t.Fatalf("CI_JOB_TOKEN %q (the runner's token is %q)", ciJobToken, job.Token)
	}
	if want := "http://gitlab-ci-token:" + ciJobToken + "@coord.test:8080/acme/demo.git"; job.GitInfo.RepoURL != want {
		t.Fatalf("repo_url %q, want %q", job.GitInfo.RepoURL, want)
	}
	if job.RunnerInfo.Timeout != 600 {
		t.Fatalf("timeout %d: runner maximum_timeout 600 must cap the job's 3600", job.RunnerInfo.Timeout)
	}
	if job.JobInfo.Name != "build" || job.JobInfo.Stage != "build" || job.JobInfo.ProjectName != "demo" || job.GitInfo.RefType != "branch" {
		t.Fatalf("job_info/git_info %+v %+v", job.JobInfo, job.GitInfo)
	}
	vars := map[string]runnerapi.Variable{}
	for _, v := range job.Variables {
		vars[v.Key] = v
	}
	if v := vars["CI_JOB_TOKEN"]; v.Value != ciJobToken || !v.Masked {
		t.Fatalf("CI_JOB_TOKEN %+v", v)
	}
	if vars["CI_SERVER_URL"].Value != "http://coord.test:8080" || vars["CI_JOB_ID"].Value != strconv.FormatInt(id, 10) || !vars["SECRET"].Masked {
		t.Fatalf("variables %+v", vars)
	}
	if len(job.Steps) != 1 || job.Steps[0].Script[0] != "echo hi" || len(job.Artifacts) != 1 || job.Services == nil || job.Dependencies == nil {
		t.Fatalf("steps/artifacts %+v %+v", job.Steps, job.Artifacts)
	}
	if !job.Features.TraceSections || len(job.Features.FailureReasons) == 0 || len(job.Features.TokenMaskPrefixes) == 0 {
		t.Fatalf("features %+v", job.Features)
	}
	j := e.job(id)
	// The store keeps the digest of the hand-out's secret id, never a
	// token (nor a token's digest, which would let a token be looked up).
	if j.Status != store.StatusPending || j.RunnerManagerID == 0 || j.TokenDigest == "" ||
		j.TokenDigest == token.Digest(job.Token) || j.TokenDigest == token.Digest(ciJobToken) ||
		strings.Contains(job.Token, j.TokenDigest) {
		t.Fatalf("stored job after hand-out %+v", j)
	}
}

func TestTwoPhaseTraceAndFinalUpdate(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("t"))
	job := e.take(tok)

	r := e.patch(job, "0-4", []byte("hello"))
	expectCode(t, "trace before ack is accepted", r, http.StatusAccepted)

	r = e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	expectCode(t, "ack", r, http.StatusOK)
	if r.header.Get(runnerapi.HeaderJobStatus) != "running" || r.header.Get(runnerapi.HeaderTraceUpdateInterval) != "3" {
		t.Fatalf("ack headers %v", r.header)
	}
	if j := e.job(job.ID); j.Status != store.StatusRunning || j.StartedAt.IsZero() {
		t.Fatalf("after ack %+v", j)
	}

	expectCode(t, "missing Content-Range", e.patch(job, "", []byte("x")), http.StatusBadRequest)
	expectCode(t, "malformed Content-Range", e.patch(job, "a-b", []byte("x")), http.StatusBadRequest)
	expectCode(t, "Content-Range not matching body", e.patch(job, "5-9", []byte("x")), http.StatusBadRequest)
	r = e.patch(job, "3-4", []byte(" w"))
	expectCode(t, "wrong offset", r, http.StatusRequestedRangeNotSatisfiable)
	if r.header.Get(runnerapi.HeaderRange) != "0-5" {
		t.Fatalf("416 Range %q, want 0-5", r.header.Get(runnerapi.HeaderRange))
	}
	r = e.patch(job, "5-10", []byte(" world"))
	expectCode(t, "append", r, http.StatusAccepted)
	if r.header.Get(runnerapi.HeaderRange) != "0-11" || r.header.Get(runnerapi.HeaderJobStatus) != "running" {
		t.Fatalf("append headers %v", r.header)
	}

	full := []byte("hello world, done")
	sum := fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(full))
	final := runnerapi.UpdateJobRequest{State: "success", Output: &runnerapi.Output{Checksum: sum, Bytesize: int64(len(full))}}
	r = e.update(job, final)
	expectCode(t, "final update before the trace is complete", r, http.StatusAccepted)
	expectCode(t, "rest of trace", e.patch(job, "11-16", full[11:]), http.StatusAccepted)
	r = e.update(job, final)
	expectCode(t, "final update", r, http.StatusOK)
	if r.header.Get(runnerapi.HeaderJobStatus) != "success" {
		t.Fatalf("final Job-Status %q", r.header.Get(runnerapi.HeaderJobStatus))
	}
	j := e.job(job.ID)
	if j.Status != store.StatusSuccess || j.FinishedAt.IsZero() {
		t.Fatalf("after final %+v", j)
	}
	r = e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	expectCode(t, "update after finish", r, http.StatusForbidden)
	if r.header.Get(runnerapi.HeaderJobStatus) != "success" {
		t.Fatalf("403 must carry Job-Status, got %v", r.header)
	}
	expectCode(t, "trace after finish", e.patch(job, "17-17", []byte("x")), http.StatusForbidden)
	var buf bytes.Buffer
	e.st.ReadTrace(t.Context(), job.ID, 0, &buf)
	if buf.String() != string(full) {
		t.Fatalf("stored trace %q", buf.String())
	}
	tr := e.adminDo("GET", "/api/v4/projects/1/jobs/"+strconv.FormatInt(job.ID, 10)+"/trace", nil)
	if tr.code != http.StatusOK || string(tr.body) != string(full) {
		t.Fatalf("trace API: %d %q", tr.code, tr.body)
	}
}

func TestFinalUpdateGivesUpWaitingForTrace(t *testing.T) {
	e := newEnv(t, Config{FinalTraceWait: time.Minute})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("t"))
	job := e.take(tok)
	e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	final := runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 2, Output: &runnerapi.Output{Bytesize: 100}}
	expectCode(t, "final, trace missing", e.update(job, final), http.StatusAccepted)
	e.clock.Advance(time.Minute)
	// Past the wait the size mismatch is reported with 412 (re-send the trace) a bounded number of times, then accepted.
	for i := 0; i < runnerhttp.MaxTraceResets; i++ {
		expectCode(t, "final, trace still missing", e.update(job, final), http.StatusPreconditionFailed)
	}
	expectCode(t, "final accepted", e.update(job, final), http.StatusOK)
	j := e.job(job.ID)
	if j.Status != store.StatusFailed || j.FailureReason != "script_failure" || j.ExitCode != 2 {
		t.Fatalf("job %+v", j)
	}
}

func TestChecksumMismatchAsksForTraceReset(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("t"))
	job := e.take(tok)
	e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	e.patch(job, "0-4", []byte("hellX"))
	good := []byte("hello")
	final := runnerapi.UpdateJobRequest{State: "success", Output: &runnerapi.Output{Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(good)), Bytesize: 5}}
	expectCode(t, "checksum mismatch", e.update(job, final), http.StatusPreconditionFailed)
	expectCode(t, "re-send from 0", e.patch(job, "0-4", good), http.StatusAccepted)
	expectCode(t, "final after reset", e.update(job, final), http.StatusOK)
	var buf bytes.Buffer
	e.st.ReadTrace(t.Context(), job.ID, 0, &buf)
	if buf.String() != "hello" {
		t.Fatalf("trace after reset %q", buf.String())
	}
}

func TestOffsetZeroWithoutResetIs416(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("t"))
	job := e.take(tok)
	e.patch(job, "0-4", []byte("hello"))
	r := e.patch(job, "0-4", []byte("hello"))
	expectCode(t, "duplicate first patch", r, http.StatusRequestedRangeNotSatisfiable)
	if r.header.Get(runnerapi.HeaderRange) != "0-5" {
		t.Fatalf("Range %q", r.header.Get(runnerapi.HeaderRange))
	}
}

func TestJobTokenScope(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("a"))
	e.enqueue(simpleSpec("b"))
	a, b := e.take(tok), e.take(tok)
	r := e.do("PUT", "/api/v4/jobs/"+strconv.FormatInt(b.ID, 10), runnerapi.UpdateJobRequest{State: "running"}, map[string]string{runnerapi.HeaderJobToken: a.Token})
	expectCode(t, "job token of another job", r, http.StatusForbidden)
	expectCode(t, "unknown job", e.do("PUT", "/api/v4/jobs/999999", runnerapi.UpdateJobRequest{State: "running"}, map[string]string{runnerapi.HeaderJobToken: a.Token}), http.StatusNotFound)
	expectCode(t, "no token", e.do("PATCH", "/api/v4/jobs/"+strconv.FormatInt(a.ID, 10)+"/trace", []byte("x"), map[string]string{runnerapi.HeaderContentRange: "0-0"}), http.StatusForbidden)
	expectCode(t, "bad state", e.update(a, runnerapi.UpdateJobRequest{State: "exploded"}), http.StatusBadRequest)
	// The body token alone authenticates PUT, as GitLab accepts it.
	expectCode(t, "body token", e.do("PUT", "/api/v4/jobs/"+strconv.FormatInt(a.ID, 10), runnerapi.UpdateJobRequest{Token: a.Token, State: "running"}, nil), http.StatusOK)
}

// TestLostRaceTriesNextJob: a job another coordinator replica handed out
// first is skipped within the same request, which takes the next job, or
// answers 204 when there is none.
func TestLostRaceTriesNextJob(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	raced := e.enqueue(simpleSpec("raced"))
	next := e.enqueue(simpleSpec("next"))
	steal := func(id int64) {
		if err := e.st.AssignJob(t.Context(), store.Assignment{JobID: id, RunnerID: 999, ManagerID: 999, TokenDigest: token.Digest(fmt.Sprint("glcbt-other-", id)), At: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	steal(raced)
	r, job := e.request(tok, "s_1", "")
	expectCode(t, "request racing another replica", r, http.StatusCreated)
	if job == nil || job.ID != next {
		t.Fatalf("request after a lost race got %+v, want job %d", job, next)
	}
	last := e.enqueue(simpleSpec("last"))
	steal(last)
	r, _ = e.request(tok, "s_2", "")
	expectCode(t, "request whose only job was taken", r, http.StatusNoContent)
}

func TestCancel(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pending := e.enqueue(simpleSpec("queued"))
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", pending), nil)
	expectCode(t, "cancel pending", r, http.StatusCreated)
	var j restapi.JobJSON
	r.json(t, &j)
	if j.Status != "canceled" {
		t.Fatalf("canceled pending job: %+v", j)
	}
	r, _ = e.request(tok, "s_1", "")
	expectCode(t, "canceled job is not handed out", r, http.StatusNoContent)

	e.enqueue(simpleSpec("running"))
	job := e.take(tok)
	e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	e.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", job.ID), nil).json(t, &j)
	if j.Status != "canceling" {
		t.Fatalf("canceled running job: %s", j.Status)
	}
	r = e.patch(job, "0-1", []byte("ok"))
	if r.code != http.StatusAccepted || r.header.Get(runnerapi.HeaderJobStatus) != "canceling" {
		t.Fatalf("trace while canceling: %d %v", r.code, r.header)
	}
	r = e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	if r.header.Get(runnerapi.HeaderJobStatus) != "canceling" {
		t.Fatalf("keep-alive while canceling: %v", r.header)
	}
	r = e.update(job, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "job_canceled", Output: &runnerapi.Output{Bytesize: 2, Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE([]byte("ok")))}})
	expectCode(t, "final after cancel", r, http.StatusOK)
	if st := e.job(job.ID); st.Status != store.StatusCanceled || st.FailureReason != "job_canceled" {
		t.Fatalf("after cancel: %+v", st)
	}
	// GitLab's API shows a failure_reason on failed jobs only.
	var shown map[string]any
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/1/jobs/%d", job.ID), nil).json(t, &shown)
	if fr, ok := shown["failure_reason"]; ok || shown["status"] != "canceled" {
		t.Fatalf("cancelled job shown as %v with failure_reason %v", shown["status"], fr)
	}
	expectCode(t, "cancel unknown", e.adminDo("POST", "/api/v4/projects/1/jobs/99999/cancel", nil), http.StatusNotFound)
	expectCode(t, "cancel in wrong project", e.adminDo("POST", fmt.Sprintf("/api/v4/projects/2/jobs/%d/cancel", job.ID), nil), http.StatusNotFound)
}

func TestCancelHandedOutJobAbortsAck(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("a"))
	job := e.take(tok)
	e.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", job.ID), nil)
	r := e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	if r.code != http.StatusForbidden || r.header.Get(runnerapi.HeaderJobStatus) != "canceled" {
		t.Fatalf("ack of canceled job: %d %v", r.code, r.header)
	}
}

// TestRunnerWithoutTwoPhaseCommit: a runner that does not advertise
// two_phase_job_commit (gitlab-runner before 18.5) never acknowledges its
// jobs, so, as on GitLab, a job runs from its hand-out: it shows running
// with its start time, a cancel lets it end gracefully, and the ack
// timeout does not hand it out again while it runs.
func TestRunnerWithoutTwoPhaseCommit(t *testing.T) {
	cfg := Config{AckTimeout: time.Minute, StuckTimeout: 30 * time.Minute, CancelingTimeout: 30 * time.Minute, PendingTimeout: 24 * time.Hour, TimeoutGrace: time.Minute}
	e := newEnv(t, cfg)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("a"))
	e.enqueue(simpleSpec("b"))
	handedOut := e.clock.Now().UTC()
	r := e.do("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: tok, SystemID: "s_old", Info: &runnerapi.Info{Name: "gitlab-runner", Version: "17.9.3"}}, nil)
	expectCode(t, "jobs/request", r, http.StatusCreated)
	var job runnerapi.JobResponse
	r.json(t, &job)
	if j := e.job(job.ID); j.Status != store.StatusRunning || !j.StartedAt.Equal(handedOut) {
		t.Fatalf("job after hand-out: %s, started %v, want running from %v", j.Status, j.StartedAt, handedOut)
	}
	// Its trace and keep-alives are those of a running job; no ack comes.
	e.clock.Advance(2 * time.Minute)
	expectCode(t, "keep-alive", e.update(&job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	if err := e.srv.Reap(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.request(tok, "s_other", ""); r.code != http.StatusCreated {
		t.Fatalf("the other job was not handed out: %d", r.code)
	}
	if r, again := e.request(tok, "s_other", ""); again != nil {
		t.Fatalf("job %d handed out again after the ack timeout while it runs (%d)", again.ID, r.code)
	}
	e.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", job.ID), nil)
	if j := e.job(job.ID); j.Status != store.StatusCanceling {
		t.Fatalf("cancelled running job is %s, want canceling (its after_script still runs)", j.Status)
	}
}

// TestCurrentJobWithJobToken: GET /api/v4/job shows the job of a running
// job's token, CI_JOB_TOKEN included, as GitLab's current-job API.
func TestCurrentJobWithJobToken(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("build"))
	job := e.take(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	script := scriptToken(t, job)
	for _, c := range []struct {
		name string
		r    resp
	}{
		{"runner's token", e.do("GET", "/api/v4/job", nil, map[string]string{runnerapi.HeaderJobToken: job.Token})},
		{"CI_JOB_TOKEN in the query", e.do("GET", "/api/v4/job?job_token="+script, nil, nil)},
	} {
		expectCode(t, c.name, c.r, http.StatusOK)
		var got restapi.JobJSON
		c.r.json(t, &got)
		if got.ID != job.ID || got.Name != "build" || got.Status != "running" {
			t.Errorf("%s: job %d %q %s, want %d build running", c.name, got.ID, got.Name, got.Status, job.ID)
		}
	}
	expectCode(t, "no token", e.do("GET", "/api/v4/job", nil, nil), http.StatusUnauthorized)
	expectCode(t, "bad token", e.do("GET", "/api/v4/job", nil, map[string]string{runnerapi.HeaderJobToken: "glcbt-nope"}), http.StatusUnauthorized)
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	expectCode(t, "a finished job's token", e.do("GET", "/api/v4/job", nil, map[string]string{runnerapi.HeaderJobToken: script}), http.StatusUnauthorized)
}

func TestRunnerEligibility(t *testing.T) {
	e := newEnv(t, Config{})
	project7 := e.createRunner(restapi.CreateRunnerRequest{RunnerType: "project_type", ProjectID: 7})
	group3 := e.createRunner(restapi.CreateRunnerRequest{RunnerType: "group_type", GroupID: 3})
	protected := e.createRunner(restapi.CreateRunnerRequest{AccessLevel: "ref_protected"})
	gpu := e.createRunner(restapi.CreateRunnerRequest{TagList: []string{"gpu"}})

	spec := simpleSpec("p8")
	spec.ProjectID, spec.NamespaceID, spec.RootNamespaceID = 8, 9, 3
	p8 := e.enqueue(spec)
	spec = simpleSpec("gpu")
	spec.Tags = []string{"gpu"}
	g := e.enqueue(spec)
	spec = simpleSpec("prot")
	spec.Ref, spec.Protected = "main", true
	prot := e.enqueue(spec)

	if r, _ := e.request(project7, "s", ""); r.code != http.StatusNoContent {
		t.Fatalf("project 7 runner got a job of another project: %d %s", r.code, r.body)
	}
	if got := e.take(group3); got.ID != p8 {
		t.Fatalf("group runner got %d, want %d (its subgroup's project)", got.ID, p8)
	}
	if got := e.take(protected); got.ID != prot {
		t.Fatalf("protected runner got %d, want %d", got.ID, prot)
	}
	if got := e.take(gpu); got.ID != g {
		t.Fatalf("gpu runner got %d, want %d", got.ID, g)
	}
}

func TestPriorityThenFIFO(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	first := e.enqueue(simpleSpec("first"))
	spec := simpleSpec("urgent")
	spec.Priority = 10
	urgent := e.enqueue(spec)
	second := e.enqueue(simpleSpec("second"))
	for _, want := range []int64{urgent, first, second} {
		if got := e.take(tok); got.ID != want {
			t.Fatalf("got job %d, want %d", got.ID, want)
		}
	}
}

func uploadArtifact(e *env, job *runnerapi.JobResponse, query string, data []byte) resp {
	e.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "artifacts.zip")
	fw.Write(data)
	mw.Close()
	return e.do("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts%s", job.ID, query), buf.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
}

func TestArtifactsBetweenDependentJobs(t *testing.T) {
	e := newEnv(t, Config{MaxArtifactSize: 1024})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	build := e.enqueue(simpleSpec("build"))
	bj := e.take(tok)
	e.update(bj, runnerapi.UpdateJobRequest{State: "running"})
	expectCode(t, "upload", uploadArtifact(e, bj, "?artifact_format=zip&artifact_type=archive&expire_in=1+week", []byte("PK-zip-bytes")), http.StatusCreated)
	expectCode(t, "too large", uploadArtifact(e, bj, "", bytes.Repeat([]byte("x"), 2000)), http.StatusRequestEntityTooLarge)
	expectCode(t, "bad expire_in", uploadArtifact(e, bj, "?expire_in=soon", []byte("x")), http.StatusBadRequest)
	expectCode(t, "bad format", uploadArtifact(e, bj, "?artifact_format=rar", []byte("x")), http.StatusBadRequest)
	r := e.do("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts", bj.ID), []byte("nope"), map[string]string{runnerapi.HeaderJobToken: bj.Token, "Content-Type": "text/plain"})
	expectCode(t, "not multipart", r, http.StatusBadRequest)
	e.update(bj, runnerapi.UpdateJobRequest{State: "success"})
	var shown restapi.JobJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/1/jobs/%d", build), nil).json(t, &shown)
	if want := e.clock.Now().UTC().Add(7 * 24 * time.Hour).Format(time.RFC3339); shown.ArtifactsExpireAt == nil || *shown.ArtifactsExpireAt != want {
		t.Errorf("artifacts_expire_at %v, want %s", shown.ArtifactsExpireAt, want)
	}

	spec := simpleSpec("test")
	spec.Dependencies = []int64{build}
	e.enqueue(spec)
	e.enqueue(simpleSpec("unrelated"))
	tj := e.take(tok)
	if len(tj.Dependencies) != 1 || tj.Dependencies[0].ID != build || tj.Dependencies[0].ArtifactsFile == nil ||
		tj.Dependencies[0].ArtifactsFile.Size != int64(len("PK-zip-bytes")) || tj.Dependencies[0].Token == tj.Token {
		t.Fatalf("dependencies %+v", tj.Dependencies)
	}
	uj := e.take(tok)
	path := fmt.Sprintf("/api/v4/jobs/%d/artifacts", build)
	r = e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: tj.Token})
	if r.code != http.StatusOK || string(r.body) != "PK-zip-bytes" {
		t.Fatalf("download by dependent job: %d %q", r.code, r.body)
	}
	expectCode(t, "download with the dependency's token (the script's)", e.do("GET", path, nil,
		map[string]string{runnerapi.HeaderJobToken: tj.Dependencies[0].Token}), http.StatusOK)
	expectCode(t, "download by unrelated job", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: uj.Token}), http.StatusForbidden)
	expectCode(t, "download by finished job's token", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: bj.Token}), http.StatusForbidden)
	expectCode(t, "download with query token", e.do("GET", path+"?job_token="+tj.Token, nil, nil), http.StatusOK)
	expectCode(t, "download by admin", e.adminDo("GET", path, nil), http.StatusOK)
	expectCode(t, "no token", e.do("GET", path, nil, nil), http.StatusUnauthorized)

	// Expiry: a week later the reaper removes it.
	e.clock.Advance(8 * 24 * time.Hour)
	if err := e.srv.Reap(t.Context()); err != nil {
		t.Fatal(err)
	}
	expectCode(t, "download after expiry", e.adminDo("GET", path, nil), http.StatusNotFound)
}

func TestReaper(t *testing.T) {
	cfg := Config{AckTimeout: time.Minute, StuckTimeout: 30 * time.Minute, CancelingTimeout: 30 * time.Minute, PendingTimeout: 24 * time.Hour, TimeoutGrace: time.Minute}
	e := newEnv(t, cfg)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	ctx := t.Context()

	// Not acknowledged: back to the queue, with a new token next time.
	e.enqueue(simpleSpec("unacked"))
	lost := e.take(tok)
	e.patch(lost, "0-5", []byte("early\n"))
	e.clock.Advance(2 * time.Minute)
	if err := e.srv.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	again := e.take(tok)
	if again.ID != lost.ID || again.Token == lost.Token {
		t.Fatalf("requeued job %d token reused=%v", again.ID, again.Token == lost.Token)
	}
	// Its log starts again with the new hand-out.
	expectCode(t, "new hand-out's log from offset 0", e.patch(again, "0-2", []byte("ok\n")), http.StatusAccepted)
	expectCode(t, "old assignment's ack", e.update(lost, runnerapi.UpdateJobRequest{State: "running"}), http.StatusForbidden)
	e.update(again, runnerapi.UpdateJobRequest{State: "running"})

	// Stuck: no updates for half an hour.
	e.clock.Advance(31 * time.Minute)
	e.srv.Reap(ctx)
	if j := e.job(again.ID); j.Status != store.StatusFailed || j.FailureReason != "no_updates_running" {
		t.Fatalf("stuck job %+v", j)
	}

	// Timeout: a job of 60 s that keeps sending updates but never ends.
	spec := simpleSpec("slow")
	spec.Timeout = 60
	e.enqueue(spec)
	slow := e.take(tok)
	e.update(slow, runnerapi.UpdateJobRequest{State: "running"})
	e.clock.Advance(90 * time.Second)
	e.update(slow, runnerapi.UpdateJobRequest{State: "running"})
	e.srv.Reap(ctx)
	if j := e.job(slow.ID); j.Status != store.StatusRunning {
		t.Fatalf("job reaped within grace: %+v", j)
	}
	e.clock.Advance(31 * time.Second)
	e.srv.Reap(ctx)
	if j := e.job(slow.ID); j.Status != store.StatusFailed || j.FailureReason != "job_execution_timeout" {
		t.Fatalf("timed-out job %+v", j)
	}

	// Canceling without answer.
	e.enqueue(simpleSpec("cancel"))
	c := e.take(tok)
	e.update(c, runnerapi.UpdateJobRequest{State: "running"})
	e.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", c.ID), nil)
	e.clock.Advance(31 * time.Minute)
	e.srv.Reap(ctx)
	if j := e.job(c.ID); j.Status != store.StatusCanceled || j.FailureReason != "no_updates_canceling" {
		t.Fatalf("canceling job %+v", j)
	}

	// Nobody picks it up for a day.
	spec = simpleSpec("orphan")
	spec.Tags = []string{"nobody"}
	o := e.enqueue(spec)
	e.clock.Advance(25 * time.Hour)
	e.srv.Reap(ctx)
	if j := e.job(o); j.Status != store.StatusFailed || j.FailureReason != "stuck_or_timeout_failure" {
		t.Fatalf("unpicked job %+v", j)
	}
	if e.srv.Queue().Len() != 0 {
		t.Fatal("failed job still queued")
	}
}

func TestRestartReloadsQueue(t *testing.T) {
	e := newEnv(t, Config{})
	e.enqueue(simpleSpec("survivor"))
	// A second coordinator on the same store (a restart) finds the job.
	srv2, err := New(Config{}, Options{Store: e.st, Artifacts: e.srv.artifacts, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if srv2.Queue().Len() != 1 {
		t.Fatalf("restarted queue has %d jobs", srv2.Queue().Len())
	}
}

func TestQueueStats(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{TagList: []string{"linux"}})
	spec := simpleSpec("a")
	spec.Tags = []string{"linux"}
	e.enqueue(spec)
	e.clock.Advance(5 * time.Second)
	e.enqueue(spec)
	e.enqueue(simpleSpec("untagged"))
	var all restapi.QueueStats
	e.adminDo("GET", "/api/v4/berth/queue", nil).json(t, &all)
	if all.Queued != 3 || len(all.TagSets) != 2 {
		t.Fatalf("admin view %+v", all)
	}
	var mine restapi.QueueStats
	r := e.do("GET", "/api/v4/berth/queue", nil, map[string]string{runnerapi.HeaderRunnerToken: tok})
	expectCode(t, "runner view", r, http.StatusOK)
	r.json(t, &mine)
	if mine.Queued != 2 || len(mine.TagSets) != 1 || mine.TagSets[0].Tags[0] != "linux" || mine.TagSets[0].OldestWaitSeconds != 5 {
		t.Fatalf("runner view %+v", mine)
	}
	expectCode(t, "anonymous", e.do("GET", "/api/v4/berth/queue", nil, nil), http.StatusUnauthorized)
	expectCode(t, "bad runner token", e.do("GET", "/api/v4/berth/queue", nil, map[string]string{runnerapi.HeaderRunnerToken: "glrt-x"}), http.StatusForbidden)
}

func TestEnqueueEndpointValidates(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.adminDo("POST", "/api/v4/berth/jobs", map[string]any{"name": "", "project_id": 0})
	expectCode(t, "invalid spec", r, http.StatusBadRequest)
	for _, want := range []string{"name: is required", "project_id", "steps"} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("error %s does not mention %q", r.body, want)
		}
	}
	r = e.adminDo("POST", "/api/v4/berth/jobs", simpleSpec("ok"))
	expectCode(t, "valid spec", r, http.StatusCreated)
	var j restapi.JobJSON
	r.json(t, &j)
	if j.Status != "pending" || j.Name != "ok" || j.Stage != "test" || j.Timeout != 3600 {
		t.Fatalf("enqueued %+v", j)
	}
	expectCode(t, "get", e.adminDo("GET", fmt.Sprintf("/api/v4/projects/1/jobs/%d", j.ID), nil), http.StatusOK)
}

func TestCloseReleasesHeldLongPolls(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: time.Hour})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	r, _ := e.request(tok, "s_1", "")
	got := make(chan resp, 1)
	go func() {
		r2, _ := e.request(tok, "s_1", r.header.Get(runnerapi.HeaderLastUpdate))
		got <- r2
	}()
	waitFor(t, "the request to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	e.srv.Close()
	r2 := <-got
	if r2.code != http.StatusNoContent || r2.header.Get(runnerapi.HeaderLastUpdate) == "" {
		t.Fatalf("held request on shutdown: %d %v", r2.code, r2.header)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("m"))
	e.enqueue(simpleSpec("queued"))
	job := e.take(tok)
	e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	e.patch(job, "0-4", []byte("hello"))
	e.update(job, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1})
	r := e.do("GET", "/-/metrics", nil, nil)
	expectCode(t, "metrics", r, http.StatusOK)
	body := string(r.body)
	for _, want := range []string{
		"berth_coordinator_jobs_enqueued_total 2",
		"berth_coordinator_jobs_assigned_total 1",
		`berth_coordinator_jobs_finished_total{failure_reason="script_failure",status="failed"} 1`,
		"berth_coordinator_queue_jobs 1",
		"berth_coordinator_trace_bytes_total 5",
		"berth_coordinator_job_queue_seconds_count 1",
		`berth_coordinator_http_requests_total{code="201",route="POST /api/v4/jobs/request"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestAckRecordedByAnotherReplica: a runner's ack that another replica
// recorded before dying (this replica's copy still says pending, no event
// came) is answered as the ack it is when the runner asks again here,
// not 409: the store decides. (TestReplicas saw a job stuck so.)
func TestAckRecordedByAnotherReplica(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	id := e.enqueue(simpleSpec("a"))
	job := e.take(tok)
	now := e.clock.Now()
	if _, err := e.st.TransitionJob(t.Context(), id, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	r := e.update(job, runnerapi.UpdateJobRequest{State: "running"})
	expectCode(t, "the ack again", r, http.StatusOK)
	if st := r.header.Get(runnerapi.HeaderJobStatus); st != "running" {
		t.Fatalf("Job-Status %q", st)
	}
	expectCode(t, "final", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	// A job handed out again (its first hand-out's copy stale here) still
	// refuses the first runner's ack.
	id2 := e.enqueue(simpleSpec("b"))
	first := e.take(tok)
	m := e.job(id2).RunnerManagerID
	if err := e.st.UnassignJob(t.Context(), id2, m); err != nil {
		t.Fatal(err)
	}
	if err := e.st.AssignJob(t.Context(), store.Assignment{JobID: id2, RunnerID: e.job(id2).RunnerID, ManagerID: m, TokenDigest: "another", At: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.TransitionJob(t.Context(), id2, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	expectCode(t, "the first hand-out's ack", e.update(first, runnerapi.UpdateJobRequest{State: "running"}), http.StatusConflict)
}

// TestLateAckOfAnEarlierHandOutIsRefused: a job handed out again by
// another replica (its store row moved on; this replica's copy did not)
// is not started by the first runner's late acknowledgement.
func TestLateAckOfAnEarlierHandOutIsRefused(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("handed out twice"))
	first := e.take(tok)
	ctx := t.Context()
	// Another replica: the first hand-out not acknowledged in time, the
	// job handed to another manager, all in the shared store.
	stale := e.job(first.ID)
	if err := e.st.UnassignJob(ctx, first.ID, stale.RunnerManagerID); err != nil {
		t.Fatal(err)
	}
	other := strings.Repeat("ab", 32)
	if err := e.st.AssignJob(ctx, store.Assignment{JobID: first.ID, RunnerID: stale.RunnerID, ManagerID: stale.RunnerManagerID + 100,
		TokenDigest: other, At: e.clock.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	r := e.update(first, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning})
	if r.code == http.StatusOK {
		t.Fatal("a stale hand-out's acknowledgement started the job")
	}
	got, err := e.st.GetJob(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.StatusPending || got.TokenDigest != other {
		t.Fatalf("job after the stale acknowledgement: %s, digest %q", got.Status, got.TokenDigest)
	}
}
