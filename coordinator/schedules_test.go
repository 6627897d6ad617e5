package coordinator

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// formDo sends fields as curl --form does (multipart), or as --data does
// (URL-encoded) when urlencoded is set.
func (e *env) formDo(method, path, token string, urlencoded bool, fields ...string) resp {
	e.t.Helper()
	var body bytes.Buffer
	ctype := "application/x-www-form-urlencoded"
	if urlencoded {
		// In the given order, as curl --data sends them (url.Values
		// would sort them, and the order says which entry of a list of
		// hashes a field is in).
		for i := 0; i+1 < len(fields); i += 2 {
			if i > 0 {
				body.WriteByte('&')
			}
			body.WriteString(url.QueryEscape(fields[i]) + "=" + url.QueryEscape(fields[i+1]))
		}
	} else {
		mw := multipart.NewWriter(&body)
		for i := 0; i+1 < len(fields); i += 2 {
			if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
				e.t.Fatal(err)
			}
		}
		mw.Close()
		ctype = mw.FormDataContentType()
	}
	return e.do(method, path, body.Bytes(), map[string]string{runnerapi.HeaderPrivateToken: token, "Content-Type": ctype})
}

func scheduleOf(t *testing.T, r resp) restapi.PipelineScheduleJSON {
	t.Helper()
	var out restapi.PipelineScheduleJSON
	r.json(t, &out)
	return out
}

