package coordinator

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/taskscaler/sim"
)

func needGit(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "git")
}

// pushFiles commits files to branch of the project's repository over
// smart HTTP with the admin token and returns the commit.
func (e *env) pushFiles(t *testing.T, project, branch string, files map[string]string, opts ...string) string {
	t.Helper()
	return testenv.PushFiles(t, e.http.URL+"/"+project+".git", "root", e.admin, branch, files, opts...)
}

// newGitEnv is newEnv whose external URL is its own address, so that
// repository URLs in job payloads work.
func newGitEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	needGit(t)
	cfg.ExternalURL = ownURL
	return newEnv(t, cfg)
}

func (e *env) createProject(t *testing.T, path string) restapi.ProjectJSON {
	t.Helper()
	r := e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: path})
	expectCode(t, "create project", r, http.StatusCreated)
	var p restapi.ProjectJSON
	r.json(t, &p)
	return p
}

const e2eConfig = `
stages: [build, test, deploy]

variables:
  GLOBAL: global-value

build:
  stage: build
  script: [make]
  after_script: [echo cleanup]
  artifacts:
    paths: [out/]

lint:
  stage: build
  script: [lint]
  allow_failure: true

flaky:
  stage: build
  script: [flaky]
  retry: 1

unit:
  stage: test
  needs: [build]
  parallel:
    matrix:
      - GO: ["1.25", "1.26"]
  script: [go test]

docs:
  stage: test
  needs: []
  script: [docs]
  rules:
    - changes: [docs/**]

release-only:
  stage: test
  script: [release]
  rules:
    - if: $CI_COMMIT_BRANCH == "release"

deploy:
  stage: deploy
  script: [deploy]
  when: manual
`

// scriptedRunner is a runner that speaks the real runner API over HTTP
// and plays each job by a script keyed by the job's name. It records what
// it saw; failures go to t.Errorf (safe from its goroutine).
type scriptedRunner struct {
	t     *testing.T
	base  string
	token string
	http  *http.Client

	mu       sync.Mutex
	attempts map[string]int   // job name → times run
	order    []string         // job names in the order they were taken
	started  map[string][]int // name → job ids
	payloads map[string]*runnerapi.JobResponse
}

func newScriptedRunner(t *testing.T, e *env, token string) *scriptedRunner {
	return &scriptedRunner{t: t, base: e.http.URL, token: token, http: e.http.Client(),
		attempts: map[string]int{}, started: map[string][]int{}, payloads: map[string]*runnerapi.JobResponse{}}
}

func (r *scriptedRunner) call(method, path string, body any, header map[string]string) (*http.Response, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return nil, nil, err
		}
		rd = bytes.NewReader(buf)
		if header == nil {
			header = map[string]string{}
		}
		header["Content-Type"] = "application/json"
	}
	req, err := http.NewRequest(method, r.base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := r.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, b, err
}

