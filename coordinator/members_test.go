package coordinator

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// userID finds a user's id by name through the admin API.
func (e *env) userID(name string) int64 {
	e.t.Helper()
	var us []restapi.UserJSON
	e.adminDo("GET", "/api/v4/berth/users", nil).json(e.t, &us)
	for _, u := range us {
		if u.Name == name {
			return u.ID
		}
	}
	e.t.Fatalf("no user %s", name)
	return 0
}

// addMember makes a user a member of a project at level.
func (e *env) addMember(p *store.Project, user string, level store.MemberAccess) {
	e.t.Helper()
	r := e.adminDo("POST", fmt.Sprintf("/api/v4/projects/%d/members", p.ID), restapi.MemberRequest{Username: user, AccessLevel: int(level)})
	expectCode(e.t, "add "+user+" to "+p.Path, r, http.StatusCreated)
}

// TestSnapshotsPerProject: a project's maintainers and owners list and
// fetch its snapshots, and nobody else's; developers and non-members get
// none; membership changes take effect at the next request; erasing a
// job's data follows the same rule.
func TestSnapshotsPerProject(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	ctx := t.Context()
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	web, api := e.project("acme/web"), e.project("acme/api")
	webJob := e.runningJob(tok, "web-test", web.ID)
	apiJob := e.runningJob(tok, "api-test", api.ID)
	webBundle, apiBundle := snapshotBundle(5000, "web-secret;"), snapshotBundle(6000, "api-secret;")
	expectCode(t, "upload web", e.uploadSnapshot(webJob, snapshotQuery, webBundle), http.StatusCreated)
	expectCode(t, "upload api", e.uploadSnapshot(apiJob, snapshotQuery, apiBundle), http.StatusCreated)
	for _, j := range []*runnerapi.JobResponse{webJob, apiJob} {
		expectCode(t, "fail", e.update(j, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1}), http.StatusOK)
	}

	webMaint, webDev, apiOwner := e.newUser("wm", "read-only"), e.newUser("wd", "read-only"), e.newUser("ao", "read-only")
	e.addMember(web, "wm", store.AccessMaintainer)
	e.addMember(web, "wd", store.AccessDeveloper)
	e.addMember(api, "ao", store.AccessOwner)
	e.addMember(web, "ao", store.AccessReporter)

	fetch := func(tok string, job *runnerapi.JobResponse) ([]byte, error) {
		var b bytes.Buffer
		_, err := client.New(e.http.URL, tok).Snapshot(ctx, job.ID, &b)
		return b.Bytes(), err
	}
	status := func(err error) int {
		var ae *client.APIError
		if err == nil {
			return http.StatusOK
		}
		if !errors.As(err, &ae) {
			t.Fatalf("not an API error: %v", err)
		}
		return ae.Status
	}
	for _, tt := range []struct {
		who  string
		tok  string
		job  *runnerapi.JobResponse
		want []byte // nil: refused with 403
	}{
		{"web's maintainer, web's job", webMaint, webJob, webBundle},
		{"web's maintainer, api's job", webMaint, apiJob, nil},
		{"web's developer, web's job", webDev, webJob, nil},
		{"api's owner, api's job", apiOwner, apiJob, apiBundle},
		{"api's owner (web's reporter), web's job", apiOwner, webJob, nil},
	} {
		got, err := fetch(tt.tok, tt.job)
		switch {
		case tt.want == nil && status(err) != http.StatusForbidden:
			t.Errorf("%s: %v, want 403", tt.who, err)
		case tt.want == nil && (bytes.Contains(got, []byte("secret")) || !strings.Contains(err.Error(), "neither an admin nor a maintainer")):
			t.Errorf("%s: refused with %v, %d bytes", tt.who, err, len(got))
		case tt.want != nil && (err != nil || !bytes.Equal(got, tt.want)):
			t.Errorf("%s: %v, the bundle %v", tt.who, err, bytes.Equal(got, tt.want))
		}
	}

	// Lists: each sees the projects they maintain; one who maintains
	// none is refused, as is one naming a project not theirs.
	list := func(tok string, project int64) ([]int64, int) {
		l, err := client.New(e.http.URL, tok).Snapshots(ctx, project)
		return snapshotJobs(l), status(err)
	}
	if got, code := list(webMaint, 0); code != http.StatusOK || !equalIDs(got, webJob.ID) {
		t.Errorf("web's maintainer lists %v (%d), want job %d", got, code, webJob.ID)
	}
	if got, code := list(apiOwner, 0); code != http.StatusOK || !equalIDs(got, apiJob.ID) {
		t.Errorf("api's owner lists %v (%d), want job %d", got, code, apiJob.ID)
	}
	if got, code := list(e.admin, 0); code != http.StatusOK || !equalIDs(got, apiJob.ID, webJob.ID) {
		t.Errorf("the admin lists %v (%d), want both", got, code)
	}
	if _, code := list(webMaint, api.ID); code != http.StatusForbidden {
		t.Errorf("web's maintainer listing api's: %d, want 403", code)
	}
	if _, code := list(webDev, 0); code != http.StatusForbidden {
		t.Errorf("web's developer listing: %d, want 403", code)
	}

	// Changes take effect at once: the developer becomes a maintainer,
	// the maintainer leaves.
	expectCode(t, "promote", e.adminDo("PUT", fmt.Sprintf("/api/v4/projects/%d/members/%d", web.ID, e.userID("wd")), restapi.MemberRequest{AccessLevel: 40}), http.StatusOK)
	if got, err := fetch(webDev, webJob); err != nil || !bytes.Equal(got, webBundle) {
		t.Errorf("a developer made maintainer: %v", err)
	}
	expectCode(t, "remove", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/members/%d", web.ID, e.userID("wm")), nil), http.StatusNoContent)
	if _, err := fetch(webMaint, webJob); status(err) != http.StatusForbidden {
		t.Errorf("a maintainer who left: %v, want 403", err)
	}
	// A deleted user's token is nobody's.
	expectCode(t, "delete ao", e.adminDo("DELETE", fmt.Sprintf("/api/v4/berth/users/%d", e.userID("ao")), nil), http.StatusNoContent)
	if _, err := fetch(apiOwner, apiJob); status(err) != http.StatusForbidden {
		t.Errorf("a deleted owner: %v, want 403", err)
	}

	// Erasing and deleting artifacts: the project's admins only.
	asUser := func(tok string) map[string]string { return map[string]string{runnerapi.HeaderPrivateToken: tok} }
	apiErase := fmt.Sprintf("/api/v4/projects/%d/jobs/%d/erase", api.ID, apiJob.ID)
	expectCode(t, "web's new maintainer erases api's job", e.do("POST", apiErase, nil, asUser(webDev)), http.StatusForbidden)
	expectCode(t, "... or deletes its artifacts", e.do("DELETE", fmt.Sprintf("/api/v4/projects/%d/jobs/%d/artifacts", api.ID, apiJob.ID), nil, asUser(webDev)), http.StatusForbidden)
	if n := len(e.storedObjects(apiJob.ID)); n != 1 {
		t.Fatalf("api's snapshot after refused erases: %d objects", n)
	}
	expectCode(t, "web's maintainer erases web's job", e.do("POST", fmt.Sprintf("/api/v4/projects/%s/jobs/%d/erase", url.PathEscape(web.Path), webJob.ID), nil, asUser(webDev)), http.StatusCreated)
	if n := len(e.storedObjects(webJob.ID)); n != 0 {
		t.Errorf("web's snapshot after its erase: %d objects", n)
	}
	expectCode(t, "the admin erases api's job", e.adminDo("POST", apiErase, nil), http.StatusCreated)
}

