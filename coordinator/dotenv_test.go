package coordinator

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// TestDotenvReport: the variables of a dotenv report reach the jobs that
// take the artifacts of its job, above their YAML variables and below the
// project's and the pipeline's (artifacts:reports:dotenv).
func TestDotenvReport(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
stages: [build, test]
variables:
  GLOBAL_KEY: from-global-yaml
build:
  stage: build
  script: [make]
  artifacts:
    reports:
      dotenv: build.env
other:
  stage: build
  script: [make]
  artifacts:
    reports:
      dotenv: other.env
needs_it:
  stage: test
  needs: [build, other]
  variables:
    JOB_KEY: from-job-yaml
  script: [check]
depends:
  stage: test
  dependencies: [build]
  script: [check]
no_deps:
  stage: test
  dependencies: []
  script: [check]
no_artifacts:
  stage: test
  needs: [{job: build, artifacts: false}]
  script: [check]
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	expectCode(t, "project variable", e.adminDo("POST", "/api/v4/projects/p/variables",
		map[string]any{"key": "PROJECT_KEY", "value": "from-project"}), http.StatusCreated)
	r := e.adminDo("POST", "/api/v4/projects/p/pipeline", restapi.CreatePipelineRequest{Ref: "main",
		Variables: []restapi.PipelineVariable{{Key: "PIPELINE_KEY", Value: "from-pipeline"}}})
	expectCode(t, "create pipeline", r, http.StatusCreated)

	for range 2 {
		job := e.takeWait(tok)
		expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
		switch job.JobInfo.Name {
		case "build":
			for name, bad := range map[string]string{
				"empty line": "A=1\n\nB=2\n", "comment": "# c\n", "bad key": "MY-VAR=1\n",
				"too many": strings.Repeat("A=1\n", 1) + func() string {
					var b strings.Builder
					for i := range 21 {
						b.WriteString("K" + strings.Repeat("K", i) + "=1\n")
					}
					return b.String()
				}(),
			} {
				r := uploadArtifact(e, job, "?artifact_type=dotenv&artifact_format=gzip", artifactstest.GzipFiles(bad))
				expectCode(t, "invalid dotenv: "+name, r, http.StatusBadRequest)
			}
			r := uploadArtifact(e, job, "?artifact_type=dotenv&artifact_format=gzip", artifactstest.GzipFiles("A=1\nB\n"))
			if !strings.Contains(string(r.body), "line 2") {
				t.Errorf("invalid dotenv answered %s", r.body)
			}
			r = uploadArtifact(e, job, "?artifact_type=dotenv&artifact_format=gzip", bytes.Repeat([]byte("x"), 6000))
			expectCode(t, "dotenv too big", r, http.StatusBadRequest)
			expectCode(t, "dotenv", uploadArtifact(e, job, "?artifact_type=dotenv&artifact_format=gzip", artifactstest.GzipFiles(
				"BUILD_VERSION=1.2.3\nGLOBAL_KEY=from-dotenv\nJOB_KEY=from-dotenv\nPROJECT_KEY=from-dotenv\n"+
					"PIPELINE_KEY=from-dotenv\nSHARED=from-build\nBERTH_ISOLATION=vm\n")), http.StatusCreated)
		case "other":
			expectCode(t, "dotenv", uploadArtifact(e, job, "?artifact_type=dotenv&artifact_format=gzip", artifactstest.GzipFiles(
				"SHARED=from-other\nOTHER=1\n")), http.StatusCreated)
		default:
			t.Fatalf("unexpected job %s", job.JobInfo.Name)
		}
		expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	}

	jobs := map[string]*runnerapi.JobResponse{}
	for range 4 {
		job := e.runJob(tok, "success", 0)
		jobs[job.JobInfo.Name] = job
	}
	n := jobs["needs_it"]
	wantVar(t, n, "BUILD_VERSION", "1.2.3")
	wantVar(t, n, "GLOBAL_KEY", "from-dotenv")
	wantVar(t, n, "JOB_KEY", "from-dotenv")
	wantVar(t, n, "PROJECT_KEY", "from-project")
	wantVar(t, n, "PIPELINE_KEY", "from-pipeline")
	wantVar(t, n, "SHARED", "from-other") // the later dependency wins
	wantVar(t, n, "OTHER", "1")
	if v, ok := variable(n, "BERTH_ISOLATION"); ok {
		t.Errorf("a dotenv report set BERTH_ISOLATION=%s", v.Value)
	}
	if v, _ := variable(n, "BUILD_VERSION"); v.Public || v.Raw || v.Masked {
		t.Errorf("dotenv variable %+v", v)
	}
	d := jobs["depends"]
	wantVar(t, d, "BUILD_VERSION", "1.2.3")
	wantVar(t, d, "SHARED", "from-build")
	if _, ok := variable(d, "OTHER"); ok {
		t.Error("depends got the variables of a job it does not depend on")
	}
	for _, name := range []string{"no_deps", "no_artifacts"} {
		if v, ok := variable(jobs[name], "BUILD_VERSION"); ok {
			t.Errorf("%s got BUILD_VERSION=%s", name, v.Value)
		}
		wantVar(t, jobs[name], "GLOBAL_KEY", "from-global-yaml")
	}
}