// run takes and plays jobs until ctx ends.
func (r *scriptedRunner) run(ctx context.Context) {
	last := ""
	for ctx.Err() == nil {
		res, body, err := r.call("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: r.token, SystemID: "s_scripted", LastUpdate: last, Info: twoPhase}, nil)
		if err != nil {
			if ctx.Err() == nil {
				r.t.Errorf("jobs/request: %v", err)
			}
			return
		}
		if res.StatusCode == http.StatusNoContent {
			last = res.Header.Get(runnerapi.HeaderLastUpdate)
			continue
		}
		if res.StatusCode != http.StatusCreated {
			continue // 409: lost a race, ask again
		}
		var job runnerapi.JobResponse
		if err := json.Unmarshal(body, &job); err != nil {
			r.t.Errorf("decoding job: %v", err)
			return
		}
		if err := r.play(&job); err != nil {
			r.t.Errorf("job %d %q: %v", job.ID, job.JobInfo.Name, err)
		}
	}
}

func variable(job *runnerapi.JobResponse, key string) (runnerapi.Variable, bool) {
	var out runnerapi.Variable
	found := false
	for _, v := range job.Variables {
		if v.Key == key {
			out, found = v, true // the last definition wins, as in the runner
		}
	}
	return out, found
}

// play runs one job: ack, trace, the job's script, final state.
func (r *scriptedRunner) play(job *runnerapi.JobResponse) error {
	name := job.JobInfo.Name
	r.mu.Lock()
	r.attempts[name]++
	attempt := r.attempts[name]
	r.order = append(r.order, name)
	r.started[name] = append(r.started[name], int(job.ID))
	r.payloads[name] = job
	r.mu.Unlock()

	hdr := map[string]string{runnerapi.HeaderJobToken: job.Token}
	res, _, err := r.call("PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), runnerapi.UpdateJobRequest{Token: job.Token, State: "running"}, hdr)
	if err != nil || res.StatusCode != http.StatusOK {
		return fmt.Errorf("ack: %v %v", res, err)
	}
	trace := fmt.Sprintf("$ %s (attempt %d)\n", strings.Join(job.Steps[0].Script, "; "), attempt)
	state, exit := "success", 0
	var fail error
	switch {
	case name == "build":
		fail = r.checkClone(job)
		if len(job.Steps) != 2 || job.Steps[1].Name != "after_script" || job.Steps[1].Script[0] != "echo cleanup" {
			fail = errors.Join(fail, fmt.Errorf("steps %+v: want script and after_script", job.Steps))
		}
		fail = errors.Join(fail, r.uploadArtifact(job, map[string]string{"out/bin.txt": "built by job " + fmt.Sprint(job.ID)}))
		trace += "cleanup\n"
	case name == "lint":
		state, exit = "failed", 1
	case name == "flaky" && attempt == 1:
		state, exit = "failed", 1
	case strings.HasPrefix(name, "unit"):
		fail = r.checkDependency(job, "build")
	}
	if v, ok := variable(job, "GLOBAL"); !ok || v.Value != "global-value" {
		fail = errors.Join(fail, fmt.Errorf("GLOBAL = %+v", v))
	}
	if v, ok := variable(job, "DEPLOY_KEY"); !ok || v.Value != "s3cr3t-key-value" || !v.Masked {
		fail = errors.Join(fail, fmt.Errorf("project variable DEPLOY_KEY = %+v, want masked s3cr3t-key-value", v))
	}
	if fail != nil {
		state, exit = "failed", 99
		trace += fail.Error() + "\n"
	}
	res, _, err = r.call("PATCH", fmt.Sprintf("/api/v4/jobs/%d/trace", job.ID), []byte(trace),
		map[string]string{runnerapi.HeaderJobToken: job.Token, runnerapi.HeaderContentRange: fmt.Sprintf("0-%d", len(trace)-1)})
	if err != nil || res.StatusCode != http.StatusAccepted {
		return fmt.Errorf("trace: %v %v", res, err)
	}
	upd := runnerapi.UpdateJobRequest{Token: job.Token, State: state, ExitCode: exit,
		Output: &runnerapi.Output{Bytesize: int64(len(trace)), Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE([]byte(trace)))}}
	if state == "failed" {
		upd.FailureReason = "script_failure"
	}
	res, _, err = r.call("PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), upd, hdr)
	if err != nil || res.StatusCode != http.StatusOK {
		return fmt.Errorf("final update: %v %v", res, err)
	}
	return fail
}

// checkClone clones the job's repository the way gitlab-runner does:
// fetch the refspecs at the depth given, with the credentials in repo_url,
// then check out the sha.
func (r *scriptedRunner) checkClone(job *runnerapi.JobResponse) error {
	gi := job.GitInfo
	u, err := url.Parse(gi.RepoURL)
	if err != nil {
		return err
	}
	if u.User.Username() != "gitlab-ci-token" {
		return fmt.Errorf("repo_url user %q, want gitlab-ci-token", u.User.Username())
	}
	if v, _ := variable(job, "CI_JOB_TOKEN"); v.Value == "" || v.Value == job.Token {
		return errors.New("CI_JOB_TOKEN is missing or is the runner's own token")
	} else if pw, _ := u.User.Password(); pw != v.Value {
		return errors.New("repo_url does not carry the job's CI_JOB_TOKEN")
	}
	dir, err := os.MkdirTemp("", "clone-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := testenv.GitOutput(dir, nil, "init", "-q"); err != nil {
		return err
	}
	args := []string{"fetch", "-q", fmt.Sprintf("--depth=%d", gi.Depth), gi.RepoURL}
	args = append(args, gi.Refspecs...)
	if _, err := testenv.GitOutput(dir, nil, args...); err != nil {
		return fmt.Errorf("fetch with the job token: %w", err)
	}
	if _, err := testenv.GitOutput(dir, nil, "checkout", "-q", gi.Sha); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, "src", "main.txt"))
	if err != nil || string(b) != "hello" {
		return fmt.Errorf("src/main.txt after clone: %q, %v", b, err)
	}
	if gi.RefType != "branch" || gi.Ref != "main" || gi.Depth != 20 || len(gi.Refspecs) != 2 {
		return fmt.Errorf("git_info %+v", gi)
	}
	return nil
}

