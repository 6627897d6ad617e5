package coordinator

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// TestRESTParamsAsGitLabClientsSendThem: the REST API reads parameters
// as GitLab's does — forms (curl --form, --data), the query, and JSON
// whose numbers and booleans are written as strings, as GitLab's own
// documented calls write them ("namespace_id": "42").
func TestRESTParamsAsGitLabClientsSendThem(t *testing.T) {
	e := newEnv(t, Config{})

	r := e.formDo("POST", "/api/v4/projects", e.admin, false, "name", "Demo", "path", "demo", "visibility", "public", "initialize_with_readme", "true")
	expectCode(t, "create a project with a form", r, http.StatusCreated)
	var p restapi.ProjectJSON
	r.json(t, &p)
	if p.Path != "demo" || p.Name != "Demo" || p.Visibility != "public" {
		t.Errorf("project %+v", p)
	}
	r = e.adminDo("PUT", "/api/v4/projects/demo?description=from+the+query", nil)
	expectCode(t, "update a project by query", r, http.StatusOK)
	r.json(t, &p)
	if p.Description != "from the query" {
		t.Errorf("description %q", p.Description)
	}

	r = e.formDo("POST", "/api/v4/user/runners", e.admin, true, "runner_type", "instance_type", "tag_list", "docker, linux", "maximum_timeout", "3600", "paused", "true")
	expectCode(t, "create a runner with a form", r, http.StatusCreated)
	var created runnerapi.RunnerTokenResponse
	r.json(t, &created)
	path := fmt.Sprintf("/api/v4/runners/%d", created.ID)
	var rn restapi.RunnerJSON
	e.adminDo("GET", path, nil).json(t, &rn)
	if fmt.Sprint(rn.TagList) != "[docker linux]" || rn.MaximumTimeout == nil || *rn.MaximumTimeout != 3600 || !rn.Paused {
		t.Errorf("runner from a form: tags %v, maximum_timeout %v, paused %v", rn.TagList, rn.MaximumTimeout, rn.Paused)
	}
	r = e.adminDo("PUT", path, map[string]any{"paused": "false", "maximum_timeout": "7200", "tag_list": "arm64"})
	expectCode(t, "update a runner with strings for a boolean and a number", r, http.StatusOK)
	e.adminDo("GET", path, nil).json(t, &rn)
	if fmt.Sprint(rn.TagList) != "[arm64]" || *rn.MaximumTimeout != 7200 || rn.Paused {
		t.Errorf("runner after JSON strings: tags %v, maximum_timeout %v, paused %v", rn.TagList, *rn.MaximumTimeout, rn.Paused)
	}
	r = e.adminDo("PUT", path, map[string]any{"maximum_timeout": "an hour"})
	expectCode(t, "a number that is not one", r, http.StatusBadRequest)
	var msg struct{ Message string }
	r.json(t, &msg)
	if msg.Message != `400 Bad request - maximum_timeout is invalid: "an hour" is not an integer` {
		t.Errorf("message %q", msg.Message)
	}
}

// TestLatestPipelineAndVariables: GET …/pipelines/latest is the newest
// pipeline of the ref's head commit, and …/pipelines/:id/variables what
// it was created with, raw flag included (GitLab's endpoints).
func TestLatestPipelineAndVariables(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"}, "-o", "ci.skip")
	expectCode(t, "no pipeline yet", e.adminDo("GET", "/api/v4/projects/p/pipelines/latest", nil), http.StatusNotFound)
	var first, second, latest restapi.PipelineJSON
	e.adminDo("POST", "/api/v4/projects/p/pipeline", restapi.CreatePipelineRequest{Ref: "main",
		Variables: []restapi.PipelineVariable{{Key: "A", Value: "1"}}}).json(t, &first)
	e.formDo("POST", "/api/v4/projects/p/pipeline", e.admin, true, "ref", "main",
		"variables[][key]", "CFG", "variables[][value]", "x", "variables[][variable_type]", "file").json(t, &second)
	r := e.adminDo("GET", "/api/v4/projects/p/pipelines/latest", nil)
	expectCode(t, "latest", r, http.StatusOK)
	if r.json(t, &latest); latest.ID != second.ID || second.ID <= first.ID {
		t.Errorf("latest %d, want the newest %d", latest.ID, second.ID)
	}
	e.adminDo("GET", "/api/v4/projects/p/pipelines/latest?ref=main", nil).json(t, &latest)
	if latest.ID != second.ID {
		t.Errorf("latest of main %d, want %d", latest.ID, second.ID)
	}
	expectCode(t, "a ref that does not exist", e.adminDo("GET", "/api/v4/projects/p/pipelines/latest?ref=nope", nil), http.StatusNotFound)

	var vars []restapi.PipelineVariableJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/p/pipelines/%d/variables", second.ID), nil).json(t, &vars)
	if len(vars) != 1 || vars[0] != (restapi.PipelineVariableJSON{VariableType: "file", Key: "CFG", Value: "x"}) {
		t.Errorf("variables %+v", vars)
	}

	// A new head commit without a pipeline: none is the latest.
	e.pushFiles(t, "p", "main", map[string]string{"README": "x"}, "-o", "ci.skip")
	expectCode(t, "head without a pipeline", e.adminDo("GET", "/api/v4/projects/p/pipelines/latest", nil), http.StatusNotFound)
}

