package coordinator

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// TestDownloadRefArtifactsWithJobToken: GitLab's GET
// /projects/:id/jobs/artifacts/:ref/download?job=NAME gives the archive of
// the latest successful job of that name on the ref, to a job token whose
// project may read the project (as needs:project), and to the admin.
func TestDownloadRefArtifactsWithJobToken(t *testing.T) {
	e := newGitEnv(t, Config{})
	ci := map[string]string{".gitlab-ci.yml": "build:\n  script: [make]\n  artifacts: {paths: [out/]}\n"}
	lib := e.createProject(t, "group/lib")
	e.pushFiles(t, "group/lib", "main", ci, "-o", "ci.skip")
	e.createProject(t, "group/app")
	e.pushFiles(t, "group/app", "main", ci, "-o", "ci.skip")
	e.createProject(t, "other/x")
	e.pushFiles(t, "other/x", "main", ci, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})

	build := func(project, content string, ok bool) *runnerapi.JobResponse {
		e.createPipeline(t, project, "main")
		j := e.takeWait(tok)
		expectCode(t, "ack", e.update(j, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
		e.uploadArchive(t, j, map[string]string{"out/x": content})
		state := "success"
		if !ok {
			state = "failed"
		}
		expectCode(t, "finish", e.update(j, runnerapi.UpdateJobRequest{State: state}), http.StatusOK)
		return j
	}
	first := build("group%2Flib", "one", true)
	build("group%2Flib", "two", false) // the newest build failed: the one before counts
	// A running job of another project of the group downloads with its token.
	e.createPipeline(t, "group%2Fapp", "main")
	app := e.takeWait(tok)
	expectCode(t, "ack", e.update(app, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	script := scriptToken(t, app)
	path := "/api/v4/projects/group%2Flib/jobs/artifacts/main/download?job=build"
	r := e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: script})
	expectCode(t, "download by the group's job token", r, http.StatusOK)
	var firstArchive []byte
	{
		fr := e.do("GET", fmt.Sprintf("/api/v4/jobs/%d/artifacts", first.ID), nil, map[string]string{runnerapi.HeaderPrivateToken: e.admin})
		expectCode(t, "admin download by id", fr, http.StatusOK)
		firstArchive = fr.body
	}
	if string(r.body) != string(firstArchive) {
		t.Errorf("got %d bytes, want the last successful build's archive (%d bytes)", len(r.body), len(firstArchive))
	}
	byID := fmt.Sprintf("/api/v4/projects/%d/jobs/artifacts/main/download?job=build&job_token=%s", lib.ID, script)
	expectCode(t, "by project id, token in the query", e.do("GET", byID, nil, nil), http.StatusOK)
	expectCode(t, "admin", e.do("GET", path, nil, map[string]string{runnerapi.HeaderPrivateToken: e.admin}), http.StatusOK)
	expectCode(t, "no such job", e.do("GET", "/api/v4/projects/group%2Flib/jobs/artifacts/main/download?job=test", nil,
		map[string]string{runnerapi.HeaderJobToken: script}), http.StatusNotFound)
	expectCode(t, "no such ref", e.do("GET", "/api/v4/projects/group%2Flib/jobs/artifacts/dev/download?job=build", nil,
		map[string]string{runnerapi.HeaderJobToken: script}), http.StatusNotFound)
	expectCode(t, "a project of another group", e.do("GET", "/api/v4/projects/other%2Fx/jobs/artifacts/main/download?job=build", nil,
		map[string]string{runnerapi.HeaderJobToken: script}), http.StatusNotFound)
	expectCode(t, "no token", e.do("GET", path, nil, nil), http.StatusUnauthorized)
	expectCode(t, "bad token", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: "glcbt-nope"}), http.StatusForbidden)
	expectCode(t, "finish", e.update(app, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	expectCode(t, "a finished job's token", e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: script}), http.StatusForbidden)
}