func (r *scriptedRunner) uploadArtifact(job *runnerapi.JobResponse, files map[string]string) error {
	var zbuf bytes.Buffer
	zw := zip.NewWriter(&zbuf)
	for name, content := range files {
		w, err := zw.Create(name)
		if err != nil {
			return err
		}
		_, _ = w.Write([]byte(content))
	}
	if err := zw.Close(); err != nil {
		return err
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "artifacts.zip")
	_, _ = fw.Write(zbuf.Bytes())
	_ = mw.Close()
	res, _, err := r.call("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_type=archive&artifact_format=zip", job.ID), body.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
	if err != nil || res.StatusCode != http.StatusCreated {
		return fmt.Errorf("artifact upload: %v %v", res, err)
	}
	return nil
}

// checkDependency downloads the artifacts of the named dependency with the
// job's own token, as the runner's download_artifacts stage does.
func (r *scriptedRunner) checkDependency(job *runnerapi.JobResponse, name string) error {
	var dep *runnerapi.Dependency
	for i := range job.Dependencies {
		if job.Dependencies[i].Name == name {
			dep = &job.Dependencies[i]
		}
	}
	if dep == nil || dep.ArtifactsFile == nil {
		return fmt.Errorf("dependencies %+v: want %s with an artifacts file", job.Dependencies, name)
	}
	res, body, err := r.call("GET", fmt.Sprintf("/api/v4/jobs/%d/artifacts", dep.ID), nil, map[string]string{runnerapi.HeaderJobToken: dep.Token})
	if err != nil || res.StatusCode != http.StatusOK {
		return fmt.Errorf("artifact download: %v %v", res, err)
	}
	zr, err := zip.NewReader(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		return err
	}
	f, err := zr.Open("out/bin.txt")
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(f)
	if want := fmt.Sprintf("built by job %d", dep.ID); string(b) != want {
		return fmt.Errorf("artifact content %q, want %q", b, want)
	}
	return nil
}

// waitPipeline follows a pipeline with WatchPipeline until cond holds.
func waitPipeline(t *testing.T, e *env, id int64, what string, cond func(pipelines.PipelineState) bool) pipelines.PipelineState {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var last pipelines.PipelineState
	err := e.srv.pipelines.WatchPipeline(ctx, id, func(st pipelines.PipelineState) bool {
		last = st
		return !cond(st)
	})
	if err != nil {
		var jobs []string
		for _, j := range last.Jobs {
			jobs = append(jobs, fmt.Sprintf("%s=%s", j.Name, j.Status))
		}
		t.Fatalf("waiting for %s: %v (pipeline %v, jobs %v)", what, err, last.Pipeline, jobs)
	}
	return last
}

