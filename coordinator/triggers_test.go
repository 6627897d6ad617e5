package coordinator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

const triggerCI = `
by-token:
  script: [echo "$DEPLOY"]
  rules:
    - if: $CI_PIPELINE_SOURCE == "trigger"
by-job:
  script: [echo "$FROM"]
  rules:
    - if: $CI_PIPELINE_SOURCE == "pipeline"
caller:
  script: [x]
  rules:
    - if: $CI_PIPELINE_SOURCE == "api"
`

func (e *env) createTrigger(t *testing.T, project, tok string, fields ...string) restapi.PipelineTriggerJSON {
	t.Helper()
	r := e.formDo("POST", "/api/v4/projects/"+project+"/triggers", tok, false, fields...)
	expectCode(t, "create trigger", r, http.StatusCreated)
	var out restapi.PipelineTriggerJSON
	r.json(t, &out)
	return out
}

// TestTriggerPipelineWithToken: GitLab's documented curl calls with a
// trigger token create a pipeline of source trigger with the variables
// given and TRIGGER_PAYLOAD; the token is shown once and kept as a
// digest; a wrong, foreign, expired or deleted token creates nothing, and
// says no more than GitLab does about which projects exist.
func TestTriggerPipelineWithToken(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "acme/app")
	e.createProject(t, "acme/other")
	e.pushFiles(t, "acme%2Fapp", "main", map[string]string{".gitlab-ci.yml": triggerCI}, "-o", "ci.skip")
	runner := e.createRunner(restapi.CreateRunnerRequest{})

	trig := e.createTrigger(t, "acme%2Fapp", e.admin, "description", "deploy hook")
	if !strings.HasPrefix(trig.Token, "glptt-") || len(trig.Token) < 20 || trig.Description != "deploy hook" || trig.Owner.Username != "admin" || trig.LastUsed != nil {
		t.Fatalf("created trigger: %+v", trig)
	}
	var got restapi.PipelineTriggerJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/acme%%2Fapp/triggers/%d", trig.ID), nil).json(t, &got)
	if got.Token == trig.Token || !strings.HasPrefix(trig.Token, got.Token) || len(got.Token) != len("glptt-")+4 {
		t.Errorf("a read trigger shows token %q, want only the first characters of %q", got.Token, trig.Token)
	}
	if st, _ := e.st.ListPipelineTriggers(t.Context(), e.mustProject(t, "acme/app").ID); len(st) != 1 || strings.Contains(st[0].TokenDigest, trig.Token[6:]) || st[0].TokenDigest == trig.Token {
		t.Errorf("stored trigger %+v keeps the token", st)
	}

	// curl --form token=… --form ref=main --form "variables[DEPLOY]=yes"
	r := e.formDo("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", "", false, "token", trig.Token, "ref", "main", "variables[DEPLOY]", "yes", "variables[ZONE]", "eu")
	expectCode(t, "trigger", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	if pl.Source != "trigger" || pl.Ref != "main" {
		t.Fatalf("triggered pipeline: %+v", pl)
	}
	job := e.takeWait(runner)
	if job.JobInfo.Name != "by-token" || job.JobInfo.PipelineID != pl.ID {
		t.Fatalf("ran %s of %d, want by-token of %d", job.JobInfo.Name, job.JobInfo.PipelineID, pl.ID)
	}
	if v, ok := variable(job, "DEPLOY"); !ok || v.Value != "yes" {
		t.Errorf("DEPLOY = %+v", v)
	}
	payload, ok := variable(job, "TRIGGER_PAYLOAD")
	// Raw, as GitLab's: a $ in what the caller sent is not expanded.
	if !ok || !payload.File || !payload.Raw || !strings.Contains(payload.Value, `"DEPLOY":"yes"`) || !strings.Contains(payload.Value, `"ref":"main"`) || strings.Contains(payload.Value, trig.Token) {
		t.Errorf("TRIGGER_PAYLOAD = %+v, want a file with the parameters and without the token", payload)
	}
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/acme%%2Fapp/triggers/%d", trig.ID), nil).json(t, &got)
	if got.LastUsed == nil {
		t.Error("last_used not set after a use")
	}

	// The webhook form: the ref in the path, the token in the query.
	r = e.do("POST", "/api/v4/projects/acme%2Fapp/ref/main/trigger/pipeline?token="+trig.Token, nil, nil)
	expectCode(t, "webhook form", r, http.StatusCreated)
	// JSON, with variables that are not strings refused.
	r = e.do("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", map[string]any{"token": trig.Token, "ref": "main", "variables": map[string]any{"N": 1}}, nil)
	expectCode(t, "JSON variables not strings", r, http.StatusBadRequest)
	r = e.do("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", map[string]any{"token": trig.Token, "ref": "main", "variables": map[string]any{"N": "1"}}, nil)
	expectCode(t, "JSON", r, http.StatusCreated)

	before := len(mustPipelines(t, e))
	for _, tc := range []struct {
		what, path string
		fields     []string
		code       int
	}{
		{"no ref", "acme%2Fapp", []string{"token", trig.Token}, http.StatusBadRequest},
		{"no token", "acme%2Fapp", []string{"ref", "main"}, http.StatusBadRequest},
		{"a wrong token", "acme%2Fapp", []string{"token", "glptt-" + strings.Repeat("x", 24), "ref", "main"}, http.StatusNotFound},
		{"another project's token", "acme%2Fother", []string{"token", trig.Token, "ref", "main"}, http.StatusNotFound},
		{"a project that does not exist", "acme%2Fnope", []string{"token", trig.Token, "ref", "main"}, http.StatusNotFound},
		{"a ref that does not exist", "acme%2Fapp", []string{"token", trig.Token, "ref", "nope"}, http.StatusBadRequest},
		{"a bad variable name", "acme%2Fapp", []string{"token", trig.Token, "ref", "main", "variables[A-B]", "1"}, http.StatusBadRequest},
	} {
		r := e.formDo("POST", "/api/v4/projects/"+tc.path+"/trigger/pipeline", "", true, tc.fields...)
		if r.code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.what, r.code, r.body, tc.code)
		}
		if tc.code == http.StatusNotFound && string(r.body) != `{"message":"404 Not Found"}`+"\n" && string(r.body) != `{"message":"404 Not Found"}` {
			t.Errorf("%s: %s, want the same 404 whatever is missing", tc.what, r.body)
		}
	}
	if after := len(mustPipelines(t, e)); after != before {
		t.Errorf("refused triggers made %d pipelines", after-before)
	}

	// Expiry, and deletion.
	short := e.createTrigger(t, "acme%2Fapp", e.admin, "description", "short", "expires_at", e.clock.Now().Add(48*time.Hour).Format("2006-01-02"))
	expectCode(t, "before expiry", e.formDo("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", "", false, "token", short.Token, "ref", "main"), http.StatusCreated)
	e.clock.Advance(72 * time.Hour)
	expectCode(t, "after expiry", e.formDo("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", "", false, "token", short.Token, "ref", "main"), http.StatusForbidden)
	expectCode(t, "expiry in the past", e.formDo("POST", "/api/v4/projects/acme%2Fapp/triggers", e.admin, false, "description", "x", "expires_at", "2020-01-01"), http.StatusBadRequest)
	expectCode(t, "delete", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/acme%%2Fapp/triggers/%d", trig.ID), nil), http.StatusNoContent)
	expectCode(t, "deleted token", e.formDo("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", "", false, "token", trig.Token, "ref", "main"), http.StatusNotFound)
}

