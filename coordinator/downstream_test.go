package coordinator

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// downstreamOf returns the one downstream pipeline of the bridge named
// name in pipeline id, waiting for it.
func (e *env) downstream(t *testing.T, id int64, name string) *store.Pipeline {
	t.Helper()
	var out *store.Pipeline
	waitFor(t, "the downstream pipeline of "+name, func() bool {
		st, err := e.srv.pipelines.PipelineState(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var bridge *store.Job
		for _, j := range st.Jobs {
			if j.Name == name && !j.Retried {
				bridge = j
			}
		}
		if bridge == nil {
			return false
		}
		out, err = e.srv.pipelines.DownstreamOf(t.Context(), bridge.ID)
		if err != nil {
			t.Fatal(err)
		}
		return out != nil
	})
	return out
}

// latestJob returns the latest job of a name in a pipeline.
func (e *env) latestJob(t *testing.T, id int64, name string) *store.Job {
	t.Helper()
	st, err := e.srv.pipelines.PipelineState(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	j := st.Latest(name)
	if j == nil {
		t.Fatalf("pipeline %d has no job %s", id, name)
	}
	return j
}

func (e *env) trace(t *testing.T, id int64) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := e.st.ReadTrace(t.Context(), id, 0, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// uploadArchive uploads a zip of files as a running job's artifacts.
func (e *env) uploadArchive(t *testing.T, job *runnerapi.JobResponse, files map[string]string) {
	t.Helper()
	var zbuf bytes.Buffer
	zw := zip.NewWriter(&zbuf)
	for name, content := range files {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(content))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "artifacts.zip")
	_, _ = fw.Write(zbuf.Bytes())
	_ = mw.Close()
	r := e.do("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_type=archive&artifact_format=zip", job.ID), body.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
	expectCode(t, "upload artifacts", r, http.StatusCreated)
}

func wantVar(t *testing.T, job *runnerapi.JobResponse, key, want string) {
	t.Helper()
	v, ok := variable(job, key)
	if !ok || v.Value != want {
		t.Errorf("job %s: %s = %q (set %v), want %q", job.JobInfo.Name, key, v.Value, ok, want)
	}
}

func TestChildPipelineFromLocalInclude(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{
		".gitlab-ci.yml": `
stages: [build, test]
variables:
  GLOBAL: g
build:
  stage: build
  script: [x]
child:
  stage: test
  variables:
    FROM_BRIDGE: $CI_PROJECT_NAME-bridge
    RAW: {value: $CI_PROJECT_NAME, expand: false}
  trigger:
    include: ci/child.yml
`,
		"ci/child.yml": `
child-job:
  script: [x]
  rules:
    - if: $CI_PIPELINE_SOURCE == "parent_pipeline" && $FROM_BRIDGE == "p-bridge"
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	r := e.adminDo("POST", "/api/v4/projects/p/pipeline", restapi.CreatePipelineRequest{Ref: "main",
		Variables: []restapi.PipelineVariable{{Key: "API_VAR", Value: "a"}}})
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	e.runJob(tok, "success", 0)

	child := e.downstream(t, pl.ID, "child")
	if child.Source != pipelines.SourceParentPipeline || child.UpstreamPipelineID != pl.ID || child.Sha != pl.Sha || child.Ref != "main" {
		t.Errorf("child pipeline %+v", child)
	}
	// Without a strategy the bridge succeeds once the child exists, and
	// the parent does not wait for it.
	st := waitPipeline(t, e, pl.ID, "parent success", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
	bridge := st.Latest("child")
	if bridge.Status != store.StatusSuccess || bridge.RunnerID != 0 {
		t.Errorf("bridge %+v", bridge)
	}
	if tr := e.trace(t, bridge.ID); !strings.Contains(tr, fmt.Sprintf("Created child pipeline #%d", child.ID)) {
		t.Errorf("bridge log %q", tr)
	}

	job := e.runJob(tok, "success", 0)
	if job.JobInfo.Name != "child-job" || job.JobInfo.PipelineID != child.ID {
		t.Fatalf("handed out %s of pipeline %d, want child-job of %d", job.JobInfo.Name, job.JobInfo.PipelineID, child.ID)
	}
	wantVar(t, job, "CI_PIPELINE_SOURCE", "parent_pipeline")
	wantVar(t, job, "CI_UPSTREAM_PIPELINE_ID", strconv.FormatInt(pl.ID, 10))
	wantVar(t, job, "CI_UPSTREAM_PROJECT_ID", strconv.FormatInt(pl.ProjectID, 10))
	wantVar(t, job, "CI_UPSTREAM_JOB_ID", strconv.FormatInt(bridge.ID, 10))
	wantVar(t, job, "FROM_BRIDGE", "p-bridge") // expanded upstream
	wantVar(t, job, "RAW", "$CI_PROJECT_NAME") // expand: false stays
	wantVar(t, job, "GLOBAL", "g")             // yaml_variables forwarded by default
	if v, ok := variable(job, "API_VAR"); ok { // pipeline_variables are not, by default
		t.Errorf("API_VAR reached the child: %+v", v)
	}
	waitPipeline(t, e, child.ID, "child success", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })

	// The API: jobs without the bridge, bridges with their downstream
	// pipeline, the child with its upstream link.
	var jobs []restapi.JobJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/jobs", pl.ID), nil).json(t, &jobs)
	if len(jobs) != 1 || jobs[0].Name != "build" {
		t.Errorf("jobs %+v, want build only", jobs)
	}
	var bridges []restapi.BridgeJSON
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/bridges", pl.ID), nil)
	expectCode(t, "bridges", r, http.StatusOK)
	r.json(t, &bridges)
	if len(bridges) != 1 || bridges[0].Name != "child" || bridges[0].Status != "success" || bridges[0].DownstreamPipeline == nil ||
		bridges[0].DownstreamPipeline.ID != child.ID || bridges[0].DownstreamPipeline.Status != "success" ||
		bridges[0].DownstreamPipeline.Source != "parent_pipeline" || bridges[0].Pipeline.ID != pl.ID {
		t.Errorf("bridges %s", r.body)
	}
	var cj restapi.PipelineJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/p/pipelines/%d", child.ID), nil).json(t, &cj)
	if cj.UpstreamPipelineID != pl.ID || cj.SourceJobID != bridge.ID || cj.Source != "parent_pipeline" {
		t.Errorf("child pipeline JSON %+v", cj)
	}
}

func TestChildPipelineFromArtifact(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
generate:
  stage: build
  script: [./gen > gen/child.yml]
  artifacts:
    paths: [gen/]
child:
  stage: test
  needs: [generate]
  trigger:
    include:
      - artifact: gen/child.yml
        job: generate
      - local: ci/common.yml
    strategy: depend
`, "ci/common.yml": "common:\n  script: [x]\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	job := e.takeWait(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	e.uploadArchive(t, job, map[string]string{"gen/child.yml": "generated:\n  script: [echo generated]\n  needs: [common]\n"})
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	child := e.downstream(t, pl.ID, "child")
	// depend: the bridge runs while its child does.
	if b := e.latestJob(t, pl.ID, "child"); b.Status != store.StatusRunning {
		t.Errorf("bridge with strategy depend is %s while its child runs, want running", b.Status)
	}
	first := e.runJob(tok, "success", 0)
	second := e.runJob(tok, "success", 0)
	if first.JobInfo.Name != "common" || second.JobInfo.Name != "generated" || second.JobInfo.PipelineID != child.ID {
		t.Errorf("child ran %s then %s", first.JobInfo.Name, second.JobInfo.Name)
	}
	waitPipeline(t, e, pl.ID, "parent success after its child", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
}

func TestChildPipelineArtifactMissing(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
generate:
  stage: build
  script: [x]
child:
  stage: test
  trigger:
    include: [{artifact: child.yml, job: generate}]
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	e.runJob(tok, "success", 0) // no artifacts
	st := waitPipeline(t, e, pl.ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	b := st.Latest("child")
	if b.Status != store.StatusFailed || b.FailureReason != pipelines.ReasonDownstreamCreationFailed {
		t.Errorf("bridge %s %s", b.Status, b.FailureReason)
	}
	if tr := e.trace(t, b.ID); !strings.Contains(tr, "ERROR: downstream pipeline can not be created") ||
		!strings.Contains(tr, "Job `generate` not found in parent pipeline or does not have artifacts!") {
		t.Errorf("bridge log %q", tr)
	}
}

func TestStrategyDependAndMirror(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
fails:
  trigger:
    include: failing.yml
    strategy: depend
tolerated:
  allow_failure: true
  trigger:
    include: failing.yml
    strategy: depend
mirrored:
  trigger:
    include: manual.yml
    strategy: mirror
`, "failing.yml": "bad:\n  script: [x]\n", "manual.yml": "later:\n  script: [x]\n  when: manual\n  allow_failure: false\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	e.runJob(tok, "failed", 1)
	e.runJob(tok, "failed", 1)
	st := waitPipeline(t, e, pl.ID, "bridges settled", func(st pipelines.PipelineState) bool {
		l, _ := latestStatuses(st)
		// The pipeline's status is written after its jobs': wait for it too.
		return l["fails"] == store.StatusFailed && l["tolerated"] == store.StatusFailed && l["mirrored"] == store.StatusManual &&
			st.Pipeline.Status != store.StatusRunning
	})
	// mirror shows the blocked child as manual (and so blocks the
	// pipeline, manual coming before failed as in GitLab); depend fails
	// with the child, allow_failure keeps that from counting.
	if st.Pipeline.Status != store.StatusManual {
		t.Errorf("pipeline %s, want manual", st.Pipeline.Status)
	}
	if j := st.Latest("tolerated"); !graph.AllowedToFail(j) {
		t.Error("tolerated bridge not allowed to fail")
	}
	// A mirrored manual bridge is not an action: play the child's job.
	mb := st.Latest("mirrored")
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/play", mb.ID), nil)
	expectCode(t, "play a mirroring bridge", r, http.StatusBadRequest)
	child := e.downstream(t, pl.ID, "mirrored")
	later := e.latestJob(t, child.ID, "later")
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/play", later.ID), nil)
	expectCode(t, "play the child's manual job", r, http.StatusOK)
	e.runJob(tok, "success", 0)
	waitPipeline(t, e, pl.ID, "mirror success, pipeline failed", func(st pipelines.PipelineState) bool {
		return statusOf(st, "mirrored") == store.StatusSuccess && st.Pipeline.Status == store.StatusFailed
	})
}

func TestMultiProjectPipeline(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "up")
	e.createProject(t, "group/down")
	e.pushFiles(t, "group/down", "release-eu", map[string]string{".gitlab-ci.yml": `
spec:
  inputs:
    target:
      default: none
---
deploy:
  script: [x]
  variables:
    TARGET: $[[ inputs.target ]]
  rules:
    - if: $CI_PIPELINE_SOURCE == "pipeline"
`}, "-o", "ci.skip")
	e.pushFiles(t, "up", "main", map[string]string{".gitlab-ci.yml": `
variables:
  REGION: eu
  LEAK: x$PSECRET
deploy:
  trigger:
    project: group/$DOWNSTREAM
    branch: release-$REGION
    strategy: depend
    inputs:
      target: prod
    forward:
      pipeline_variables: true
missing:
  trigger: group/nope
own:
  trigger: up
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	expectCode(t, "protected variable", e.adminDo("POST", "/api/v4/projects/up/variables",
		map[string]any{"key": "PSECRET", "value": "s3cret", "protected": true}), http.StatusCreated)
	r := e.adminDo("POST", "/api/v4/projects/up/pipeline", restapi.CreatePipelineRequest{Ref: "main",
		Variables: []restapi.PipelineVariable{{Key: "DOWNSTREAM", Value: "down"}, {Key: "SECRET_FILE", Value: "s", VariableType: "file"}}})
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)

	ds := e.downstream(t, pl.ID, "deploy")
	down, err := e.st.ProjectByPath(t.Context(), "group/down")
	if err != nil {
		t.Fatal(err)
	}
	if ds.ProjectID != down.ID || ds.Ref != "release-eu" || ds.Source != pipelines.SourcePipeline {
		t.Errorf("downstream pipeline %+v", ds)
	}
	st := waitPipeline(t, e, pl.ID, "failed bridges", func(st pipelines.PipelineState) bool {
		l, _ := latestStatuses(st)
		return l["missing"] == store.StatusFailed && l["own"] == store.StatusFailed
	})
	l := map[string]*store.Job{}
	for _, n := range []string{"missing", "own", "one", "two"} {
		l[n] = st.Latest(n)
	}
	if l["missing"].FailureReason != pipelines.ReasonProjectNotFound || l["own"].FailureReason != pipelines.ReasonInvalidTrigger {
		t.Errorf("failure reasons %q %q", l["missing"].FailureReason, l["own"].FailureReason)
	}
	job := e.runJob(tok, "success", 0)
	wantVar(t, job, "CI_PIPELINE_SOURCE", "pipeline")
	wantVar(t, job, "CI_PROJECT_PATH", "group/down")
	wantVar(t, job, "REGION", "eu")
	wantVar(t, job, "DOWNSTREAM", "down")
	wantVar(t, job, "LEAK", "x")      // a protected variable does not cross projects
	wantVar(t, job, "TARGET", "prod") // trigger:inputs are the downstream spec:inputs
	if v, _ := variable(job, "SECRET_FILE"); !v.File {
		t.Errorf("a file pipeline variable forwarded as %+v", v)
	}
	waitPipeline(t, e, pl.ID, "deploy bridge success", func(st pipelines.PipelineState) bool { return statusOf(st, "deploy") == store.StatusSuccess })
}

func TestCancelParentCancelsChild(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
child:
  trigger:
    include: child.yml
    strategy: depend
fire-and-forget:
  trigger:
    include: child.yml
`, "child.yml": "a:\n  script: [x]\nb:\n  script: [x]\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	c1, c2 := e.downstream(t, pl.ID, "child"), e.downstream(t, pl.ID, "fire-and-forget")
	running := e.takeWait(tok)
	expectCode(t, "ack", e.update(running, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)

	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/cancel", pl.ID), nil)
	expectCode(t, "cancel", r, http.StatusOK)
	st := waitPipeline(t, e, pl.ID, "parent canceled", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusCanceled })
	if s := statusOf(st, "child"); s != store.StatusCanceled {
		t.Errorf("depend bridge %s, want canceled", s)
	}
	// Both children are canceled, the one whose bridge had succeeded too;
	// the running job is canceling until its runner reports.
	for _, c := range []int64{c1.ID, c2.ID} {
		cs, err := e.srv.pipelines.PipelineState(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range cs.Jobs {
			if j.Status != store.StatusCanceled && !(j.ID == running.ID && j.Status == store.StatusCanceling) {
				t.Errorf("child %d job %s is %s after the parent was canceled", c, j.Name, j.Status)
			}
		}
	}
	expectCode(t, "final", e.update(running, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "job_canceled"}), http.StatusOK)
	for _, c := range []int64{c1.ID, c2.ID} {
		waitPipeline(t, e, c, "child canceled", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusCanceled })
	}
}

func TestRetryBridgeCreatesNewDownstream(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
child:
  trigger:
    include: child.yml
    strategy: depend
after:
  stage: deploy
  script: [x]
`, "child.yml": "flaky:\n  script: [x]\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	first := e.downstream(t, pl.ID, "child")
	e.runJob(tok, "failed", 1)
	st := waitPipeline(t, e, pl.ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	if statusOf(st, "after") != store.StatusSkipped {
		t.Errorf("after: %s, want skipped", statusOf(st, "after"))
	}
	old := st.Latest("child")
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/retry", old.ID), nil)
	expectCode(t, "retry bridge", r, http.StatusCreated)
	second := e.downstream(t, pl.ID, "child")
	if second.ID == first.ID || second.SourceJobID == old.ID {
		t.Fatalf("retry reused downstream pipeline %d", first.ID)
	}
	e.runJob(tok, "success", 0) // the new child's job
	e.runJob(tok, "success", 0) // after
	waitPipeline(t, e, pl.ID, "success after the retry", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
}

func TestChildPipelineDepthLimit(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	// Every level triggers the same file again: parent → child →
	// grandchild; the grandchild's bridge is refused.
	e.pushFiles(t, "p", "main", map[string]string{
		".gitlab-ci.yml": "deeper:\n  trigger:\n    include: nest.yml\n",
		"nest.yml":       "deeper:\n  trigger:\n    include: nest.yml\n",
	}, "-o", "ci.skip")
	pl := e.createPipeline(t, "p", "main")
	child := e.downstream(t, pl.ID, "deeper")
	grandchild := e.downstream(t, child.ID, "deeper")
	st := waitPipeline(t, e, grandchild.ID, "grandchild failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	b := st.Latest("deeper")
	if b.FailureReason != pipelines.ReasonMaxDepth {
		t.Errorf("grandchild's bridge: %s %q, want %s", b.Status, b.FailureReason, pipelines.ReasonMaxDepth)
	}
	if tr := e.trace(t, b.ID); !strings.Contains(tr, "reached maximum depth of child pipelines") {
		t.Errorf("bridge log %q", tr)
	}
	if ds, _ := e.srv.pipelines.DownstreamOf(t.Context(), b.ID); ds != nil {
		t.Errorf("a great-grandchild was created: %d", ds.ID)
	}
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/retry", b.ID), nil)
	expectCode(t, "retry of a bridge at the depth limit", r, http.StatusForbidden)
	waitPipeline(t, e, pl.ID, "parent success", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
}

func TestPipelineHierarchySizeLimit(t *testing.T) {
	e := newGitEnv(t, Config{MaxPipelineHierarchySize: 2})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{
		".gitlab-ci.yml": "one:\n  trigger: {include: c.yml}\ntwo:\n  stage: deploy\n  trigger: {include: c.yml}\n",
		"c.yml":          "c:\n  script: [x]\n",
	}, "-o", "ci.skip")
	pl := e.createPipeline(t, "p", "main")
	st := waitPipeline(t, e, pl.ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	l := map[string]*store.Job{}
	for _, n := range []string{"missing", "own", "one", "two"} {
		l[n] = st.Latest(n)
	}
	if l["one"].Status != store.StatusSuccess || l["two"].FailureReason != pipelines.ReasonHierarchySize {
		t.Errorf("one %s, two %s %q", l["one"].Status, l["two"].Status, l["two"].FailureReason)
	}
}

// A bridge left running without its downstream pipeline (a crash between
// the two steps) gets it when the engine next looks.
func TestRunningBridgeResumes(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "child:\n  when: manual\n  trigger: {include: c.yml}\nplayed:\n  when: manual\n  trigger: {include: c.yml}\n", "c.yml": "c:\n  script: [x]\n"}, "-o", "ci.skip")
	pl := e.createPipeline(t, "p", "main")
	b := e.latestJob(t, pl.ID, "child")
	if b.Status != store.StatusManual {
		t.Fatalf("manual bridge is %s", b.Status)
	}
	if _, err := e.st.TransitionJob(context.Background(), b.ID, []store.Status{store.StatusManual}, store.JobUpdate{Status: store.StatusRunning}); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.pipelines.ProcessPipeline(t.Context(), pl.ID); err != nil {
		t.Fatal(err)
	}
	e.downstream(t, pl.ID, "child")
	waitPipeline(t, e, pl.ID, "success", func(st pipelines.PipelineState) bool { return statusOf(st, "child") == store.StatusSuccess })

	// Playing a manual bridge creates its downstream pipeline.
	played := e.latestJob(t, pl.ID, "played")
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/p/jobs/%d/play", played.ID), nil)
	expectCode(t, "play a manual bridge", r, http.StatusOK)
	if ds := e.downstream(t, pl.ID, "played"); ds.SourceJobID != played.ID {
		t.Errorf("played bridge's downstream %+v", ds)
	}
}

// The child configuration is the trigger's include entries as written, so
// include kinds other than local work in a child pipeline: here a file of
// another hosted project, with inputs.
func TestChildPipelineFromProjectInclude(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "group/shared")
	expectCode(t, "make shared public", e.adminDo("PUT", "/api/v4/projects/group%2Fshared", map[string]any{"visibility": "public"}), http.StatusOK)
	e.createProject(t, "p")
	e.pushFiles(t, "group/shared", "main", map[string]string{"ci/child.yml": `
spec:
  inputs:
    name:
---
shared-$[[ inputs.name ]]:
  script: [x]
`}, "-o", "ci.skip")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
child:
  trigger:
    include:
      - project: group/shared
        ref: main
        file: ci/child.yml
        inputs:
          name: lint
    strategy: depend
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	waitFor(t, "the bridge to settle", func() bool {
		b := e.latestJob(t, pl.ID, "child")
		if b.Status == store.StatusFailed {
			t.Fatalf("bridge failed: %s: %s", b.FailureReason, e.trace(t, b.ID))
		}
		ds, _ := e.srv.pipelines.DownstreamOf(t.Context(), b.ID)
		return ds != nil
	})
	child := e.downstream(t, pl.ID, "child")
	job := e.runJob(tok, "success", 0)
	if job.JobInfo.Name != "shared-lint" || job.JobInfo.PipelineID != child.ID {
		t.Errorf("ran %s of pipeline %d, want shared-lint of %d", job.JobInfo.Name, job.JobInfo.PipelineID, child.ID)
	}
	waitPipeline(t, e, pl.ID, "success", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
}
