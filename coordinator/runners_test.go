package coordinator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

func TestRegisterVerifyUnregisterLegacyRunner(t *testing.T) {
	e := newEnv(t, Config{})
	r := e.adminDo("POST", "/api/v4/runners/reset_registration_token", nil)
	expectCode(t, "reset registration token", r, http.StatusCreated)
	var reg runnerapi.RunnerTokenResponse
	r.json(t, &reg)
	if !strings.HasPrefix(reg.Token, "GR1348941") {
		t.Fatalf("registration token %q lacks GR1348941 prefix", reg.Token)
	}

	r = e.do("POST", "/api/v4/runners", map[string]any{"token": "GR1348941wrong"}, nil)
	expectCode(t, "register with bad token", r, http.StatusForbidden)

	r = e.do("POST", "/api/v4/runners", map[string]any{"token": reg.Token, "description": "d", "tag_list": "docker, linux", "run_untagged": false}, nil)
	expectCode(t, "register", r, http.StatusCreated)
	var created runnerapi.RunnerTokenResponse
	r.json(t, &created)
	if created.ID == 0 || !strings.HasPrefix(created.Token, "glrtr-") || created.TokenExpiresAt != nil {
		t.Fatalf("register answer %+v: want id, glrtr- token, null expiry", created)
	}
	rn, err := e.st.GetRunner(t.Context(), created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rn.Tags, ",") != "docker,linux" || rn.RunUntagged || !rn.Legacy {
		t.Fatalf("stored runner %+v", rn)
	}
	if rn.TokenDigest == created.Token || strings.Contains(rn.TokenDigest, "glrtr") {
		t.Fatal("plain token stored")
	}

	r = e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: created.Token, SystemID: "s_abc"}, nil)
	expectCode(t, "verify", r, http.StatusOK)
	var ver runnerapi.RunnerTokenResponse
	r.json(t, &ver)
	if ver.ID != created.ID || ver.Token != created.Token {
		t.Fatalf("verify answer %+v", ver)
	}
	ms, _ := e.st.ListRunnerManagers(t.Context(), created.ID)
	if len(ms) != 1 || ms[0].SystemID != "s_abc" {
		t.Fatalf("managers after verify: %+v", ms)
	}
	expectCode(t, "verify bad token", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: "glrt-nope"}, nil), http.StatusForbidden)

	expectCode(t, "unregister", e.do("DELETE", "/api/v4/runners", runnerapi.TokenRequest{Token: created.Token}, nil), http.StatusNoContent)
	expectCode(t, "verify after unregister", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: created.Token}, nil), http.StatusForbidden)
}

func TestRegistrationScopesAndDisabled(t *testing.T) {
	e := newEnv(t, Config{})
	var reg runnerapi.RunnerTokenResponse
	e.adminDo("POST", "/api/v4/projects/42/runners/reset_registration_token", nil).json(t, &reg)
	r := e.do("POST", "/api/v4/runners", map[string]any{"token": reg.Token, "tag_list": []string{"a"}}, nil)
	expectCode(t, "register project runner", r, http.StatusCreated)
	var created runnerapi.RunnerTokenResponse
	r.json(t, &created)
	rn, _ := e.st.GetRunner(t.Context(), created.ID)
	if rn.Type != "project_type" || len(rn.ProjectIDs) != 1 || rn.ProjectIDs[0] != 42 {
		t.Fatalf("project runner %+v", rn)
	}
	expectCode(t, "bad access level", e.do("POST", "/api/v4/runners", map[string]any{"token": reg.Token, "access_level": "x"}, nil), http.StatusBadRequest)
	// A new token for the same scope replaces the old one.
	e.adminDo("POST", "/api/v4/projects/42/runners/reset_registration_token", nil)
	expectCode(t, "register with replaced token", e.do("POST", "/api/v4/runners", map[string]any{"token": reg.Token}, nil), http.StatusForbidden)

	d := newEnv(t, Config{RegistrationDisabled: true})
	d.adminDo("POST", "/api/v4/runners/reset_registration_token", nil).json(t, &reg)
	expectCode(t, "register when disabled", d.do("POST", "/api/v4/runners", map[string]any{"token": reg.Token}, nil), http.StatusGone)
}

func TestDeleteRunnerManager(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	if !strings.HasPrefix(tok, "glrt-t1_") {
		t.Fatalf("instance runner token %q lacks glrt-t1_", tok)
	}
	e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: tok, SystemID: "s_one"}, nil)
	expectCode(t, "no system_id", e.do("DELETE", "/api/v4/runners/managers", runnerapi.ManagerRequest{Token: tok}, nil), http.StatusBadRequest)
	expectCode(t, "unknown manager", e.do("DELETE", "/api/v4/runners/managers", runnerapi.ManagerRequest{Token: tok, SystemID: "s_two"}, nil), http.StatusNotFound)
	expectCode(t, "bad token", e.do("DELETE", "/api/v4/runners/managers", runnerapi.ManagerRequest{Token: "glrt-x", SystemID: "s_one"}, nil), http.StatusForbidden)
	expectCode(t, "delete manager", e.do("DELETE", "/api/v4/runners/managers", runnerapi.ManagerRequest{Token: tok, SystemID: "s_one"}, nil), http.StatusNoContent)
	// The runner itself survives.
	expectCode(t, "verify after manager delete", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: tok}, nil), http.StatusOK)
}

