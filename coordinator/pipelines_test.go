package coordinator

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// takeWait asks for a job like a runner does, long polling while none is
// queued (the engine enqueues the next jobs asynchronously).
func (e *env) takeWait(tok string) *runnerapi.JobResponse {
	e.t.Helper()
	last := ""
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r, job := e.request(tok, "s_test", last)
		if job != nil {
			return job
		}
		last = r.header.Get(runnerapi.HeaderLastUpdate)
	}
	e.t.Fatal("no job was handed out")
	return nil
}

// runJob takes the next job and finishes it with state (and exit code for
// failed), returning the payload.
func (e *env) runJob(tok, state string, exit int) *runnerapi.JobResponse {
	e.t.Helper()
	job := e.takeWait(tok)
	expectCode(e.t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	upd := runnerapi.UpdateJobRequest{State: state, ExitCode: exit}
	if state == "failed" {
		upd.FailureReason = "script_failure"
	}
	expectCode(e.t, "finish "+job.JobInfo.Name, e.update(job, upd), http.StatusOK)
	return job
}

func (e *env) createPipeline(t *testing.T, project, ref string) restapi.PipelineJSON {
	t.Helper()
	r := e.adminDo("POST", "/api/v4/projects/"+project+"/pipeline?ref="+ref, nil)
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	return pl
}

func statusOf(st pipelines.PipelineState, name string) store.Status {
	latest, _ := latestStatuses(st)
	return latest[name]
}

func TestPushCreatesPipelines(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "demo")
	ctx := t.Context()
	cfg := `
src:
  script: [x]
  rules:
    - changes: [src/**]
docs:
  script: [x]
  rules:
    - changes: [docs/**]
tagged:
  script: [x]
  rules:
    - if: $CI_COMMIT_TAG
`
	first := e.pushFiles(t, "demo", "main", map[string]string{".gitlab-ci.yml": cfg, "src/a": "1", "docs/a": "1"})
	second := e.pushFiles(t, "demo", "main", map[string]string{"docs/a": "2"})
	ps, err := e.st.ListPipelines(ctx, store.PipelineFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("pipelines after two pushes: %d, want 2", len(ps))
	}
	if p := ps[0]; p.Source != "push" || p.Sha != first || p.BeforeSha != strings.Repeat("0", 40) || p.Ref != "main" || p.Tag {
		t.Errorf("first push pipeline %+v", p)
	}
	if p := ps[1]; p.Sha != second || p.BeforeSha != first {
		t.Errorf("second push pipeline %+v: want before_sha %s", p, first)
	}
	names := func(id int64) []string {
		jobs, err := e.st.ListJobs(ctx, store.JobFilter{PipelineID: id})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, j := range jobs {
			out = append(out, j.Name)
		}
		return out
	}
	// A new branch has no diff: changes are true (as GitLab). The second
	// push changed docs only.
	if got := names(ps[0].ID); !slices.Equal(got, []string{"src", "docs"}) {
		t.Errorf("first pipeline jobs %v, want [src docs]", got)
	}
	if got := names(ps[1].ID); !slices.Equal(got, []string{"docs"}) {
		t.Errorf("second pipeline jobs %v, want [docs] (rules:changes against before_sha)", got)
	}

	// A tag.
	dir := t.TempDir()
	testenv.Git(t, dir, nil, "init", "-q")
	remote := e.http.URL + "/demo.git"
	testenv.Git(t, dir, testenv.GitBasicAuth("x", e.admin), "fetch", "-q", remote, "main")
	testenv.Git(t, dir, nil, "tag", "-a", "-m", "v1", "v1.0", "FETCH_HEAD")
	testenv.Git(t, dir, testenv.GitBasicAuth("x", e.admin), "push", "-q", remote, "refs/tags/v1.0")
	ps, _ = e.st.ListPipelines(ctx, store.PipelineFilter{Newest: true, Limit: 1})
	if len(ps) != 1 || !ps[0].Tag || ps[0].Ref != "v1.0" || ps[0].Sha != second || ps[0].Protected {
		t.Fatalf("tag pipeline %+v", ps)
	}
	if got := names(ps[0].ID); !slices.Contains(got, "tagged") {
		t.Errorf("tag pipeline jobs %v: want tagged (CI_COMMIT_TAG set)", got)
	}

	// No configuration: no pipeline. Invalid configuration: a failed
	// pipeline with the errors, as GitLab.
	n := len(mustPipelines(t, e))
	e.pushFiles(t, "demo", "empty", map[string]string{".gitlab-ci.yml": ""})
	if got := len(mustPipelines(t, e)); got != n+1 {
		// an empty file is a configuration error: a failed pipeline
		t.Errorf("pipelines after pushing an empty configuration: %d, want %d", got, n+1)
	}
	e.pushFiles(t, "demo", "broken", map[string]string{".gitlab-ci.yml": "job:\n  script: [x]\n  when: sometimes\n"})
	ps = mustPipelines(t, e)
	last := ps[len(ps)-1]
	if last.Ref != "broken" || last.Status != store.StatusFailed || !strings.Contains(last.YAMLErrors, ".gitlab-ci.yml:3:") {
		t.Errorf("broken configuration: pipeline %+v, want failed with positioned yaml_errors", last)
	}
	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/demo/pipelines/%d", last.ID), nil)
	var pj restapi.PipelineJSON
	r.json(t, &pj)
	if pj.YAMLErrors == nil || pj.Status != "failed" {
		t.Errorf("API: %+v", pj)
	}
	// A branch without a CI file.
	n = len(ps)
	otherDir := t.TempDir()
	testenv.Git(t, otherDir, nil, "init", "-q", "-b", "plain")
	testenv.Git(t, otherDir, nil, "commit", "-q", "--allow-empty", "-m", "nothing")
	testenv.Git(t, otherDir, testenv.GitBasicAuth("x", e.admin), "push", "-q", remote, "plain")
	if got := len(mustPipelines(t, e)); got != n {
		t.Errorf("pipelines after pushing a commit without .gitlab-ci.yml: %d, want %d", got, n)
	}
}