func nextRun(t *testing.T, ps restapi.PipelineScheduleJSON) time.Time {
	t.Helper()
	if ps.NextRunAt == nil {
		t.Fatalf("schedule %d has no next_run_at", ps.ID)
	}
	at, err := time.Parse(time.RFC3339, *ps.NextRunAt)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// schedulePipelines lists the pipelines a schedule created, oldest first.
func (e *env) schedulePipelines(t *testing.T, project string, id int64) []restapi.PipelineBasicJSON {
	t.Helper()
	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%s/pipeline_schedules/%d/pipelines", url.PathEscape(project), id), nil)
	expectCode(t, "schedule pipelines", r, http.StatusOK)
	var out []restapi.PipelineBasicJSON
	r.json(t, &out)
	return out
}

func (e *env) reap(t *testing.T) {
	t.Helper()
	if err := e.srv.Reap(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestPipelineSchedules: a schedule made with curl --form runs its
// pipeline at its cron time in its zone, once however often the reaper
// looks, with its variables and CI_PIPELINE_SOURCE=schedule; play runs
// it now; a coordinator that was down runs it once when back; paused
// schedules do not run and do not make up for missed runs.
func TestPipelineSchedules(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
nightly:
  script: [echo "$SUITE"]
  rules:
    - if: $CI_PIPELINE_SOURCE == "schedule"
on-push:
  script: [x]
  except: [schedules]
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	base := "/api/v4/projects/p/pipeline_schedules"

	// The clock is Sunday 2026-11-22 10:00 UTC; 02:00 in Berlin (CET) is
	// 01:00 UTC.
	r := e.formDo("POST", base, e.admin, false, "description", "Nightly", "ref", "main", "cron", " 0 2 * * * ", "cron_timezone", "Europe/Berlin")
	expectCode(t, "create", r, http.StatusCreated)
	ps := scheduleOf(t, r)
	if ps.Cron != "0 2 * * *" || ps.CronTimezone != "Europe/Berlin" || !ps.Active || ps.Owner.Username != "admin" || ps.LastPipeline != nil {
		t.Errorf("created: %+v", ps)
	}
	if want := time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC); !nextRun(t, ps).Equal(want) {
		t.Errorf("next_run_at %s, want %s", nextRun(t, ps), want)
	}
	r = e.formDo("POST", fmt.Sprintf("%s/%d/variables", base, ps.ID), e.admin, true, "key", "SUITE", "value", "full-suite")
	expectCode(t, "add variable", r, http.StatusCreated)

	e.clock.Advance(14*time.Hour + 59*time.Minute) // 00:59 UTC
	e.reap(t)
	if got := e.schedulePipelines(t, "p", ps.ID); len(got) != 0 {
		t.Fatalf("pipelines before the time: %+v", got)
	}
	e.clock.Advance(70 * time.Second) // 01:00:10 UTC
	e.reap(t)
	e.reap(t) // a second round at the same time runs nothing more
	got := e.schedulePipelines(t, "p", ps.ID)
	if len(got) != 1 || got[0].Source != "schedule" || got[0].Ref != "main" {
		t.Fatalf("pipelines at the time: %+v", got)
	}
	job := e.takeWait(tok)
	if job.JobInfo.Name != "nightly" || job.JobInfo.PipelineID != got[0].ID {
		t.Fatalf("job %s of pipeline %d, want nightly of %d", job.JobInfo.Name, job.JobInfo.PipelineID, got[0].ID)
	}
	for k, want := range map[string]string{"SUITE": "full-suite", "CI_PIPELINE_SOURCE": "schedule", "CI_PIPELINE_SCHEDULE_DESCRIPTION": "Nightly"} {
		if v, ok := variable(job, k); !ok || v.Value != want {
			t.Errorf("variable %s = %q (%v), want %q", k, v.Value, ok, want)
		}
	}
	st, err := e.srv.pipelines.PipelineState(t.Context(), got[0].ID)
	if err != nil || len(st.Jobs) != 1 {
		t.Errorf("scheduled pipeline's jobs: %d %v, want only nightly (on-push is except: schedules)", len(st.Jobs), err)
	}
	r = e.adminDo("GET", fmt.Sprintf("%s/%d", base, ps.ID), nil)
	expectCode(t, "get", r, http.StatusOK)
	ps = scheduleOf(t, r)
	if want := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC); !nextRun(t, ps).Equal(want) {
		t.Errorf("next_run_at after the run %s, want %s", nextRun(t, ps), want)
	}
	if ps.LastPipeline == nil || ps.LastPipeline.ID != got[0].ID || ps.Variables == nil || len(*ps.Variables) != 1 || (*ps.Variables)[0].Value != "full-suite" {
		t.Errorf("details: last pipeline %+v, variables %+v", ps.LastPipeline, ps.Variables)
	}

	// Play runs it now and leaves the next run where it is.
	r = e.adminDo("POST", fmt.Sprintf("%s/%d/play", base, ps.ID), nil)
	expectCode(t, "play", r, http.StatusCreated)
	if got = e.schedulePipelines(t, "p", ps.ID); len(got) != 2 {
		t.Fatalf("pipelines after play: %d, want 2", len(got))
	}
	if p := scheduleOf(t, e.adminDo("GET", fmt.Sprintf("%s/%d", base, ps.ID), nil)); !nextRun(t, p).Equal(nextRun(t, ps)) {
		t.Errorf("play moved the next run to %s", nextRun(t, p))
	}

	// Down for three days: one run when back, then the next one ahead.
	e.clock.Advance(3 * 24 * time.Hour)
	e.reap(t)
	if got = e.schedulePipelines(t, "p", ps.ID); len(got) != 3 {
		t.Fatalf("pipelines after three days away: %d, want 3 (one catch-up run)", len(got))
	}
	ps = scheduleOf(t, e.adminDo("GET", fmt.Sprintf("%s/%d", base, ps.ID), nil))
	if want := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC); !nextRun(t, ps).Equal(want) {
		t.Errorf("next_run_at after catching up %s, want %s", nextRun(t, ps), want)
	}

	// Paused: no runs; activated again: the next run counts from now.
	r = e.adminDo("PUT", fmt.Sprintf("%s/%d", base, ps.ID), map[string]any{"active": "false"})
	expectCode(t, "pause", r, http.StatusOK)
	e.clock.Advance(5 * 24 * time.Hour) // Tuesday 2026-12-01 01:00:10 UTC
	e.reap(t)
	if got = e.schedulePipelines(t, "p", ps.ID); len(got) != 3 {
		t.Fatalf("a paused schedule ran: %d pipelines", len(got))
	}
	e.clock.Advance(5 * time.Hour)
	r = e.formDo("PUT", fmt.Sprintf("%s/%d", base, ps.ID), e.admin, false, "active", "true", "cron", "30 */6 * * *", "cron_timezone", "UTC")
	expectCode(t, "activate", r, http.StatusOK)
	ps = scheduleOf(t, r)
	if want := time.Date(2026, 12, 1, 6, 30, 0, 0, time.UTC); !nextRun(t, ps).Equal(want) || !ps.Active || ps.Cron != "30 */6 * * *" {
		t.Errorf("after activating: active %v cron %q next %s, want next %s", ps.Active, ps.Cron, nextRun(t, ps), want)
	}
	e.reap(t)
	if got = e.schedulePipelines(t, "p", ps.ID); len(got) != 3 {
		t.Fatalf("activating made up for missed runs: %d pipelines", len(got))
	}

	var bySource []restapi.PipelineJSON
	e.adminDo("GET", "/api/v4/projects/p/pipelines?source=schedule", nil).json(t, &bySource)
	if len(bySource) != 3 {
		t.Errorf("pipelines?source=schedule: %d, want 3", len(bySource))
	}
	e.adminDo("GET", "/api/v4/projects/p/pipelines?source=push", nil).json(t, &bySource)
	if len(bySource) != 0 {
		t.Errorf("pipelines?source=push: %d, want none (the push skipped CI)", len(bySource))
	}

	// Lists, and deleting keeps the pipelines.
	var list []restapi.PipelineScheduleJSON
	e.adminDo("GET", base+"?scope=inactive", nil).json(t, &list)
	if len(list) != 0 {
		t.Errorf("inactive schedules: %+v", list)
	}
	e.adminDo("GET", base+"?scope=active", nil).json(t, &list)
	if len(list) != 1 || list[0].ID != ps.ID || list[0].Variables != nil || list[0].LastPipeline != nil {
		t.Errorf("active schedules: %+v (a list shows neither variables nor the last pipeline)", list)
	}
	expectCode(t, "delete", e.adminDo("DELETE", fmt.Sprintf("%s/%d", base, ps.ID), nil), http.StatusNoContent)
	expectCode(t, "get deleted", e.adminDo("GET", fmt.Sprintf("%s/%d", base, ps.ID), nil), http.StatusNotFound)
	if pls := mustPipelines(t, e); len(pls) != 3 {
		t.Errorf("pipelines after deleting the schedule: %d, want 3", len(pls))
	}
}