func TestResetAuthenticationTokenAndExpiry(t *testing.T) {
	e := newEnv(t, Config{RunnerTokenExpiresIn: 24 * time.Hour})
	tok := e.createRunner(restapi.CreateRunnerRequest{RunnerType: "group_type", GroupID: 5})
	if !strings.HasPrefix(tok, "glrt-t2_") {
		t.Fatalf("group runner token %q", tok)
	}
	r := e.do("POST", "/api/v4/runners/reset_authentication_token", runnerapi.TokenRequest{Token: tok}, nil)
	expectCode(t, "reset", r, http.StatusCreated)
	var out runnerapi.RunnerTokenResponse
	r.json(t, &out)
	if out.Token == tok || !strings.HasPrefix(out.Token, "glrt-t2_") || out.TokenExpiresAt == nil {
		t.Fatalf("reset answer %+v", out)
	}
	exp, err := time.Parse(time.RFC3339, *out.TokenExpiresAt)
	if err != nil || !exp.Equal(e.clock.Now().Add(24*time.Hour).Truncate(time.Second)) {
		t.Fatalf("expiry %v (%v)", exp, err)
	}
	expectCode(t, "old token after reset", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: tok}, nil), http.StatusForbidden)
	expectCode(t, "new token", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: out.Token}, nil), http.StatusOK)
	e.clock.Advance(24 * time.Hour)
	expectCode(t, "expired token", e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: out.Token}, nil), http.StatusForbidden)
	expectCode(t, "jobs/request with expired token", e.do("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: out.Token}, nil), http.StatusForbidden)
}

func TestAdminAuth(t *testing.T) {
	e := newEnv(t, Config{})
	expectCode(t, "no token", e.do("GET", "/api/v4/runners/all", nil, nil), http.StatusUnauthorized)
	expectCode(t, "wrong token", e.do("GET", "/api/v4/runners/all", nil, map[string]string{"PRIVATE-TOKEN": "glpat-wrong"}), http.StatusForbidden)
	expectCode(t, "bearer", e.do("GET", "/api/v4/runners/all", nil, map[string]string{"Authorization": "Bearer " + e.admin}), http.StatusOK)
	expectCode(t, "bad runner type", e.adminDo("POST", "/api/v4/user/runners", map[string]any{"runner_type": "x"}), http.StatusBadRequest)
	expectCode(t, "group runner without group", e.adminDo("POST", "/api/v4/user/runners", map[string]any{"runner_type": "group_type"}), http.StatusBadRequest)

	e.createRunner(restapi.CreateRunnerRequest{TagList: []string{"b", "a"}, Description: "mine"})
	var list []restapi.RunnerJSON
	e.adminDo("GET", "/api/v4/runners/all", nil).json(t, &list)
	if len(list) != 1 || list[0].Description != "mine" || strings.Join(list[0].TagList, ",") != "a,b" || list[0].RunUntagged || list[0].Status != "never_contacted" {
		t.Fatalf("runners: %+v", list)
	}
}

func TestAssignProjectRunners(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := t.Context()
	a, err := e.srv.pipelines.CreateProject(ctx, pipelines.ProjectSpec{Path: "acme/a"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.srv.pipelines.CreateProject(ctx, pipelines.ProjectSpec{Path: "acme/b"})
	tok := e.createRunner(restapi.CreateRunnerRequest{RunnerType: "project_type", ProjectID: a.ID})
	e.createRunner(restapi.CreateRunnerRequest{RunnerType: "project_type", ProjectID: a.ID, Locked: true})
	e.createRunner(restapi.CreateRunnerRequest{})
	ids := map[string]int64{}
	var list []restapi.RunnerJSON
	e.adminDo("GET", "/api/v4/runners/all", nil).json(t, &list)
	for _, rn := range list {
		ids[rn.RunnerType+fmt.Sprint(rn.Locked)] = rn.ID
	}
	path := fmt.Sprintf("/api/v4/projects/%d/runners", b.ID)
	expectCode(t, "locked runner", e.adminDo("POST", path, map[string]any{"runner_id": ids["project_typetrue"]}), http.StatusForbidden)
	expectCode(t, "instance runner", e.adminDo("POST", path, map[string]any{"runner_id": ids["instance_typefalse"]}), http.StatusForbidden)
	expectCode(t, "unknown runner", e.adminDo("POST", path, map[string]any{"runner_id": 999}), http.StatusNotFound)
	expectCode(t, "enable", e.adminDo("POST", path, map[string]any{"runner_id": ids["project_typefalse"]}), http.StatusCreated)
	expectCode(t, "enable twice", e.adminDo("POST", path, map[string]any{"runner_id": ids["project_typefalse"]}), http.StatusConflict)

	// The runner now takes project b's jobs.
	spec := simpleSpec("b-job")
	spec.ProjectID = b.ID
	id := e.enqueue(spec)
	if got := e.take(tok); got.ID != id {
		t.Fatalf("runner got job %d, want %d", got.ID, id)
	}

	expectCode(t, "disable", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/runners/%d", a.ID, ids["project_typefalse"]), nil), http.StatusNoContent)
	expectCode(t, "disable the last project", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/runners/%d", b.ID, ids["project_typefalse"]), nil), http.StatusForbidden)
	expectCode(t, "disable from a project it is not in", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/runners/%d", a.ID, ids["project_typefalse"]), nil), http.StatusNotFound)
	rn, _ := e.st.GetRunner(ctx, ids["project_typefalse"])
	if len(rn.ProjectIDs) != 1 || rn.ProjectIDs[0] != b.ID {
		t.Fatalf("projects of runner: %v", rn.ProjectIDs)
	}
}