// TestProjectMembersAPI: GitLab's members API — JSON and form bodies,
// user_id as number or string, username, its refusals; instance admins
// manage, a project's maintainers read its list, nobody else.
func TestProjectMembersAPI(t *testing.T) {
	e := newEnv(t, Config{})
	web := e.project("acme/web")
	maint, dev := e.newUser("maint", "read-only"), e.newUser("dev", "read-only")
	maintID, devID := e.userID("maint"), e.userID("dev")
	base := fmt.Sprintf("/api/v4/projects/%d/members", web.ID)

	expectCode(t, "add by id (JSON number)", e.do("POST", base, []byte(fmt.Sprintf(`{"user_id":%d,"access_level":40}`, maintID)),
		map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Content-Type": "application/json"}), http.StatusCreated)
	r := e.do("POST", "/api/v4/projects/"+url.PathEscape(web.Path)+"/members", []byte(fmt.Sprintf("user_id=%d&access_level=30", devID)),
		map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Content-Type": "application/x-www-form-urlencoded"})
	expectCode(t, "add by form, the project by path", r, http.StatusCreated)
	var m restapi.MemberJSON
	r.json(t, &m)
	if m.ID != devID || m.Username != "dev" || m.AccessLevel != 30 || m.State != "active" || m.CreatedAt == nil {
		t.Errorf("member %+v", m)
	}
	for _, tt := range []struct {
		name string
		body string
		code int
	}{
		{"again", fmt.Sprintf(`{"user_id":"%d","access_level":40}`, devID), http.StatusConflict},
		{"an unknown user", `{"user_id":99999,"access_level":40}`, http.StatusNotFound},
		{"an unknown name", `{"username":"nobody","access_level":40}`, http.StatusNotFound},
		{"no user", `{"access_level":40}`, http.StatusBadRequest},
		{"a bad user_id", `{"user_id":"x1","access_level":40}`, http.StatusBadRequest},
		{"a bad level", fmt.Sprintf(`{"user_id":%d,"access_level":45}`, devID), http.StatusBadRequest},
		{"not JSON", `{"user_id":`, http.StatusBadRequest},
	} {
		r := e.do("POST", base, []byte(tt.body), map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Content-Type": "application/json"})
		if r.code != tt.code {
			t.Errorf("POST %s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
		}
	}
	expectCode(t, "a project that does not exist", e.adminDo("POST", "/api/v4/projects/9999/members", restapi.MemberRequest{Username: "dev", AccessLevel: 30}), http.StatusNotFound)

	// Reading: the admin and the project's maintainer; not a developer.
	var list []restapi.MemberJSON
	r = e.do("GET", base, nil, map[string]string{runnerapi.HeaderPrivateToken: maint})
	expectCode(t, "list as maintainer", r, http.StatusOK)
	r.json(t, &list)
	if len(list) != 2 || list[0].Username != "maint" || list[0].AccessLevel != 40 || list[1].Username != "dev" {
		t.Errorf("members %+v", list)
	}
	expectCode(t, "list as developer", e.do("GET", base, nil, map[string]string{runnerapi.HeaderPrivateToken: dev}), http.StatusForbidden)
	expectCode(t, "one as admin", e.adminDo("GET", fmt.Sprintf("%s/%d", base, devID), nil), http.StatusOK)
	expectCode(t, "a non-member", e.adminDo("GET", fmt.Sprintf("%s/%d", base, 99999), nil), http.StatusNotFound)

	// Managing, as GitLab: a maintainer up to the maintainer level and
	// not an owner; an owner everything but leaving the project without an
	// owner; any member may leave; instance admins anything.
	as := func(tok string) map[string]string { return map[string]string{runnerapi.HeaderPrivateToken: tok} }
	one := func(id int64) string { return fmt.Sprintf("%s/%d", base, id) }
	own, newbie := e.newUser("own", "read-only"), e.newUser("newbie", "read-only")
	ownID, newbieID := e.userID("own"), e.userID("newbie")
	for _, st := range []struct {
		name, method, path string
		tok                string
		body               any
		code               int
	}{
		{"maintainer promotes to owner", "PUT", one(devID), maint, restapi.MemberRequest{AccessLevel: 50}, http.StatusForbidden},
		{"maintainer promotes to maintainer", "PUT", one(devID), maint, restapi.MemberRequest{AccessLevel: 40}, http.StatusOK},
		{"maintainer demotes back", "PUT", one(devID), maint, restapi.MemberRequest{AccessLevel: 30}, http.StatusOK},
		{"maintainer adds an owner", "POST", base, maint, restapi.MemberRequest{Username: "newbie", AccessLevel: 50}, http.StatusForbidden},
		{"maintainer adds a reporter", "POST", base, maint, restapi.MemberRequest{Username: "newbie", AccessLevel: 20}, http.StatusCreated},
		{"developer adds", "POST", base, dev, restapi.MemberRequest{Username: "own", AccessLevel: 20}, http.StatusForbidden},
		{"developer changes another", "PUT", one(newbieID), dev, restapi.MemberRequest{AccessLevel: 30}, http.StatusForbidden},
		{"developer removes another", "DELETE", one(newbieID), dev, nil, http.StatusForbidden},
		{"reporter leaves", "DELETE", one(newbieID), newbie, nil, http.StatusNoContent},
		{"a non-member leaves", "DELETE", one(newbieID), newbie, nil, http.StatusForbidden},
		{"admin makes an owner", "POST", base, e.admin, restapi.MemberRequest{Username: "own", AccessLevel: 50}, http.StatusCreated},
		{"maintainer demotes the owner", "PUT", one(ownID), maint, restapi.MemberRequest{AccessLevel: 40}, http.StatusForbidden},
		{"maintainer removes the owner", "DELETE", one(ownID), maint, nil, http.StatusForbidden},
		{"the last owner leaves", "DELETE", one(ownID), own, nil, http.StatusForbidden},
		{"the last owner demotes themself", "PUT", one(ownID), own, restapi.MemberRequest{AccessLevel: 40}, http.StatusForbidden},
		{"owner makes the maintainer owner", "PUT", one(maintID), own, restapi.MemberRequest{AccessLevel: 50}, http.StatusOK},
		{"an owner of two leaves", "DELETE", one(ownID), own, nil, http.StatusNoContent},
		{"admin removes the last owner", "DELETE", one(maintID), e.admin, nil, http.StatusNoContent},
		{"update to a bad level", "PUT", one(devID), e.admin, restapi.MemberRequest{AccessLevel: 0}, http.StatusBadRequest},
		{"remove", "DELETE", one(devID), e.admin, nil, http.StatusNoContent},
		{"remove again", "DELETE", one(devID), e.admin, nil, http.StatusNotFound},
	} {
		expectCode(t, st.name, e.do(st.method, st.path, st.body, as(st.tok)), st.code)
	}
	if ms, _ := e.srv.store.ListProjectMembers(t.Context(), web.ID); len(ms) != 0 {
		t.Errorf("members left: %+v", ms)
	}
	expectCode(t, "no token", e.do("GET", base, nil, nil), http.StatusUnauthorized)
	expectCode(t, "a made-up token", e.do("GET", base, nil, map[string]string{runnerapi.HeaderPrivateToken: "glpat-nope"}), http.StatusForbidden)
}

// FuzzMemberBodies: a members request body, JSON or form, is answered
// with 201, 400, 404 or 409 — never a server error — and a member is
// only ever stored with one of GitLab's access levels.
func FuzzMemberBodies(f *testing.F) {
	fe := newEnv(f, Config{})
	web := fe.project("acme/web")
	fe.newUser("ann", "read-only")
	h := fe.srv.Handler()
	f.Add(true, []byte(`{"user_id":1,"access_level":40}`))
	f.Add(true, []byte(`{"user_id":"1","access_level":30}`))
	f.Add(true, []byte(`{"username":"ann","access_level":50}`))
	f.Add(false, []byte(`user_id=1&access_level=20`))
	f.Add(false, []byte(`username=ann&access_level=x`))
	f.Fuzz(func(t *testing.T, asJSON bool, body []byte) {
		ct := "application/x-www-form-urlencoded"
		if asJSON {
			ct = "application/json"
		}
		for _, method := range []string{"POST", "PUT"} {
			path := fmt.Sprintf("/api/v4/projects/%d/members", web.ID)
			if method == "PUT" {
				path += "/1"
			}
			req, _ := http.NewRequest(method, path, bytes.NewReader(body))
			req.Header.Set("Content-Type", ct)
			req.Header.Set(runnerapi.HeaderPrivateToken, fe.admin)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			switch rec.Code {
			case http.StatusOK, http.StatusCreated, http.StatusBadRequest, http.StatusNotFound, http.StatusConflict:
			default:
				t.Fatalf("%s %q: %d %s", method, body, rec.Code, rec.Body.String())
			}
		}
		ms, err := fe.st.ListProjectMembers(t.Context(), web.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if !m.AccessLevel.Valid() {
				t.Fatalf("%q stored access level %d", body, m.AccessLevel)
			}
		}
	})
}

// TestUserTokensRoutable: in a cell, a user's token carries the cell, so
// that a router takes the user's requests (berth debug, the API) to it;
// outside cells it is a plain personal token.
func TestUserTokensRoutable(t *testing.T) {
	for _, cell := range []int64{0, 3} {
		e := newEnv(t, Config{CellID: cell})
		tok := e.newUser("ann", "read-only")
		r, err := token.ParseRoutable(tok)
		switch {
		case cell == 0 && (err == nil || !strings.HasPrefix(tok, token.PrefixPersonal)):
			t.Errorf("outside cells: %q parsed as routable (%+v, %v)", tok, r, err)
		case cell != 0 && (err != nil || r.Cell != cell || !strings.HasPrefix(tok, token.PrefixPersonal)):
			t.Errorf("cell %d: %q routes to %+v (%v)", cell, tok, r, err)
		}
		// The token signs in either way.
		web := e.project("acme/web")
		e.addMember(web, "ann", store.AccessMaintainer)
		expectCode(t, "members as ann", e.do("GET", fmt.Sprintf("/api/v4/projects/%d/members", web.ID), nil, map[string]string{runnerapi.HeaderPrivateToken: tok}), http.StatusOK)
	}
}

// TestMembersUseTheAPI: a project's members use GitLab's project API with
// their own token at GitLab's levels — guests see the project, reporters
// its pipelines, jobs, logs and deployments, developers run, cancel and
// retry on unprotected refs, maintainers on the default branch too and
// manage variables, owners delete pipelines — and a member of another
// project, or a user of none, is refused everything; GET /projects lists
// a user's own projects.
func TestMembersUseTheAPI(t *testing.T) {
	e := newGitEnv(t, Config{})
	ctx := t.Context()
	proj := e.createProject(t, "acme/app")
	other := e.createProject(t, "acme/other")
	const ci = "a:\n  script: [x]\nb:\n  script: [y]\n"
	e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": ci})
	e.pushFiles(t, "acme/app", "feature", map[string]string{".gitlab-ci.yml": ci})
	pls, err := e.st.ListPipelines(ctx, store.PipelineFilter{ProjectID: proj.ID})
	if err != nil || len(pls) != 2 {
		t.Fatalf("pipelines %v %v", pls, err)
	}
	var mainPl, featPl *store.Pipeline
	for _, pl := range pls {
		if pl.Ref == "main" {
			mainPl = pl
		} else {
			featPl = pl
		}
	}
	if !mainPl.Protected || featPl.Protected {
		t.Fatalf("protected: main %v, feature %v", mainPl.Protected, featPl.Protected)
	}
	jobOf := func(pl *store.Pipeline) int64 {
		js, err := e.st.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
		if err != nil || len(js) == 0 {
			t.Fatalf("jobs of %d: %v %v", pl.ID, js, err)
		}
		return js[0].ID
	}
	mainJob, featJob := jobOf(mainPl), jobOf(featPl)

	p := &store.Project{ID: proj.ID, Path: "acme/app"}
	levels := []store.MemberAccess{store.AccessGuest, store.AccessReporter, store.AccessDeveloper, store.AccessMaintainer, store.AccessOwner}
	tokens := map[store.MemberAccess]string{}
	for _, l := range levels {
		name := fmt.Sprintf("level%d", l)
		tokens[l] = e.newUser(name, "read-only")
		e.addMember(p, name, l)
	}
	stranger := e.newUser("stranger", "read-only")
	e.addMember(&store.Project{ID: other.ID, Path: "acme/other"}, "stranger", store.AccessOwner)

	pp := fmt.Sprintf("/api/v4/projects/%d", proj.ID)
	for _, tt := range []struct {
		method, path string
		body         any
		need         store.MemberAccess
	}{
		{"GET", pp, nil, store.AccessGuest},
		{"GET", pp + "/pipelines", nil, store.AccessReporter},
		{"GET", fmt.Sprintf("%s/pipelines/%d", pp, featPl.ID), nil, store.AccessReporter},
		{"GET", fmt.Sprintf("%s/pipelines/%d/jobs", pp, featPl.ID), nil, store.AccessReporter},
		{"GET", fmt.Sprintf("%s/pipelines/%d/bridges", pp, featPl.ID), nil, store.AccessReporter},
		{"GET", pp + "/jobs", nil, store.AccessReporter},
		{"GET", fmt.Sprintf("%s/jobs/%d", pp, featJob), nil, store.AccessReporter},
		{"GET", fmt.Sprintf("%s/jobs/%d/trace", pp, featJob), nil, store.AccessReporter},
		{"GET", fmt.Sprintf("/api/v4/berth/pipelines/%d", featPl.ID), nil, store.AccessReporter},
		{"GET", fmt.Sprintf("/api/v4/berth/jobs/%d", featJob), nil, store.AccessReporter},
		{"GET", pp + "/releases", nil, store.AccessReporter},
		{"GET", pp + "/environments", nil, store.AccessReporter},
		{"GET", pp + "/deployments", nil, store.AccessReporter},
		{"POST", pp + "/pipeline?ref=feature", nil, store.AccessDeveloper},
		{"POST", fmt.Sprintf("%s/jobs/%d/cancel", pp, featJob), nil, store.AccessDeveloper},
		{"POST", fmt.Sprintf("%s/jobs/%d/retry", pp, featJob), nil, store.AccessDeveloper},
		{"POST", fmt.Sprintf("%s/pipelines/%d/cancel", pp, featPl.ID), nil, store.AccessDeveloper},
		{"POST", fmt.Sprintf("%s/pipelines/%d/retry", pp, featPl.ID), nil, store.AccessDeveloper},
		{"POST", pp + "/pipeline?ref=main", nil, store.AccessMaintainer},
		{"POST", fmt.Sprintf("%s/jobs/%d/cancel", pp, mainJob), nil, store.AccessMaintainer},
		{"POST", fmt.Sprintf("%s/pipelines/%d/cancel", pp, mainPl.ID), nil, store.AccessMaintainer},
		{"GET", pp + "/variables", nil, store.AccessMaintainer},
		{"POST", pp + "/variables", map[string]string{"key": "K", "value": "v"}, store.AccessMaintainer},
		{"PUT", pp, map[string]string{"description": "d"}, store.AccessMaintainer},
		{"GET", pp + "/members", nil, store.AccessMaintainer},
		{"DELETE", fmt.Sprintf("%s/pipelines/%d", pp, featPl.ID), nil, store.AccessOwner},
	} {
		try := func(who, tok string, allowed bool) {
			t.Helper()
			r := e.do(tt.method, tt.path, tt.body, map[string]string{runnerapi.HeaderPrivateToken: tok})
			refused := r.code == http.StatusForbidden && bytes.Contains(r.body, []byte("neither an admin nor"))
			if refused == allowed || r.code == http.StatusUnauthorized {
				t.Errorf("%s %s as %s: %d %s; allowed: %v", tt.method, tt.path, who, r.code, r.body, allowed)
			}
		}
		try("another project's owner", stranger, false)
		for _, l := range levels {
			try(fmt.Sprintf("level %d", l), tokens[l], l >= tt.need)
		}
	}

	// GET /projects: a user's own projects; the admin's: all.
	var list []restapi.ProjectJSON
	r := e.do("GET", "/api/v4/projects", nil, map[string]string{runnerapi.HeaderPrivateToken: stranger})
	expectCode(t, "projects as stranger", r, http.StatusOK)
	r.json(t, &list)
	if len(list) != 1 || list[0].ID != other.ID {
		t.Errorf("a user's projects: %+v, want acme/other alone", list)
	}
	e.adminDo("GET", "/api/v4/projects", nil).json(t, &list)
	if len(list) != 2 {
		t.Errorf("the admin's projects: %d, want 2", len(list))
	}
}

// TestCurrentUser: GET /user says whom a token belongs to, as GitLab's
// does for API clients checking a token.
func TestCurrentUser(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.newUser("ann", "read-only")
	var u restapi.CurrentUserJSON
	r := e.do("GET", "/api/v4/user", nil, map[string]string{"Authorization": "Bearer " + tok})
	expectCode(t, "as ann", r, http.StatusOK)
	r.json(t, &u)
	if u.Username != "ann" || u.ID != e.userID("ann") || u.IsAdmin || u.State != "active" {
		t.Errorf("ann's /user: %+v", u)
	}
	e.adminDo("GET", "/api/v4/user", nil).json(t, &u)
	if u.Username != "admin" || !u.IsAdmin {
		t.Errorf("the admin token's /user: %+v", u)
	}
	expectCode(t, "no token", e.do("GET", "/api/v4/user", nil, nil), http.StatusUnauthorized)
	expectCode(t, "a made-up token", e.do("GET", "/api/v4/user", nil, map[string]string{runnerapi.HeaderPrivateToken: "glpat-x"}), http.StatusForbidden)
}

// TestMembersOverGit: a user's token works over git's smart HTTP at the
// user's level in the project: reporters fetch but do not push,
// developers push to branches but not to the default one (protected),
// maintainers push to it too; a user of another project, a token of
// nobody, are told the private project does not exist.
func TestMembersOverGit(t *testing.T) {
	e := newGitEnv(t, Config{})
	proj := e.createProject(t, "acme/app")
	e.createProject(t, "acme/other")
	e.pushFiles(t, "acme/app", "main", map[string]string{"README": "v1\n"})
	p := &store.Project{ID: proj.ID, Path: "acme/app"}
	rep, dev, maint := e.newUser("rep", "read-only"), e.newUser("dev", "read-only"), e.newUser("maint", "read-only")
	e.addMember(p, "rep", store.AccessReporter)
	e.addMember(p, "dev", store.AccessDeveloper)
	e.addMember(p, "maint", store.AccessMaintainer)
	stranger := e.newUser("stranger", "read-only")
	admin := e.newUser("boss", "admin")
	remote := e.http.URL + "/acme/app.git"

	// push commits a change on top of main and pushes it to branch as
	// the holder of tok.
	push := func(tok, branch string) error {
		dir := t.TempDir()
		testenv.Git(t, dir, nil, "init", "-q", "-b", "main")
		testenv.Git(t, dir, testenv.GitBasicAuth("root", e.admin), "fetch", "-q", remote, "main")
		testenv.Git(t, dir, nil, "reset", "-q", "--hard", "FETCH_HEAD")
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte(branch+tok[len(tok)-6:]), 0o644); err != nil {
			t.Fatal(err)
		}
		testenv.Git(t, dir, nil, "add", "-A")
		testenv.Git(t, dir, nil, "commit", "-q", "-m", "change")
		_, err := testenv.GitOutput(dir, testenv.GitBasicAuth("someone", tok), "push", "-q", remote, "HEAD:refs/heads/"+branch)
		return err
	}
	fetch := func(tok string) error {
		dir := t.TempDir()
		testenv.Git(t, dir, nil, "init", "-q")
		_, err := testenv.GitOutput(dir, testenv.GitBasicAuth("someone", tok), "fetch", "-q", remote, "main")
		return err
	}
	for _, tt := range []struct {
		who          string
		tok          string
		fetch        bool
		feature, def bool
	}{
		{"a stranger", stranger, false, false, false},
		{"a made-up token", "glpat-nothing-at-all", false, false, false},
		{"a reporter", rep, true, false, false},
		{"a developer", dev, true, true, false},
		{"a maintainer", maint, true, true, true},
		{"an admin user", admin, true, true, true},
	} {
		if err := fetch(tt.tok); (err == nil) != tt.fetch {
			t.Errorf("%s fetches: %v, want allowed %v", tt.who, err, tt.fetch)
		}
		if err := push(tt.tok, "feature-"+tt.tok[len(tt.tok)-4:]); (err == nil) != tt.feature {
			t.Errorf("%s pushes a branch: %v, want allowed %v", tt.who, err, tt.feature)
		}
		if err := push(tt.tok, "main"); (err == nil) != tt.def {
			t.Errorf("%s pushes the default branch: %v, want allowed %v", tt.who, err, tt.def)
		}
	}
	// A refused push moved nothing: main is the maintainers' and the
	// admin's last push.
	refs := e.do("GET", "/acme/app.git/info/refs?service=git-upload-pack", nil, map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+e.admin))})
	expectCode(t, "refs", refs, http.StatusOK)
	if n := strings.Count(string(refs.body), "refs/heads/feature-"); n != 3 {
		t.Errorf("%d feature branches pushed, want 3 (developer, maintainer, admin user)", n)
	}
}