// TestPipelineScheduleErrors: invalid fields are answered field by field;
// a configuration error at run time makes a failed pipeline that says
// why; a ref that is gone makes none and the schedule runs again later.
func TestPipelineScheduleErrors(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "job:\n  script: [x]\n"}, "-o", "ci.skip")
	base := "/api/v4/projects/p/pipeline_schedules"
	for _, tc := range []struct {
		body  map[string]any
		field string
		says  string
	}{
		{map[string]any{"ref": "main", "cron": "@daily"}, "description", "is missing"},
		{map[string]any{"description": "d", "cron": "@daily"}, "ref", "is missing"},
		{map[string]any{"description": "d", "ref": "main", "cron": "0 25 * * *"}, "cron", "is invalid syntax: \"0 25 * * *\": hour: value \"25\" outside 0-23"},
		{map[string]any{"description": "d", "ref": "main", "cron": "@reboot"}, "cron", "unknown descriptor"},
		{map[string]any{"description": "d", "ref": "main", "cron": "0 0 30 2 *"}, "cron", "never matches"},
		{map[string]any{"description": "d", "ref": "main", "cron": "@daily", "cron_timezone": "Mars/Olympus"}, "cron_timezone", "is not a time zone"},
		{map[string]any{"description": "d", "ref": "main", "cron": "@daily", "cron_timezone": "Local"}, "cron_timezone", "is not a time zone"},
		{map[string]any{"description": " ", "ref": "main", "cron": "@daily"}, "description", "can't be blank"},
		{map[string]any{"description": "d", "ref": "main", "cron": "@daily", "inputs": []map[string]any{{"name": "a", "value": 1}, {"name": "a", "value": 2}}}, "inputs", "given twice"},
	} {
		r := e.adminDo("POST", base, tc.body)
		expectCode(t, fmt.Sprintf("create %v", tc.body), r, http.StatusBadRequest)
		var out struct {
			Message map[string][]string `json:"message"`
		}
		r.json(t, &out)
		if msgs := out.Message[tc.field]; len(msgs) == 0 || !strings.Contains(strings.Join(msgs, "; "), tc.says) {
			t.Errorf("create %v: %s, want %s %q", tc.body, r.body, tc.field, tc.says)
		}
	}
	expectCode(t, "active not a boolean", e.formDo("POST", base, e.admin, false, "description", "d", "ref", "main", "cron", "@daily", "active", "maybe"), http.StatusBadRequest)
	if n := len(mustSchedules(t, e, "p")); n != 0 {
		t.Fatalf("%d schedules stored from invalid requests", n)
	}

	// A branch whose configuration is broken, and one that goes away.
	e.pushFiles(t, "p", "broken", map[string]string{".gitlab-ci.yml": "job:\n  script: [x]\n  when: sometimes\n"}, "-o", "ci.skip")
	broken := scheduleOf(t, e.adminDo("POST", base, map[string]any{"description": "broken", "ref": "broken", "cron": "* * * * *"}))
	gone := scheduleOf(t, e.adminDo("POST", base, map[string]any{"description": "gone", "ref": "no-such-branch", "cron": "* * * * *"}))
	e.clock.Advance(time.Minute)
	e.reap(t)
	pls := e.schedulePipelines(t, "p", broken.ID)
	if len(pls) != 1 || pls[0].Status != "failed" {
		t.Fatalf("broken configuration: %+v, want one failed pipeline", pls)
	}
	pl, err := e.st.GetPipeline(t.Context(), pls[0].ID)
	if err != nil || !strings.Contains(pl.YAMLErrors, "when") || pl.FailureReason != "config_error" {
		t.Errorf("failed pipeline: %+v %v, want the configuration error", pl, err)
	}
	if pls := e.schedulePipelines(t, "p", gone.ID); len(pls) != 0 {
		t.Errorf("a ref that does not exist made %+v", pls)
	}
	g := scheduleOf(t, e.adminDo("GET", fmt.Sprintf("%s/%d", base, gone.ID), nil))
	if !g.Active || !nextRun(t, g).After(e.clock.Now()) {
		t.Errorf("schedule of a missing ref: active %v next %s, want active with a next run", g.Active, nextRun(t, g))
	}
	r := e.adminDo("POST", fmt.Sprintf("%s/%d/play", base, gone.ID), nil)
	expectCode(t, "play a missing ref", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), "Reference not found") {
		t.Errorf("play a missing ref: %s", r.body)
	}
	// Variables: duplicate keys, bad keys, missing ones.
	vars := fmt.Sprintf("%s/%d/variables", base, broken.ID)
	expectCode(t, "add", e.adminDo("POST", vars, map[string]any{"key": "A", "value": "1"}), http.StatusCreated)
	expectCode(t, "add again", e.adminDo("POST", vars, map[string]any{"key": "A", "value": "2"}), http.StatusBadRequest)
	expectCode(t, "bad key", e.adminDo("POST", vars, map[string]any{"key": "A-B", "value": "2"}), http.StatusBadRequest)
	expectCode(t, "bad type", e.adminDo("POST", vars, map[string]any{"key": "B", "value": "2", "variable_type": "secret"}), http.StatusBadRequest)
	expectCode(t, "no value", e.adminDo("POST", vars, map[string]any{"key": "B"}), http.StatusBadRequest)
	r = e.adminDo("PUT", vars+"/A", map[string]any{"value": "3", "variable_type": "file"})
	expectCode(t, "update", r, http.StatusOK)
	var v restapi.ScheduleVariableJSON
	r.json(t, &v)
	if v.Value != "3" || v.VariableType != "file" {
		t.Errorf("updated variable: %+v", v)
	}
	expectCode(t, "update missing", e.adminDo("PUT", vars+"/NOPE", map[string]any{"value": "3"}), http.StatusNotFound)
	expectCode(t, "delete", e.adminDo("DELETE", vars+"/A", nil), http.StatusAccepted)
	expectCode(t, "delete again", e.adminDo("DELETE", vars+"/A", nil), http.StatusNotFound)
}