// latestStatuses maps job names to statuses of the latest jobs, and
// counts retried ones.
func latestStatuses(st pipelines.PipelineState) (map[string]store.Status, map[string]int) {
	latest, retried := map[string]store.Status{}, map[string]int{}
	for _, j := range st.Jobs {
		if j.Retried {
			retried[j.Name]++
			continue
		}
		latest[j.Name] = j.Status
	}
	return latest, retried
}

func TestPipelineEndToEnd(t *testing.T) {
	e := newGitEnv(t, Config{})
	proj := e.createProject(t, "group/demo")
	if proj.PathWithNamespace != "group/demo" || proj.HTTPURLToRepo != e.srv.baseURL()+"/group/demo.git" {
		t.Fatalf("project %+v", proj)
	}
	r := e.adminDo("POST", "/api/v4/projects/group%2Fdemo/variables",
		map[string]any{"key": "DEPLOY_KEY", "value": "s3cr3t-key-value", "masked": true, "protected": true})
	expectCode(t, "create variable", r, http.StatusCreated)

	// A push with ci.skip stores the commit and starts nothing.
	sha := e.pushFiles(t, "group/demo", "main", map[string]string{".gitlab-ci.yml": e2eConfig, "src/main.txt": "hello"}, "-o", "ci.skip")
	if ps, _ := e.st.ListPipelines(t.Context(), store.PipelineFilter{}); len(ps) != 0 {
		t.Fatalf("pipelines after a ci.skip push: %d, want 0", len(ps))
	}

	runnerTok := e.createRunner(restapi.CreateRunnerRequest{})
	sr := newScriptedRunner(t, e, runnerTok)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sr.run(ctx) }()
	t.Cleanup(func() { stop(); e.srv.queue.Close(); <-done })

	r = e.adminDo("POST", "/api/v4/projects/group%2Fdemo/pipeline?ref=main", nil)
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	if pl.Sha != sha || pl.Ref != "main" || pl.Source != "api" || pl.IID != 1 {
		t.Fatalf("pipeline %+v, want sha %s on main from api", pl, sha)
	}

	// Everything but the manual deploy job runs; the pipeline passes with
	// lint's allowed failure as a warning and deploy waiting to be played.
	st := waitPipeline(t, e, pl.ID, "the pipeline to pass", func(st pipelines.PipelineState) bool {
		latest, _ := latestStatuses(st)
		return st.Pipeline.Status.Finished() && latest["deploy"] == store.StatusManual
	})
	latest, retried := latestStatuses(st)
	want := map[string]store.Status{
		"build": store.StatusSuccess, "lint": store.StatusFailed, "flaky": store.StatusSuccess,
		"unit: [1.25]": store.StatusSuccess, "unit: [1.26]": store.StatusSuccess, "docs": store.StatusSuccess,
		"deploy": store.StatusManual,
	}
	if fmt.Sprint(latest) != fmt.Sprint(want) {
		t.Errorf("job statuses %v, want %v", latest, want)
	}
	if retried["flaky"] != 1 || len(retried) != 1 {
		t.Errorf("retried jobs %v, want flaky once (retry: 1)", retried)
	}
	if st.Pipeline.Status != store.StatusSuccess {
		t.Errorf("pipeline status %s, want success (lint may fail, deploy is manual)", st.Pipeline.Status)
	}

	// needs: the unit jobs ran after build, docs (needs: []) did not wait
	// for the build stage.
	sr.mu.Lock()
	order := slices.Clone(sr.order)
	sr.mu.Unlock()
	idx := func(name string) int { return slices.Index(order, name) }
	if idx("unit: [1.25]") < idx("build") || idx("unit: [1.26]") < idx("build") {
		t.Errorf("run order %v: unit jobs must run after build", order)
	}
	if slices.Contains(order, "release-only") {
		t.Errorf("release-only ran although its rules exclude it on main")
	}
	sr.mu.Lock()
	unit := sr.payloads["unit: [1.26]"]
	sr.mu.Unlock()
	for k, v := range map[string]string{"GO": "1.26", "CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "2",
		"CI_PIPELINE_SOURCE": "api", "CI_COMMIT_BRANCH": "main", "CI_PROJECT_PATH": "group/demo",
		"CI_COMMIT_REF_PROTECTED": "true", "CI_PIPELINE_IID": "1"} {
		if got, ok := variable(unit, k); !ok || got.Value != v {
			t.Errorf("unit: [1.26] %s = %q, want %q", k, got.Value, v)
		}
	}

	// The trace through the REST API.
	var lintID int64
	for _, j := range st.Jobs {
		if j.Name == "lint" {
			lintID = j.ID
		}
	}
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/jobs/%d/trace", proj.ID, lintID), nil)
	if r.code != http.StatusOK || !strings.Contains(string(r.body), "$ lint (attempt 1)") {
		t.Errorf("lint trace: %d %q", r.code, r.body)
	}

	// Play the manual job: the pipeline runs again and passes.
	var deployID int64
	for _, j := range st.Jobs {
		if j.Name == "deploy" {
			deployID = j.ID
		}
	}
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/group%%2Fdemo/jobs/%d/play", deployID), nil)
	expectCode(t, "play deploy", r, http.StatusOK)
	st = waitPipeline(t, e, pl.ID, "deploy to run", func(st pipelines.PipelineState) bool {
		latest, _ := latestStatuses(st)
		return latest["deploy"] == store.StatusSuccess && st.Pipeline.Status == store.StatusSuccess
	})
	sr.mu.Lock()
	deploy := sr.payloads["deploy"]
	sr.mu.Unlock()
	if v, _ := variable(deploy, "CI_JOB_MANUAL"); v.Value != "true" {
		t.Errorf("deploy: CI_JOB_MANUAL = %q, want true", v.Value)
	}
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/%d/jobs/%d/play", proj.ID, lintID), nil)
	expectCode(t, "play a job that is not manual", r, http.StatusBadRequest)

	// The REST API lists the latest jobs, or all with include_retried.
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/jobs?per_page=100", proj.ID, pl.ID), nil)
	expectCode(t, "pipeline jobs", r, http.StatusOK)
	var jobs []restapi.JobJSON
	r.json(t, &jobs)
	var names []string
	for _, j := range jobs {
		names = append(names, j.Name)
		if j.Name == "lint" && !j.AllowFailure {
			t.Errorf("lint: allow_failure false in the API")
		}
	}
	sort.Strings(names)
	if want := []string{"build", "deploy", "docs", "flaky", "lint", "unit: [1.25]", "unit: [1.26]"}; !slices.Equal(names, want) {
		t.Errorf("pipeline jobs %v, want %v", names, want)
	}
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/jobs?include_retried=true&per_page=100", proj.ID, pl.ID), nil)
	r.json(t, &jobs)
	if len(jobs) != 8 {
		t.Errorf("jobs with retried: %d, want 8", len(jobs))
	}
	// The project's jobs as the jobs API lists them are a trace berth sim
	// reads (every one of them ran).
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/jobs?per_page=100", proj.ID), nil)
	expectCode(t, "project jobs", r, http.StatusOK)
	if trace, err := sim.ReadTrace(bytes.NewReader(r.body)); err != nil || len(trace.Jobs) != 8 || trace.LeftOut != 0 {
		t.Errorf("the project's jobs as a berth sim trace: %d jobs, %d left out, %v; want 8, 0\n%s", len(trace.Jobs), trace.LeftOut, err, r.body)
	}
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/group%%2Fdemo/pipelines/%d", pl.ID), nil)
	expectCode(t, "get pipeline", r, http.StatusOK)
	r.json(t, &pl)
	if pl.Status != "success" || pl.FinishedAt == nil || pl.StartedAt == nil {
		t.Errorf("pipeline through the API: %+v", pl)
	}
}

func needGitF(f *testing.F) {
	f.Helper()
	testenv.LookPath(f, "git")
}