func (e *env) mustProject(t *testing.T, path string) *store.Project {
	t.Helper()
	p, err := e.srv.pipelines.Project(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTriggerPipelineWithJobToken: a running job's CI_JOB_TOKEN creates
// a downstream pipeline (source pipeline, linked to the job) of its own
// project or one of its group, not of another group's private project,
// and not once the job has finished.
func TestTriggerPipelineWithJobToken(t *testing.T) {
	e := newGitEnv(t, Config{})
	for _, p := range []string{"acme/app", "acme/lib", "other/private"} {
		e.createProject(t, p)
		e.pushFiles(t, strings.ReplaceAll(p, "/", "%2F"), "main", map[string]string{".gitlab-ci.yml": triggerCI}, "-o", "ci.skip")
	}
	runner := e.createRunner(restapi.CreateRunnerRequest{})
	up := e.createPipeline(t, "acme%2Fapp", "main")
	caller := e.takeWait(runner)
	expectCode(t, "ack", e.update(caller, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	jobTok := scriptToken(t, caller)

	r := e.formDo("POST", "/api/v4/projects/acme%2Flib/trigger/pipeline", "", false, "token", jobTok, "ref", "main", "variables[FROM]", "app")
	expectCode(t, "trigger with the job token", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	if pl.Source != "pipeline" || pl.UpstreamPipelineID != up.ID || pl.SourceJobID != caller.ID {
		t.Errorf("pipeline %+v, want source pipeline linked to pipeline %d and job %d", pl, up.ID, caller.ID)
	}
	down := e.takeWait(runner)
	if down.JobInfo.Name != "by-job" {
		t.Fatalf("ran %s, want by-job", down.JobInfo.Name)
	}
	for k, want := range map[string]string{"FROM": "app", "CI_UPSTREAM_PIPELINE_ID": fmt.Sprint(up.ID), "CI_UPSTREAM_JOB_ID": fmt.Sprint(caller.ID)} {
		if v, ok := variable(down, k); !ok || v.Value != want {
			t.Errorf("%s = %q, want %q", k, v.Value, want)
		}
	}
	expectCode(t, "own project", e.formDo("POST", "/api/v4/projects/acme%2Fapp/trigger/pipeline", "", false, "token", jobTok, "ref", "main"), http.StatusCreated)
	expectCode(t, "another group's private project", e.formDo("POST", "/api/v4/projects/other%2Fprivate/trigger/pipeline", "", false, "token", jobTok, "ref", "main"), http.StatusNotFound)
	expectCode(t, "finish", e.update(caller, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	expectCode(t, "after the job", e.formDo("POST", "/api/v4/projects/acme%2Flib/trigger/pipeline", "", false, "token", jobTok, "ref", "main"), http.StatusUnauthorized)
}

// TestTriggerTokenOwnerAccess: maintainers manage a project's tokens; a
// token creates pipelines with its owner's access, so a token whose
// owner became a developer no longer runs the protected default branch;
// only the owner renames it.
func TestTriggerTokenOwnerAccess(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": triggerCI}, "-o", "ci.skip")
	e.pushFiles(t, "p", "feature", map[string]string{".gitlab-ci.yml": triggerCI, "f": "1"}, "-o", "ci.skip")
	p := e.mustProject(t, "p")
	maint, other := e.newUser("maint", "read-only"), e.newUser("other", "read-only")
	dev := e.newUser("dev", "read-only")
	e.addMember(p, "maint", store.AccessMaintainer)
	e.addMember(p, "other", store.AccessMaintainer)
	e.addMember(p, "dev", store.AccessDeveloper)

	expectCode(t, "a developer creates a token", e.formDo("POST", "/api/v4/projects/p/triggers", dev, false, "description", "x"), http.StatusForbidden)
	trig := e.createTrigger(t, "p", maint, "description", "mine")
	if trig.Owner.Username != "maint" {
		t.Errorf("owner %+v", trig.Owner)
	}
	path := fmt.Sprintf("/api/v4/projects/p/triggers/%d", trig.ID)
	expectCode(t, "another maintainer renames it", e.do("PUT", path, map[string]any{"description": "theirs"}, map[string]string{runnerapi.HeaderPrivateToken: other}), http.StatusForbidden)
	r := e.do("PUT", path, map[string]any{"description": "renamed"}, map[string]string{runnerapi.HeaderPrivateToken: maint})
	expectCode(t, "the owner renames it", r, http.StatusOK)
	expectCode(t, "main, as a maintainer's", e.formDo("POST", "/api/v4/projects/p/trigger/pipeline", "", false, "token", trig.Token, "ref", "main"), http.StatusCreated)

	r = e.do("PUT", fmt.Sprintf("/api/v4/projects/%d/members/%d", p.ID, e.userID("maint")), restapi.MemberRequest{AccessLevel: int(store.AccessDeveloper)}, map[string]string{runnerapi.HeaderPrivateToken: e.admin})
	expectCode(t, "demote", r, http.StatusOK)
	r = e.formDo("POST", "/api/v4/projects/p/trigger/pipeline", "", false, "token", trig.Token, "ref", "main")
	expectCode(t, "main, as a developer's", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), "Insufficient permissions") {
		t.Errorf("refusal: %s", r.body)
	}
	expectCode(t, "a branch, as a developer's", e.formDo("POST", "/api/v4/projects/p/trigger/pipeline", "", false, "token", trig.Token, "ref", "feature"), http.StatusCreated)
}