func mustSchedules(t *testing.T, e *env, project string) []*store.PipelineSchedule {
	t.Helper()
	p, err := e.srv.pipelines.Project(t.Context(), project)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := e.st.ListPipelineSchedules(t.Context(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestPipelineScheduleAccess: GitLab's rules over Berth's members. A
// developer schedules on an unprotected branch, not on the default one;
// only the owner edits a schedule, a maintainer takes it over first;
// reporters see schedules but not their variables; a schedule whose
// owner may no longer run pipelines is deactivated at its next run.
func TestPipelineScheduleAccess(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "job:\n  script: [x]\n"}, "-o", "ci.skip")
	e.pushFiles(t, "p", "feature", map[string]string{"f": "1"}, "-o", "ci.skip")
	p, err := e.srv.pipelines.Project(t.Context(), "p")
	if err != nil {
		t.Fatal(err)
	}
	dev, dev2, maint, rep := e.newUser("dev", "read-only"), e.newUser("dev2", "read-only"), e.newUser("maint", "read-only"), e.newUser("rep", "read-only")
	e.addMember(p, "dev", store.AccessDeveloper)
	e.addMember(p, "dev2", store.AccessDeveloper)
	e.addMember(p, "maint", store.AccessMaintainer)
	e.addMember(p, "rep", store.AccessReporter)
	base := "/api/v4/projects/p/pipeline_schedules"
	as := func(tok, method, path string, body any) resp {
		return e.do(method, path, body, map[string]string{runnerapi.HeaderPrivateToken: tok})
	}

	expectCode(t, "developer on the protected default branch", as(dev, "POST", base, map[string]any{"description": "d", "ref": "main", "cron": "@daily"}), http.StatusForbidden)
	expectCode(t, "reporter", as(rep, "POST", base, map[string]any{"description": "d", "ref": "feature", "cron": "@daily"}), http.StatusForbidden)
	r := as(dev, "POST", base, map[string]any{"description": "d", "ref": "feature", "cron": "@daily"})
	expectCode(t, "developer on a branch", r, http.StatusCreated)
	ps := scheduleOf(t, r)
	if ps.Owner.Username != "dev" || ps.Variables == nil {
		t.Errorf("owner %+v, variables %v: want dev, who sees them", ps.Owner, ps.Variables)
	}
	one := fmt.Sprintf("%s/%d", base, ps.ID)
	expectCode(t, "owner adds a variable", as(dev, "POST", one+"/variables", map[string]any{"key": "K", "value": "secret"}), http.StatusCreated)
	expectCode(t, "owner moves it to the protected branch", as(dev, "PUT", one, map[string]any{"ref": "main"}), http.StatusForbidden)
	expectCode(t, "another developer edits", as(dev2, "PUT", one, map[string]any{"description": "x"}), http.StatusForbidden)
	expectCode(t, "another developer deletes", as(dev2, "DELETE", one, nil), http.StatusForbidden)
	expectCode(t, "another developer takes it", as(dev2, "POST", one+"/take_ownership", nil), http.StatusForbidden)
	expectCode(t, "another developer reads a variable", as(dev2, "GET", one+"/variables/K", nil), http.StatusForbidden)
	expectCode(t, "a maintainer edits without owning", as(maint, "PUT", one, map[string]any{"description": "x"}), http.StatusForbidden)
	r = as(rep, "GET", one, nil)
	expectCode(t, "reporter reads", r, http.StatusOK)
	if got := scheduleOf(t, r); got.Variables != nil {
		t.Errorf("a reporter sees the variables: %+v", *got.Variables)
	}
	expectCode(t, "developer plays", as(dev2, "POST", one+"/play", nil), http.StatusCreated)

	r = as(maint, "POST", one+"/take_ownership", nil)
	expectCode(t, "maintainer takes it", r, http.StatusCreated)
	if got := scheduleOf(t, r); got.Owner.Username != "maint" {
		t.Errorf("owner after take_ownership: %+v", got.Owner)
	}
	expectCode(t, "taking it again", as(maint, "POST", one+"/take_ownership", nil), http.StatusOK)
	expectCode(t, "the old owner edits", as(dev, "PUT", one, map[string]any{"description": "x"}), http.StatusForbidden)
	expectCode(t, "the new owner edits", as(maint, "PUT", one, map[string]any{"ref": "main", "cron": "* * * * *"}), http.StatusOK)

	// The owner is no longer a member: the next run deactivates it.
	r = e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/members/%d", p.ID, e.userID("maint")), nil)
	expectCode(t, "remove maint", r, http.StatusNoContent)
	before := len(e.schedulePipelines(t, "p", ps.ID))
	e.clock.Advance(time.Minute)
	e.reap(t)
	if n := len(e.schedulePipelines(t, "p", ps.ID)); n != before {
		t.Errorf("a schedule whose owner left ran: %d pipelines, had %d", n, before)
	}
	if got := scheduleOf(t, e.adminDo("GET", one, nil)); got.Active {
		t.Error("a schedule whose owner left is still active")
	}
}

// FuzzScheduleBodies: any body to the schedule endpoints is answered
// with a client error or a success, never a server error, and whatever is
// stored has a valid cron expression and zone and is due no earlier than
// it was written.
func FuzzScheduleBodies(f *testing.F) {
	fe := newEnv(f, Config{})
	p := fe.project("acme/web")
	ps := &store.PipelineSchedule{ProjectID: p.ID, Description: "d", Ref: "main", Cron: "@daily", CronTimezone: "UTC", Active: true}
	if err := fe.srv.pipelines.CreateSchedule(f.Context(), ps); err != nil {
		f.Fatal(err)
	}
	h := fe.srv.Handler()
	f.Add(0, []byte(`{"description":"n","ref":"main","cron":"0 2 * * *","cron_timezone":"Europe/Berlin","active":"true"}`))
	f.Add(0, []byte(`{"inputs":[{"name":"a","value":[1,"x"]},{"name":"b","destroy":true}],"active":1}`))
	f.Add(1, []byte(`description=n&ref=main&cron=%400+2+*+*+*&cron_timezone=UTC&active=false`))
	f.Add(2, []byte("--b\r\nContent-Disposition: form-data; name=\"cron\"\r\n\r\n*/5 * * * *\r\n--b--\r\n"))
	f.Add(0, []byte(`{"key":"K","value":"v","variable_type":"file"}`))
	f.Fuzz(func(t *testing.T, kind int, body []byte) {
		ct := []string{"application/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"}[uint(kind)%3]
		base := fmt.Sprintf("/api/v4/projects/%d/pipeline_schedules", p.ID)
		for _, rt := range []struct{ method, path string }{
			{"POST", base}, {"PUT", fmt.Sprintf("%s/%d", base, ps.ID)},
			{"POST", fmt.Sprintf("%s/%d/variables", base, ps.ID)}, {"PUT", fmt.Sprintf("%s/%d/variables/K", base, ps.ID)},
		} {
			req, _ := http.NewRequest(rt.method, rt.path, bytes.NewReader(body))
			req.Header.Set("Content-Type", ct)
			req.Header.Set(runnerapi.HeaderPrivateToken, fe.admin)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s %q: %d %s", rt.method, rt.path, body, rec.Code, rec.Body.String())
			}
		}
		all, err := fe.st.ListPipelineSchedules(t.Context(), p.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			if _, err := pipelines.NextRun(s.Cron, s.CronTimezone, fe.clock.Now()); err != nil {
				t.Fatalf("%q stored schedule %+v: %v", body, s, err)
			}
			if s.Description == "" || s.Ref == "" {
				t.Fatalf("%q stored schedule %+v without description or ref", body, s)
			}
		}
	})
}