func mustPipelines(t *testing.T, e *env) []*store.Pipeline {
	t.Helper()
	ps, err := e.st.ListPipelines(t.Context(), store.PipelineFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestGitAccess(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "private")
	r := e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: "open", Visibility: "public"})
	expectCode(t, "create public project", r, http.StatusCreated)
	e.pushFiles(t, "private", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\nb:\n  script: [x]\n"})
	e.pushFiles(t, "open", "main", map[string]string{"README": "hi"})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	running := e.take(tok)
	expectCode(t, "ack", e.update(running, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	finished := e.runJob(tok, "success", 0)

	req := func(path, user, pass string) int {
		rq, _ := http.NewRequest("GET", e.http.URL+path, nil)
		if user != "" || pass != "" {
			rq.SetBasicAuth(user, pass)
		}
		res, err := e.http.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	const fetch, push = "?service=git-upload-pack", "?service=git-receive-pack"
	tests := []struct {
		name, path, user, pass string
		want                   int
	}{
		{"anonymous, private", "/private.git/info/refs" + fetch, "", "", http.StatusUnauthorized},
		{"anonymous, public", "/open.git/info/refs" + fetch, "", "", http.StatusOK},
		{"anonymous push, public", "/open.git/info/refs" + push, "", "", http.StatusUnauthorized},
		{"admin fetch", "/private.git/info/refs" + fetch, "anyone", e.admin, http.StatusOK},
		{"admin push", "/private.git/info/refs" + push, "anyone", e.admin, http.StatusOK},
		{"running job fetch", "/private.git/info/refs" + fetch, "gitlab-ci-token", running.Token, http.StatusOK},
		{"running job push", "/private.git/info/refs" + push, "gitlab-ci-token", running.Token, http.StatusForbidden},
		{"running job, other public project", "/open.git/info/refs" + fetch, "gitlab-ci-token", running.Token, http.StatusOK},
		// Without access, a private project answers like a missing one
		// (issue 9, defect 3: 403 told an outsider it exists).
		{"job token under another user name", "/private.git/info/refs" + fetch, "root", running.Token, http.StatusNotFound},
		{"finished job", "/private.git/info/refs" + fetch, "gitlab-ci-token", finished.Token, http.StatusNotFound},
		{"wrong token", "/private.git/info/refs" + fetch, "gitlab-ci-token", "glcbt-nope", http.StatusNotFound},
		{"any credentials, private", "/private.git/info/refs" + fetch, "x", "", http.StatusNotFound},
		{"any credentials, missing", "/nope.git/info/refs" + fetch, "x", "", http.StatusNotFound},
		{"any credentials push, public", "/open.git/info/refs" + push, "x", "y", http.StatusForbidden},
		{"missing project, admin", "/nope.git/info/refs" + fetch, "x", e.admin, http.StatusNotFound},
		{"missing project, anonymous", "/nope.git/info/refs" + fetch, "", "", http.StatusUnauthorized},
		{"dumb protocol", "/private.git/info/refs", "x", e.admin, http.StatusForbidden},
		{"not a git path", "/private.git/objects/info/packs", "x", e.admin, http.StatusNotFound},
	}
	for _, tt := range tests {
		if got := req(tt.path, tt.user, tt.pass); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	// A real clone with the running job's token works; a push with it
	// is refused by git.
	dir := t.TempDir()
	if _, err := testenv.GitOutput(dir, nil, "clone", "-q", running.GitInfo.RepoURL, "c"); err != nil {
		t.Fatalf("clone with the job token: %v", err)
	}
	if _, err := testenv.GitOutput(dir+"/c", nil, "push", "-q", "origin", "HEAD:refs/heads/evil"); err == nil {
		t.Error("push with a job token succeeded")
	}
}

func TestCreatePipelineErrors(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "workflow:\n  rules:\n    - if: $CI_COMMIT_BRANCH == \"other\"\na:\n  script: [x]\n"}, "-o", "ci.skip")
	e.pushFiles(t, "p", "bad", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n  needs: [nope]\n"}, "-o", "ci.skip")
	tests := []struct {
		name, path string
		code       int
		want       string
	}{
		{"unknown ref", "/api/v4/projects/p/pipeline?ref=nope", http.StatusBadRequest, `{"message":{"base":["Reference not found"]}}`},
		{"no ref", "/api/v4/projects/p/pipeline", http.StatusBadRequest, "ref is missing"},
		{"filtered by workflow rules", "/api/v4/projects/p/pipeline?ref=main", http.StatusBadRequest, "workflow"},
		{"invalid configuration", "/api/v4/projects/p/pipeline?ref=bad", http.StatusBadRequest, ".gitlab-ci.yml:3:"},
		{"unknown project", "/api/v4/projects/nope/pipeline?ref=main", http.StatusNotFound, "Project Not Found"},
	}
	for _, tt := range tests {
		r := e.adminDo("POST", tt.path, nil)
		if r.code != tt.code || !strings.Contains(string(r.body), tt.want) {
			t.Errorf("%s: %d %s, want %d containing %q", tt.name, r.code, r.body, tt.code, tt.want)
		}
	}
	if n := len(mustPipelines(t, e)); n != 0 {
		t.Errorf("failed API creations stored %d pipelines, want 0", n)
	}
	r := e.do("POST", "/api/v4/projects/p/pipeline?ref=main", nil, nil)
	expectCode(t, "without admin token", r, http.StatusUnauthorized)
}

func TestPipelineCancelAndRetry(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "stages: [a, b]\none:\n  stage: a\n  script: [x]\ntwo:\n  stage: a\n  script: [x]\nthree:\n  stage: b\n  script: [x]\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	running := e.take(tok)
	expectCode(t, "ack", e.update(running, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)

	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/cancel", pl.ID), nil)
	expectCode(t, "cancel pipeline", r, http.StatusOK)
	st := waitPipeline(t, e, pl.ID, "cancel", func(st pipelines.PipelineState) bool {
		return statusOf(st, "three") == store.StatusCanceled && st.Pipeline.Status == store.StatusCanceling
	})
	if s := statusOf(st, running.JobInfo.Name); s != store.StatusCanceling {
		t.Errorf("running job after cancel: %s, want canceling", s)
	}
	// The runner sees canceling and reports; the pipeline is canceled.
	expectCode(t, "final", e.update(running, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "job_canceled"}), http.StatusOK)
	waitPipeline(t, e, pl.ID, "canceled", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusCanceled })
	if r, _ := e.request(tok, "s_test", ""); r.code != http.StatusNoContent {
		t.Errorf("a job of the canceled pipeline is still queued: %d", r.code)
	}

	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/retry", pl.ID), nil)
	expectCode(t, "retry pipeline", r, http.StatusCreated)
	e.runJob(tok, "success", 0)
	e.runJob(tok, "success", 0)
	e.runJob(tok, "success", 0)
	st = waitPipeline(t, e, pl.ID, "success after retry", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
	if len(st.Jobs) != 6 {
		t.Errorf("jobs after a retry of all three: %d, want 6 (3 retried)", len(st.Jobs))
	}
	if !st.Pipeline.FinishedAt.After(time.Time{}) {
		t.Error("finished_at not set after the retry succeeded")
	}
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/retry", pl.ID), nil)
	expectCode(t, "retry of a passed pipeline", r, http.StatusForbidden)

	// Retry of one job; then again of the same (old) job is refused.
	old := st.Jobs[len(st.Jobs)-1]
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/retry", old.ID), nil)
	expectCode(t, "retry job", r, http.StatusCreated)
	var nj restapi.JobJSON
	r.json(t, &nj)
	if nj.ID == old.ID || nj.Name != old.Name || nj.Status != "pending" {
		t.Errorf("retried job %+v, want a new pending %s", nj, old.Name)
	}
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/retry", old.ID), nil)
	expectCode(t, "retry of a retried job", r, http.StatusForbidden)
}

func TestFailureSkipsLaterStagesAndRetryResetsThem(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
stages: [build, test, cleanup]
build:
  stage: build
  script: [x]
test:
  stage: test
  script: [x]
notify:
  stage: cleanup
  script: [x]
  when: on_failure
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	build := e.runJob(tok, "failed", 2)
	st := waitPipeline(t, e, pl.ID, "failure handling", func(st pipelines.PipelineState) bool {
		return statusOf(st, "test") == store.StatusSkipped && statusOf(st, "notify") == store.StatusPending
	})
	e.runJob(tok, "success", 0) // notify
	st = waitPipeline(t, e, pl.ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/p/jobs/%d", build.ID), nil)
	var bj restapi.JobJSON
	r.json(t, &bj)
	if bj.ExitCode == nil || *bj.ExitCode != 2 || bj.FailureReason != "script_failure" {
		t.Errorf("build job in the API: %+v", bj)
	}

	// Retrying build makes the skipped test job wait for it again.
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/retry", build.ID), nil)
	expectCode(t, "retry", r, http.StatusCreated)
	st, err := e.srv.pipelines.PipelineState(t.Context(), pl.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s := statusOf(st, "test"); s != store.StatusCreated {
		t.Errorf("test after retrying build: %s, want created", s)
	}
	if st.Pipeline.Status != store.StatusRunning && st.Pipeline.Status != store.StatusPending {
		t.Errorf("pipeline after retry: %s, want pending or running", st.Pipeline.Status)
	}
	e.runJob(tok, "success", 0) // build again
	e.runJob(tok, "success", 0) // test
	st = waitPipeline(t, e, pl.ID, "success", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
	if s := statusOf(st, "notify"); s != store.StatusSuccess {
		t.Errorf("notify keeps its own run: %s", s)
	}
}

func TestDelayedAndResourceGroupJobs(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
later:
  script: [x]
  when: delayed
  start_in: 5 minutes
deploy:
  script: [x]
  resource_group: production
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	p1 := e.createPipeline(t, "p", "main")
	p2 := e.createPipeline(t, "p", "main")
	st1, _ := e.srv.pipelines.PipelineState(t.Context(), p1.ID)
	st2, _ := e.srv.pipelines.PipelineState(t.Context(), p2.ID)
	if s := statusOf(st1, "deploy"); s != store.StatusPending {
		t.Errorf("first deploy: %s, want pending", s)
	}
	if s := statusOf(st2, "deploy"); s != store.StatusWaitingForResource {
		t.Errorf("second deploy: %s, want waiting_for_resource (one at a time)", s)
	}
	if s := statusOf(st1, "later"); s != store.StatusScheduled {
		t.Errorf("delayed job: %s, want scheduled", s)
	}
	var sched *store.Job
	for _, j := range st1.Jobs {
		if j.Name == "later" {
			sched = j
		}
	}
	if want := e.clock.Now().Add(5 * time.Minute); !sched.ScheduledAt.Equal(want) {
		t.Errorf("scheduled at %v, want %v", sched.ScheduledAt, want)
	}
	if st1.Pipeline.Status != store.StatusRunning {
		t.Errorf("pipeline 1: %s, want running (pending and scheduled jobs)", st1.Pipeline.Status)
	}

	// The first deploy finishes: the second takes the resource.
	job := e.runJob(tok, "success", 0)
	if job.JobInfo.Name != "deploy" || job.JobInfo.PipelineID != p1.ID {
		t.Fatalf("ran %s of pipeline %d, want deploy of %d", job.JobInfo.Name, job.JobInfo.PipelineID, p1.ID)
	}
	waitPipeline(t, e, p2.ID, "the resource", func(st pipelines.PipelineState) bool { return statusOf(st, "deploy") == store.StatusPending })

	// Playing a scheduled job runs it at once.
	st2, _ = e.srv.pipelines.PipelineState(t.Context(), p2.ID)
	for _, j := range st2.Jobs {
		if j.Name == "later" {
			r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/play", j.ID), nil)
			expectCode(t, "play scheduled", r, http.StatusOK)
			var out restapi.JobJSON
			r.json(t, &out)
			if out.Status != "pending" {
				t.Errorf("played scheduled job: %s, want pending", out.Status)
			}
		}
	}

	// Time passes: the delayed job becomes pending (the reaper notices
	// with the injected clock).
	if err := e.srv.Reap(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.pipelines.ProcessPipeline(t.Context(), p1.ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.srv.pipelines.PipelineState(t.Context(), p1.ID); statusOf(st, "later") != store.StatusScheduled {
		t.Errorf("delayed job before its time: %s, want scheduled", statusOf(st, "later"))
	}
	e.clock.Advance(5 * time.Minute)
	if err := e.srv.Reap(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitPipeline(t, e, p1.ID, "the delayed job", func(st pipelines.PipelineState) bool { return statusOf(st, "later") == store.StatusPending })
}

func TestProtectedVariablesOnlyOnProtectedRefs(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	for _, v := range []map[string]any{
		{"key": "PROTECTED", "value": "p", "protected": true},
		{"key": "PLAIN", "value": "v", "variable_type": "file", "raw": true},
	} {
		expectCode(t, "variable", e.adminDo("POST", "/api/v4/projects/p/variables", v), http.StatusCreated)
	}
	e.pushFiles(t, "p", "feature", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n  variables:\n    PLAIN: yaml\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.createPipeline(t, "p", "feature")
	job := e.take(tok)
	if _, ok := variable(job, "PROTECTED"); ok {
		t.Error("a protected variable reached a job of an unprotected branch")
	}
	// Project variables win over YAML ones (the last definition wins).
	if v, _ := variable(job, "PLAIN"); v.Value != "v" || !v.File || !v.Raw {
		t.Errorf("PLAIN = %+v, want the project's file variable", v)
	}
	if v, _ := variable(job, "CI_COMMIT_REF_PROTECTED"); v.Value != "false" {
		t.Errorf("CI_COMMIT_REF_PROTECTED = %q", v.Value)
	}
}

func TestVariablesAPI(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "g/p")
	base := "/api/v4/projects/g%2Fp/variables"
	tests := []struct {
		name, method, path string
		body               any
		code               int
	}{
		{"create", "POST", base, map[string]any{"key": "A", "value": "1"}, http.StatusCreated},
		{"duplicate", "POST", base, map[string]any{"key": "A", "value": "2"}, http.StatusBadRequest},
		{"bad key", "POST", base, map[string]any{"key": "A-B", "value": "2"}, http.StatusBadRequest},
		{"short masked", "POST", base, map[string]any{"key": "M", "value": "short", "masked": true}, http.StatusBadRequest},
		{"bad type", "POST", base, map[string]any{"key": "T", "value": "x", "variable_type": "dir"}, http.StatusBadRequest},
		{"environment scope", "POST", base, map[string]any{"key": "E", "value": "x", "environment_scope": "prod"}, http.StatusBadRequest},
		{"get", "GET", base + "/A", nil, http.StatusOK},
		{"update", "PUT", base + "/A", map[string]any{"value": "changed", "protected": true}, http.StatusOK},
		{"get missing", "GET", base + "/NOPE", nil, http.StatusNotFound},
		{"delete", "DELETE", base + "/A", nil, http.StatusNoContent},
		{"delete again", "DELETE", base + "/A", nil, http.StatusNotFound},
		{"missing project", "GET", "/api/v4/projects/nope/variables", nil, http.StatusNotFound},
	}
	for _, tt := range tests {
		r := e.adminDo(tt.method, tt.path, tt.body)
		if r.code != tt.code {
			t.Errorf("%s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
		}
		if tt.name == "update" {
			var v restapi.VariableJSON
			r.json(t, &v)
			if v.Value != "changed" || !v.Protected || v.VariableType != "env_var" {
				t.Errorf("updated variable %+v", v)
			}
		}
	}
	// Form bodies, as many GitLab clients send them.
	r := e.do("POST", base, []byte("key=F&value=from-form&variable_type=file"),
		map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Content-Type": "application/x-www-form-urlencoded"})
	expectCode(t, "form body", r, http.StatusCreated)
	var v restapi.VariableJSON
	r.json(t, &v)
	if v.Key != "F" || v.VariableType != "file" {
		t.Errorf("form-created variable %+v", v)
	}
}

func TestProjectsAPI(t *testing.T) {
	e := newGitEnv(t, Config{})
	tests := []struct {
		name string
		body restapi.CreateProjectRequest
		code int
		path string
	}{
		{"simple", restapi.CreateProjectRequest{Name: "demo"}, http.StatusCreated, "demo"},
		{"namespaced", restapi.CreateProjectRequest{Path: "app", NamespacePath: "group/sub"}, http.StatusCreated, "group/sub/app"},
		{"taken", restapi.CreateProjectRequest{Path: "demo"}, http.StatusBadRequest, ""},
		{"bad path", restapi.CreateProjectRequest{Path: "bad path"}, http.StatusBadRequest, ""},
		{"ends with .git", restapi.CreateProjectRequest{Path: "x.git"}, http.StatusBadRequest, ""},
		{"bad visibility", restapi.CreateProjectRequest{Path: "v", Visibility: "secret"}, http.StatusBadRequest, ""},
		{"bad branch", restapi.CreateProjectRequest{Path: "b", DefaultBranch: "a..b"}, http.StatusBadRequest, ""},
	}
	for _, tt := range tests {
		r := e.adminDo("POST", "/api/v4/projects", tt.body)
		if r.code != tt.code {
			t.Errorf("%s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
			continue
		}
		if tt.path != "" {
			var p restapi.ProjectJSON
			r.json(t, &p)
			if p.PathWithNamespace != tt.path {
				t.Errorf("%s: path %q, want %q", tt.name, p.PathWithNamespace, tt.path)
			}
			// Found by id and by URL-encoded path.
			for _, ref := range []string{fmt.Sprint(p.ID), strings.ReplaceAll(tt.path, "/", "%2F")} {
				r := e.adminDo("GET", "/api/v4/projects/"+ref, nil)
				var got restapi.ProjectJSON
				if r.code == http.StatusOK {
					r.json(t, &got)
				}
				if got.ID != p.ID {
					t.Errorf("GET /projects/%s: %d %s", ref, r.code, r.body)
				}
			}
		}
	}
	r := e.adminDo("GET", "/api/v4/projects?per_page=1&page=2", nil)
	var list []restapi.ProjectJSON
	r.json(t, &list)
	if len(list) != 1 || list[0].PathWithNamespace != "group/sub/app" || r.header.Get("X-Total") != "2" {
		t.Errorf("second page of projects %+v (X-Total %q)", list, r.header.Get("X-Total"))
	}
}

func TestTraceRange(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("j"))
	job := e.take(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "patch", e.patch(job, "0-9", []byte("0123456789")), http.StatusAccepted)
	path := fmt.Sprintf("/api/v4/projects/1/jobs/%d/trace", job.ID)
	for _, tt := range []struct {
		rng  string
		code int
		body string
	}{
		{"", http.StatusOK, "0123456789"},
		{"bytes=4-", http.StatusPartialContent, "456789"},
		{"bytes=10-", http.StatusPartialContent, ""},
		{"bytes=11-", http.StatusRequestedRangeNotSatisfiable, ""},
	} {
		h := map[string]string{runnerapi.HeaderPrivateToken: e.admin}
		if tt.rng != "" {
			h["Range"] = tt.rng
		}
		r := e.do("GET", path, nil, h)
		if r.code != tt.code || (tt.code != http.StatusRequestedRangeNotSatisfiable && string(r.body) != tt.body) {
			t.Errorf("Range %q: %d %q, want %d %q", tt.rng, r.code, r.body, tt.code, tt.body)
		}
	}
	// Berth's id-only lookup finds the job and its project.
	r := e.adminDo("GET", fmt.Sprintf("/api/v4/berth/jobs/%d", job.ID), nil)
	var j restapi.JobJSON
	r.json(t, &j)
	if j.ID != job.ID || j.Project.ID != 1 || j.Status != "running" {
		t.Errorf("berth job lookup %+v", j)
	}
}

func TestWatchPipelineStopsOnContext(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"}, "-o", "ci.skip")
	pl, err := e.srv.pipelines.CreatePipeline(t.Context(), pipelines.PipelineRequest{ProjectID: 1, Ref: "main"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		errc <- e.srv.pipelines.WatchPipeline(ctx, pl.ID, func(pipelines.PipelineState) bool { return true })
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("WatchPipeline after cancel: %v, want context.Canceled", err)
	}
	if _, err := e.srv.pipelines.PipelineState(t.Context(), pl.ID+100); err == nil {
		t.Error("pipelines.PipelineState of a missing pipeline: no error")
	}
}

func TestPipelineRequestJobs(t *testing.T) {
	e := newGitEnv(t, Config{})
	p, err := e.srv.pipelines.CreateProject(t.Context(), pipelines.ProjectSpec{Path: "p"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(e2eConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	sha, err := e.srv.pipelines.CommitDir(t.Context(), p.ID, "main", dir, "in process")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		jobs []string
		want []string
	}{
		{[]string{"unit"}, []string{"build", "unit: [1.25]", "unit: [1.26]"}},
		{[]string{"unit: [1.26]", "lint"}, []string{"build", "lint", "unit: [1.26]"}},
		{[]string{"deploy"}, []string{"build", "deploy", "docs", "flaky", "lint", "unit: [1.25]", "unit: [1.26]"}},
	}
	for _, tt := range tests {
		pl, err := e.srv.pipelines.CreatePipeline(t.Context(), pipelines.PipelineRequest{ProjectID: p.ID, Ref: "main", Sha: sha, Jobs: tt.jobs})
		if err != nil {
			t.Fatalf("%v: %v", tt.jobs, err)
		}
		st, _ := e.srv.pipelines.PipelineState(t.Context(), pl.ID)
		var names []string
		for _, j := range st.Jobs {
			names = append(names, j.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, tt.want) {
			t.Errorf("Jobs %v: pipeline has %v, want %v", tt.jobs, names, tt.want)
		}
	}
	_, err = e.srv.pipelines.CreatePipeline(t.Context(), pipelines.PipelineRequest{ProjectID: p.ID, Ref: "main", Jobs: []string{"nope"}})
	var pe *pipelines.PipelineError
	if !errors.As(err, &pe) || !strings.Contains(pe.Error(), `"nope"`) {
		t.Errorf("unknown job: %v, want a pipelines.PipelineError naming it", err)
	}
	if _, err := e.srv.pipelines.CreateProject(t.Context(), pipelines.ProjectSpec{Path: "p"}); !errors.Is(err, pipelines.ErrExists) {
		t.Errorf("second CreateProject: %v, want pipelines.ErrExists", err)
	}
}

func TestRestartResumesPipelines(t *testing.T) {
	e := newGitEnv(t, Config{})
	p, err := e.srv.pipelines.CreateProject(t.Context(), pipelines.ProjectSpec{Path: "p"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte("stages: [a, b]\none:\n  stage: a\n  script: [x]\ntwo:\n  stage: b\n  script: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.pipelines.CommitDir(t.Context(), p.ID, "main", dir, "m"); err != nil {
		t.Fatal(err)
	}
	pl, err := e.srv.pipelines.CreatePipeline(t.Context(), pipelines.PipelineRequest{ProjectID: p.ID, Ref: "main"})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Close()
	// The first job finished while no engine ran (a crash between the
	// runner's final update and the engine's pass).
	st, _ := e.srv.pipelines.PipelineState(t.Context(), pl.ID)
	if _, err := e.st.TransitionJob(t.Context(), st.Jobs[0].ID, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusSuccess, FinishedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	srv2, err := New(Config{}, Options{Store: e.st, Artifacts: e.srv.artifacts, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	e2 := &env{t: t, srv: srv2, st: e.st, clock: e.clock}
	waitPipeline(t, e2, pl.ID, "the restarted engine", func(st pipelines.PipelineState) bool {
		return statusOf(st, "two") == store.StatusPending && st.Pipeline.Status == store.StatusRunning
	})
	if srv2.Queue().Len() != 1 {
		t.Errorf("restarted queue has %d jobs, want the second stage's one", srv2.Queue().Len())
	}
}

// TestCIFileOverTheLimit: a push of a CI file over the size limit created
// no pipeline and the API answered 500 (issue 9, defect 4). Now the push
// gives a failed pipeline whose YAML error names the limit, and the API a
// 400.
func TestCIFileOverTheLimit(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	big := "a:\n  script: [x]\n" + strings.Repeat("# padding padding padding padding\n", (17<<20)/34) // over gitrepo.MaxFileSize too
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": big})
	var pl *store.Pipeline
	waitFor(t, "a failed pipeline", func() bool {
		ps := mustPipelines(t, e)
		if len(ps) == 1 {
			pl = ps[0]
		}
		return pl != nil
	})
	if pl.Status != store.StatusFailed || !strings.Contains(pl.YAMLErrors, "larger than the limit of 1048576 bytes") {
		t.Errorf("pipeline %s, yaml errors %q; want failed naming the limit", pl.Status, pl.YAMLErrors)
	}
	r := e.adminDo("POST", "/api/v4/projects/p/pipeline?ref=main", nil)
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "larger than the limit") {
		t.Errorf("API: %d %s, want 400 naming the limit", r.code, r.body)
	}
}

// TestCacheKeysSeparatedByProtection: as GitLab (separate caches for
// protected branches), a job's cache keys carry "-protected" on the
// default branch and "-non_protected" elsewhere or with unprotect: true;
// the runner uses them as they come.
func TestCacheKeysSeparatedByProtection(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	yml := "a:\n  script: [x]\n  cache:\n    - key: deps-$CI_COMMIT_REF_SLUG\n      fallback_keys: [deps-main]\n      paths: [vendor/]\n    - key: tmp\n      unprotect: true\n      paths: [tmp/]\n"
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	for _, tc := range []struct {
		ref  string
		want []string
	}{
		{"main", []string{"deps-$CI_COMMIT_REF_SLUG-protected [deps-main-protected]", "tmp-non_protected []"}},
		{"feature", []string{"deps-$CI_COMMIT_REF_SLUG-non_protected [deps-main-non_protected]", "tmp-non_protected []"}},
	} {
		e.pushFiles(t, "p", tc.ref, map[string]string{".gitlab-ci.yml": yml}, "-o", "ci.skip")
		e.createPipeline(t, "p", tc.ref)
		job := e.take(tok)
		var got []string
		for _, c := range job.Cache {
			got = append(got, fmt.Sprintf("%s %v", c.Key, c.FallbackKeys))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: cache keys %q, want %q", tc.ref, got, tc.want)
		}
	}
}

// cache:key:files is keyed by the files' contents and files_commits by
// their last commits, as GitLab computes them: a file changed and changed
// back keeps its files key and gets a new files_commits key.
func TestCacheKeysFromFiles(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	yml := `a:
  script: [x]
  cache:
    - key: {files: [Gemfile.lock, "**/package.json"], prefix: gems}
      paths: [vendor/]
    - key: {files_commits: [Gemfile.lock]}
      paths: [tmp/]
    - key: {files: [missing.lock]}
      paths: [x/]
`
	blob := func(content string) string {
		cmd := exec.Command("git", "hash-object", "--stdin")
		cmd.Stdin = strings.NewReader(content)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	digest := func(ids ...string) string {
		slices.Sort(ids)
		sum := sha1.Sum([]byte(strings.Join(ids, "-")))
		return hex.EncodeToString(sum[:])
	}
	keys := func() []string {
		e.createPipeline(t, "p", "feature")
		var got []string
		for _, c := range e.take(tok).Cache {
			got = append(got, c.Key)
		}
		return got
	}
	pkg := blob("{}\n")
	first := e.pushFiles(t, "p", "feature", map[string]string{".gitlab-ci.yml": yml, "Gemfile.lock": "v1\n", "web/package.json": "{}\n"}, "-o", "ci.skip")
	want := []string{
		"gems-" + digest(blob("v1\n"), pkg) + "-non_protected",
		digest(first) + "-non_protected",
		"default-non_protected",
	}
	if got := keys(); !slices.Equal(got, want) {
		t.Fatalf("keys %q, want %q", got, want)
	}
	e.pushFiles(t, "p", "feature", map[string]string{"Gemfile.lock": "v2\n"}, "-o", "ci.skip")
	back := e.pushFiles(t, "p", "feature", map[string]string{"Gemfile.lock": "v1\n", "README": "x"}, "-o", "ci.skip")
	want[1] = digest(back) + "-non_protected"
	if got := keys(); !slices.Equal(got, want) {
		t.Errorf("after changing Gemfile.lock and back: keys %q, want %q", got, want)
	}
}

// A job's log growing wakes an in-process watcher of its pipeline (berth
// run reads logs when they arrive, not on a timer).
func TestTraceAppendWakesPipelineWatchers(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	id := e.enqueue(simpleSpec("a"))
	job := e.take(tok)
	if job == nil || job.ID != id {
		t.Fatalf("took %+v, want job %d", job, id)
	}
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	changed := e.srv.pipelines.PipelineChanged(e.job(id).PipelineID)
	expectCode(t, "patch", e.patch(job, "0-5", []byte("hello\n")), http.StatusAccepted)
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("a trace append did not wake the pipeline's watchers")
	}
}