// TestRunnerJobs: GET /runners/:id/jobs lists the jobs a runner was
// handed, newest first, by status (GitLab's endpoint).
func TestRunnerJobs(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\nb:\n  script: [x]\n"}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.createRunner(restapi.CreateRunnerRequest{}) // one that runs nothing
	var all []restapi.RunnerJSON
	e.adminDo("GET", "/api/v4/runners/all", nil).json(t, &all)
	if len(all) != 2 {
		t.Fatalf("runners %+v", all)
	}
	e.createPipeline(t, "p", "main")
	first := e.runJob(tok, "success", 0)
	second := e.runJob(tok, "failed", 1)
	ids := func(path string) []int64 {
		t.Helper()
		var jobs []restapi.JobJSON
		r := e.adminDo("GET", path, nil)
		expectCode(t, path, r, http.StatusOK)
		r.json(t, &jobs)
		var out []int64
		for _, j := range jobs {
			out = append(out, j.ID)
		}
		return out
	}
	base := fmt.Sprintf("/api/v4/runners/%d/jobs", all[0].ID)
	for path, want := range map[string][]int64{
		base:                    {second.ID, first.ID},
		base + "?sort=asc":      {first.ID, second.ID},
		base + "?status=failed": {second.ID},
		base + "?per_page=1":    {second.ID},
		fmt.Sprintf("/api/v4/runners/%d/jobs", all[1].ID): nil,
	} {
		if got := ids(path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	expectCode(t, "bad status", e.adminDo("GET", base+"?status=sleeping", nil), http.StatusBadRequest)
	expectCode(t, "no such runner", e.adminDo("GET", "/api/v4/runners/999/jobs", nil), http.StatusNotFound)
}

// TestScheduleInputsFromAForm: GitLab's documented schedule calls give
// inputs as --form "inputs[][name]=…" "inputs[][value]=…" (and
// "inputs[][destroy]=true" to remove one); they reach the schedule.
func TestScheduleInputsFromAForm(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"}, "-o", "ci.skip")
	r := e.formDo("POST", "/api/v4/projects/p/pipeline_schedules", e.admin, false, "description", "Build packages", "ref", "main",
		"cron", "0 1 * * 5", "cron_timezone", "UTC", "active", "true",
		"inputs[][name]", "deploy_strategy", "inputs[][value]", "blue-green", "inputs[][name]", "existing_input", "inputs[][value]", "x")
	expectCode(t, "create a schedule with form inputs", r, http.StatusCreated)
	ps := scheduleOf(t, r)
	if fmt.Sprint(ps.Inputs) != "[{deploy_strategy blue-green} {existing_input x}]" {
		t.Fatalf("inputs %v", ps.Inputs)
	}
	// curl --data keeps the fields' order, which says which entry a
	// field belongs to (url.Values.Encode would sort them).
	r = e.do("PUT", fmt.Sprintf("/api/v4/projects/p/pipeline_schedules/%d", ps.ID),
		[]byte("inputs%5B%5D%5Bname%5D=deploy_strategy&inputs%5B%5D%5Bvalue%5D=rolling&inputs[][name]=existing_input&inputs[][destroy]=true"),
		map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Content-Type": "application/x-www-form-urlencoded"})
	expectCode(t, "update the inputs with a form", r, http.StatusOK)
	if ps = scheduleOf(t, r); fmt.Sprint(ps.Inputs) != "[{deploy_strategy rolling}]" {
		t.Errorf("inputs after the update %v", ps.Inputs)
	}
}