// TestDotenvReachesTriggerJobs: a trigger job sees its dependencies'
// dotenv variables as any job does (GitLab's dependency_variables): they
// expand its variables and trigger:branch, and forward:pipeline_variables
// passes them downstream. The project's variables still win over them,
// and a need without artifacts brings none.
func TestDotenvReachesTriggerJobs(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "up")
	e.createProject(t, "group/down")
	e.pushFiles(t, "group/down", "rel", map[string]string{".gitlab-ci.yml": "down:\n  script: [x]\n"}, "-o", "ci.skip")
	e.pushFiles(t, "up", "main", map[string]string{"child.yml": "kid:\n  script: [x]\n", ".gitlab-ci.yml": `
stages: [build, deploy]
build:
  stage: build
  script: [make]
  artifacts:
    reports:
      dotenv: build.env
deploy:
  stage: deploy
  variables:
    APP_VERSION: v$BUILD_VERSION
    SEEN: $PROJECT_KEY
  trigger:
    project: group/down
    branch: $TARGET_BRANCH
    forward:
      pipeline_variables: true
child:
  stage: deploy
  needs: [{job: build, artifacts: false}]
  variables:
    APP_VERSION: v$BUILD_VERSION
  trigger:
    include: child.yml
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	expectCode(t, "project variable", e.adminDo("POST", "/api/v4/projects/up/variables",
		map[string]any{"key": "PROJECT_KEY", "value": "from-project"}), http.StatusCreated)
	r := e.adminDo("POST", "/api/v4/projects/up/pipeline", restapi.CreatePipelineRequest{Ref: "main"})
	expectCode(t, "create pipeline", r, http.StatusCreated)

	build := e.takeWait(tok)
	if build.JobInfo.Name != "build" {
		t.Fatalf("first job %s", build.JobInfo.Name)
	}
	expectCode(t, "ack", e.update(build, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "dotenv", uploadArtifact(e, build, "?artifact_type=dotenv&artifact_format=gzip", artifactstest.GzipFiles(
		"BUILD_VERSION=1.2.3\nTARGET_BRANCH=rel\nPROJECT_KEY=from-dotenv\n")), http.StatusCreated)
	expectCode(t, "finish", e.update(build, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	jobs := map[string]*runnerapi.JobResponse{}
	for range 2 {
		job := e.runJob(tok, "success", 0)
		jobs[job.JobInfo.Name] = job
	}
	down, kid := jobs["down"], jobs["kid"]
	if down == nil || kid == nil {
		t.Fatalf("downstream jobs %v, want down and kid", jobs)
	}
	wantVar(t, down, "CI_PROJECT_PATH", "group/down")
	wantVar(t, down, "CI_COMMIT_REF_NAME", "rel")
	wantVar(t, down, "APP_VERSION", "v1.2.3")
	wantVar(t, down, "SEEN", "from-project")
	wantVar(t, down, "BUILD_VERSION", "1.2.3")
	wantVar(t, kid, "APP_VERSION", "v")
	if v, ok := variable(kid, "BUILD_VERSION"); ok {
		t.Errorf("a child whose trigger needs build without artifacts got BUILD_VERSION=%s", v.Value)
	}
}