// TestCreatePipelineWithForm: POST /projects/:id/pipeline takes a form
// as GitLab does (curl --form ref=main --form "variables[][key]=A" …), not
// only JSON and the query.
func TestCreatePipelineWithForm(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"}, "-o", "ci.skip")
	for _, urlencoded := range []bool{false, true} {
		r := e.formDo("POST", "/api/v4/projects/p/pipeline", e.admin, urlencoded, "ref", "main",
			"variables[][key]", "A", "variables[][value]", "1", "variables[][key]", "B", "variables[][value]", "x=y", "variables[][variable_type]", "file")
		expectCode(t, "create with a form", r, http.StatusCreated)
		var pl restapi.PipelineJSON
		r.json(t, &pl)
		got, err := e.st.GetPipeline(t.Context(), pl.ID)
		if err != nil {
			t.Fatal(err)
		}
		// The type is the second variable's, whose fields it follows
		// (Rack's nesting, not the n-th key with the n-th type).
		if pl.Ref != "main" || len(got.Variables) != 2 || got.Variables[0] != (store.PipelineVariable{Key: "A", Value: "1"}) ||
			got.Variables[1] != (store.PipelineVariable{Key: "B", Value: "x=y", File: true}) {
			t.Errorf("urlencoded %v: pipeline %+v variables %+v", urlencoded, pl, got.Variables)
		}
	}
	// GitLab's value is optional: a key without one is an empty variable.
	r := e.formDo("POST", "/api/v4/projects/p/pipeline", e.admin, false, "ref", "main", "variables[][key]", "A")
	expectCode(t, "a key without a value", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	if got, err := e.st.GetPipeline(t.Context(), pl.ID); err != nil || len(got.Variables) != 1 || got.Variables[0] != (store.PipelineVariable{Key: "A"}) {
		t.Errorf("a key without a value: %+v %v", got, err)
	}
	r = e.formDo("POST", "/api/v4/projects/p/pipeline", e.admin, false, "ref", "main", "variables[][value]", "1")
	expectCode(t, "a value without a key", r, http.StatusBadRequest)
	r = e.formDo("POST", "/api/v4/projects/p/pipeline", e.admin, true, "variables[][key]", "A", "variables[][value]", "1")
	expectCode(t, "no ref", r, http.StatusBadRequest)
}

// TestScheduleRunsOnceUnderConcurrentRounds: rounds that see the same
// schedule due at once (replicas, a slow round overlapping the next) make
// one pipeline between them: each claims the run with a write
// conditional on the version it read.
func TestScheduleRunsOnceUnderConcurrentRounds(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"}, "-o", "ci.skip")
	ps := &store.PipelineSchedule{ProjectID: e.mustProject(t, "p").ID, Description: "d", Ref: "main", Cron: "* * * * *", CronTimezone: "UTC", Active: true}
	if err := e.srv.pipelines.CreateSchedule(t.Context(), ps); err != nil {
		t.Fatal(err)
	}
	for minute := 1; minute <= 3; minute++ {
		e.clock.Advance(time.Minute)
		now := e.clock.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.srv.pipelines.RunDueSchedules(t.Context(), now); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if n := len(e.schedulePipelines(t, "p", ps.ID)); n != minute {
			t.Fatalf("after %d minutes of 8 concurrent rounds each: %d pipelines, want %d", minute, n, minute)
		}
	}
}
