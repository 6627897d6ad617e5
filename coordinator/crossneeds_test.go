package coordinator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// A dynamic child pipeline downloads the artifacts of the parent's job
// through needs:pipeline: $PARENT_PIPELINE_ID, as GitLab documents.
func TestNeedsPipelineFromChild(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "group/p")
	e.pushFiles(t, "group/p", "main", map[string]string{".gitlab-ci.yml": `
build:
  stage: build
  script: [make]
  artifacts: {paths: [out/]}
child:
  stage: test
  variables:
    PARENT_PIPELINE_ID: $CI_PIPELINE_ID
  trigger:
    include: ci/child.yml
    strategy: depend
`, "ci/child.yml": `
use:
  needs:
    - pipeline: $PARENT_PIPELINE_ID
      job: build
  script: [cat out/x]
no-artifacts:
  needs: [{pipeline: $PARENT_PIPELINE_ID, job: build, artifacts: false}]
  script: ['true']
bad:
  needs: [{pipeline: $NOT_SET, job: build}]
  script: ['true']
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "group%2Fp", "main")
	build := e.takeWait(tok)
	expectCode(t, "ack", e.update(build, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	e.uploadArchive(t, build, map[string]string{"out/x": "built"})
	expectCode(t, "finish", e.update(build, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	child := e.downstream(t, pl.ID, "child")
	got := map[string]*runnerapi.JobResponse{}
	for range 2 {
		j := e.takeWait(tok)
		expectCode(t, "ack", e.update(j, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
		got[j.JobInfo.Name] = j
	}
	use := got["use"]
	if use == nil || len(use.Dependencies) != 1 || use.Dependencies[0].ID != build.ID || use.Dependencies[0].ArtifactsFile == nil {
		t.Fatalf("use: dependencies %+v, want the parent's build (%d) with its archive", use, build.ID)
	}
	// The dependency's artifacts download with the child job's token;
	// a job that does not need them may not.
	r := e.do("GET", fmt.Sprintf("/api/v4/jobs/%d/artifacts", build.ID), nil, map[string]string{runnerapi.HeaderJobToken: use.Dependencies[0].Token})
	expectCode(t, "download the parent's artifacts", r, http.StatusOK)
	r = e.do("GET", fmt.Sprintf("/api/v4/jobs/%d/artifacts", build.ID), nil, map[string]string{runnerapi.HeaderJobToken: got["no-artifacts"].Token})
	expectCode(t, "download without the need", r, http.StatusForbidden)
	for _, j := range got {
		expectCode(t, "finish", e.update(j, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	}
	if na := got["no-artifacts"]; na == nil || len(na.Dependencies) != 0 {
		t.Errorf("artifacts: false: dependencies %+v, want none", na)
	}
	bad := e.latestJob(t, child.ID, "bad")
	if bad.Status != store.StatusFailed || bad.FailureReason != "missing_dependency_failure" ||
		!strings.Contains(e.trace(t, bad.ID), "not a pipeline id") {
		t.Errorf("bad: %s %s %q", bad.Status, bad.FailureReason, e.trace(t, bad.ID))
	}
	waitPipeline(t, e, pl.ID, "parent failed with its child", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
}

// needs:project takes the latest successful job of a ref of a project
// the pipeline's project may read.
func TestNeedsProject(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "group/lib")
	e.createProject(t, "group/app")
	e.createProject(t, "other/secret")
	e.pushFiles(t, "group/lib", "main", map[string]string{".gitlab-ci.yml": "build:\n  script: [make]\n  artifacts: {paths: [lib/]}\n"}, "-o", "ci.skip")
	e.pushFiles(t, "other/secret", "main", map[string]string{".gitlab-ci.yml": "build:\n  script: [make]\n"}, "-o", "ci.skip")
	e.pushFiles(t, "group/app", "main", map[string]string{".gitlab-ci.yml": `
use-lib:
  needs: [{project: group/lib, job: build, ref: main}]
  script: [ls lib]
use-secret:
  needs: [{project: other/secret, job: build, ref: main}]
  script: ['true']
use-missing-ref:
  needs: [{project: group/lib, job: build, ref: nope}]
  script: ['true']
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	lib := e.createPipeline(t, "group%2Flib", "main")
	lb := e.takeWait(tok)
	expectCode(t, "ack", e.update(lb, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	e.uploadArchive(t, lb, map[string]string{"lib/a.so": "so"})
	expectCode(t, "finish", e.update(lb, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	waitPipeline(t, e, lib.ID, "lib done", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })
	secret := e.createPipeline(t, "other%2Fsecret", "main")
	e.runJob(tok, "success", 0)
	waitPipeline(t, e, secret.ID, "secret done", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusSuccess })

	app := e.createPipeline(t, "group%2Fapp", "main")
	use := e.runJob(tok, "success", 0)
	if use.JobInfo.Name != "use-lib" || len(use.Dependencies) != 1 || use.Dependencies[0].ID != lb.ID {
		t.Fatalf("%s: dependencies %+v, want group/lib's build %d", use.JobInfo.Name, use.Dependencies, lb.ID)
	}
	for _, name := range []string{"use-secret", "use-missing-ref"} {
		j := e.latestJob(t, app.ID, name)
		if j.Status != store.StatusFailed || j.FailureReason != "missing_dependency_failure" {
			t.Errorf("%s: %s %s, want failed (missing_dependency_failure)", name, j.Status, j.FailureReason)
		}
	}
}

// rules:exists:project looks at another hosted project's files, under the
// include:project access rule.
func TestRulesExistsProjectHosted(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "group/lib")
	e.createProject(t, "other/private")
	e.pushFiles(t, "group/lib", "main", map[string]string{"Dockerfile": "FROM scratch\n"}, "-o", "ci.skip")
	e.pushFiles(t, "other/private", "main", map[string]string{"Dockerfile": "FROM scratch\n"}, "-o", "ci.skip")
	e.createProject(t, "group/app")
	e.pushFiles(t, "group/app", "main", map[string]string{".gitlab-ci.yml": `
lib-has-dockerfile:
  script: [x]
  rules: [{exists: {paths: [Dockerfile], project: group/lib}}]
lib-has-makefile:
  script: [x]
  rules: [{exists: {paths: [Makefile], project: group/lib}}]
lib-at-missing-ref:
  script: [x]
  rules: [{exists: {paths: [Dockerfile], project: group/lib, ref: nope}}]
private:
  script: [x]
  rules: [{exists: {paths: [Dockerfile], project: other/private}}]
always:
  script: [x]
`}, "-o", "ci.skip")
	pl := e.createPipeline(t, "group%2Fapp", "main")
	st, err := e.srv.pipelines.PipelineState(t.Context(), pl.ID)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range st.Jobs {
		names = append(names, j.Name)
	}
	if got := strings.Join(names, ","); got != "lib-has-dockerfile,always" {
		t.Errorf("jobs %s, want lib-has-dockerfile,always", got)
	}
}
