package webui_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/webui"
)

// Every page, fragment, stream and action of the UI needs a session.
func TestNothingWithoutASession(t *testing.T) {
	e := newEnv(t, webui.Config{})
	_, pl := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	tok := e.runner("r")
	job := e.take(tok, "s_1")
	e.appendLog(job, 0, "secret-ish log line\n")
	e.uploadArchive(job, map[string]string{"a.txt": "artifact-bytes-xyz"})
	pid, jid := itoa(pl.ID), itoa(job.ID)
	anon := e.browser()
	reads := []string{"/", "/g/p", "/g/p/-/pipelines", "/g/p/-/pipelines/" + pid, "/g/p/-/pipelines/" + pid + "/events",
		"/g/p/-/jobs/" + jid, "/g/p/-/jobs/" + jid + "/raw", "/g/p/-/jobs/" + jid + "/log?offset=0",
		"/g/p/-/jobs/" + jid + "/artifacts/download", "/g/p/-/jobs/" + jid + "/artifacts/browse",
		"/g/p/-/jobs/" + jid + "/artifacts/file/a.txt", "/-/runners", "/-/fleet", "/-/events", "/-/jobs/" + jid,
		"/-/pipelines/" + pid, "/nope/-/pipelines"}
	for _, path := range reads {
		pg := anon.get(path)
		if pg.code != http.StatusSeeOther || !strings.HasPrefix(pg.header.Get("Location"), "/-/sign_in?return_to=") {
			t.Errorf("GET %s without a session: %d %q, want 303 to the sign-in page", path, pg.code, pg.header.Get("Location"))
		}
		if strings.Contains(pg.body, "secret-ish") || strings.Contains(pg.body, "artifact-bytes-xyz") {
			t.Errorf("GET %s without a session shows data", path)
		}
		// htmx and event streams get 401.
		for _, h := range []map[string]string{{"HX-Request": "true"}, {"Accept": "text/event-stream"}} {
			if pg := anon.do("GET", path, nil, h); pg.code != http.StatusUnauthorized {
				t.Errorf("GET %s %v without a session: %d, want 401", path, h, pg.code)
			}
		}
	}
	for _, path := range []string{"/g/p/-/jobs/" + jid + "/cancel", "/g/p/-/jobs/" + jid + "/retry", "/g/p/-/jobs/" + jid + "/play",
		"/g/p/-/pipelines/" + pid + "/cancel", "/g/p/-/pipelines/" + pid + "/retry", "/-/sign_out"} {
		if pg := anon.do("POST", path, url.Values{"csrf_token": {"x"}}, nil); pg.code != http.StatusUnauthorized {
			t.Errorf("POST %s without a session: %d, want 401", path, pg.code)
		}
	}
	if j, _ := e.st.GetJob(context.Background(), job.ID); j.Status != store.StatusRunning {
		t.Errorf("job %s after anonymous actions, want running", j.Status)
	}
	// The sign-in page and the assets are all there is.
	if pg := anon.get("/-/sign_in"); pg.code != http.StatusOK || !strings.Contains(pg.body, `type="password"`) {
		t.Errorf("sign-in page: %d", pg.code)
	}
	if pg := anon.get("/-/assets/berth.css"); pg.code != http.StatusOK {
		t.Errorf("assets: %d", pg.code)
	}
	// A made-up cookie is no session.
	forged := e.browser()
	u, _ := url.Parse(e.http.URL)
	forged.c.Jar.SetCookies(u, []*http.Cookie{{Name: "berth_session", Value: strings.Repeat("A", 43)}})
	if pg := forged.get("/"); pg.code != http.StatusSeeOther {
		t.Errorf("forged session: %d", pg.code)
	}
}

func TestSignIn(t *testing.T) {
	e := newEnv(t, webui.Config{SessionTTL: time.Hour})
	b := e.browser()
	form := b.get("/-/sign_in?return_to=%2F-%2Frunners")
	// Wrong token, wrong form token, cross-site.
	if pg := b.do("POST", "/-/sign_in", url.Values{"token": {"glpat-nope"}, "csrf_token": {csrf(t, form)}}, nil); pg.code != http.StatusUnauthorized || !strings.Contains(pg.body, "not valid") {
		t.Errorf("wrong token: %d", pg.code)
	}
	form = b.get("/-/sign_in")
	if pg := b.do("POST", "/-/sign_in", url.Values{"token": {e.admin}, "csrf_token": {"nope"}}, nil); pg.code != http.StatusForbidden {
		t.Errorf("sign-in without its form token: %d, want 403", pg.code)
	}
	form = b.get("/-/sign_in")
	if pg := b.do("POST", "/-/sign_in", url.Values{"token": {e.admin}, "csrf_token": {csrf(t, form)}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); pg.code != http.StatusForbidden {
		t.Errorf("cross-site sign-in: %d, want 403", pg.code)
	}
	// Right: a session cookie, HttpOnly, SameSite, for an hour, back to
	// where the reader was going (this site only).
	form = b.get("/-/sign_in")
	pg := b.do("POST", "/-/sign_in", url.Values{"token": {e.admin}, "csrf_token": {csrf(t, form)}, "return_to": {"/-/runners"}}, nil)
	if pg.code != http.StatusSeeOther || pg.header.Get("Location") != "/-/runners" {
		t.Fatalf("sign in: %d %q", pg.code, pg.header.Get("Location"))
	}
	var session *http.Cookie
	for _, c := range (&http.Response{Header: pg.header}).Cookies() {
		if c.Name == "berth_session" {
			session = c
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode || session.MaxAge != 3600 || session.Secure {
		t.Fatalf("session cookie %+v", session)
	}
	if pg := b.get("/"); pg.code != http.StatusOK || !strings.Contains(pg.body, "Sign out") {
		t.Fatalf("signed in: %d", pg.code)
	}
	if strings.Contains(b.get("/-/runners").body, e.admin) {
		t.Error("a page shows the admin token")
	}
	// It expires.
	e.clock.Advance(time.Hour)
	if pg := b.get("/"); pg.code != http.StatusSeeOther {
		t.Errorf("expired session: %d, want 303 to sign in", pg.code)
	}
	// Sign-out ends a session, and needs its CSRF token.
	b.signIn(e.admin)
	home := b.get("/")
	if pg := b.do("POST", "/-/sign_out", url.Values{}, nil); pg.code != http.StatusForbidden {
		t.Errorf("sign-out without CSRF token: %d", pg.code)
	}
	if pg := b.do("POST", "/-/sign_out", url.Values{"csrf_token": {csrf(t, home)}}, nil); pg.code != http.StatusSeeOther {
		t.Errorf("sign-out: %d", pg.code)
	}
	if pg := b.get("/"); pg.code != http.StatusSeeOther {
		t.Errorf("after sign-out: %d", pg.code)
	}
}

func TestReturnToStaysOnSite(t *testing.T) {
	e := newEnv(t, webui.Config{})
	for _, evil := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", "/%2F/evil"} {
		b := e.browser()
		form := b.get("/-/sign_in")
		pg := b.do("POST", "/-/sign_in", url.Values{"token": {e.admin}, "csrf_token": {csrf(t, form)}, "return_to": {evil}}, nil)
		if loc := pg.header.Get("Location"); !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") || strings.Contains(loc, "evil.example") && !strings.HasPrefix(loc, "/%2F") {
			t.Errorf("return_to %q led to %q", evil, loc)
		}
	}
}

// Actions need the session's CSRF token; a read-only user may look but
// not act.
func TestActionsNeedCSRFAndARole(t *testing.T) {
	e := newEnv(t, webui.Config{})
	_, pl := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	job := e.take(e.runner("r"), "s_1")
	jobURL := "/g/p/-/jobs/" + itoa(job.ID)

	admin := e.browser()
	admin.signIn(e.admin)
	pg := admin.get(jobURL)
	token := csrf(t, pg)
	for _, form := range []url.Values{{}, {"csrf_token": {"wrong"}}} {
		if pg := admin.do("POST", jobURL+"/cancel", form, nil); pg.code != http.StatusForbidden {
			t.Errorf("cancel with %v: %d, want 403", form, pg.code)
		}
	}
	if pg := admin.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); pg.code != http.StatusForbidden {
		t.Errorf("cross-site cancel: %d, want 403", pg.code)
	}
	if pg := admin.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, map[string]string{"Origin": "http://evil.example"}); pg.code != http.StatusForbidden {
		t.Errorf("cancel from another origin: %d, want 403", pg.code)
	}
	// Another session's token does not do.
	other := e.browser()
	other.signIn(e.admin)
	if pg := other.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, nil); pg.code != http.StatusForbidden {
		t.Errorf("cancel with another session's token: %d, want 403", pg.code)
	}
	if j, _ := e.st.GetJob(t.Context(), job.ID); j.Status != store.StatusRunning {
		t.Fatalf("job %s, want running", j.Status)
	}

	viewer := e.browser()
	viewer.signIn(e.user("vera", "read-only"))
	vp := viewer.get(jobURL)
	if vp.code != http.StatusOK || strings.Contains(vp.body, "/cancel") || !strings.Contains(vp.body, "read-only") {
		t.Errorf("a read-only user's job page: %d, offers actions: %v", vp.code, strings.Contains(vp.body, "/cancel"))
	}
	vtoken := csrf(t, vp) // the sign-out form's
	for _, path := range []string{jobURL + "/cancel", jobURL + "/retry", "/g/p/-/pipelines/" + itoa(pl.ID) + "/cancel"} {
		if pg := viewer.do("POST", path, url.Values{"csrf_token": {vtoken}}, nil); pg.code != http.StatusForbidden {
			t.Errorf("read-only POST %s: %d, want 403", path, pg.code)
		}
	}
	if j, _ := e.st.GetJob(t.Context(), job.ID); j.Status != store.StatusRunning {
		t.Fatalf("job %s after a read-only user's cancel, want running", j.Status)
	}

	// The admin cancels with the token: the running job is canceling.
	if pg := admin.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, nil); pg.code != http.StatusSeeOther {
		t.Fatalf("cancel: %d %s", pg.code, pg.body)
	}
	if j, _ := e.st.GetJob(t.Context(), job.ID); j.Status != store.StatusCanceling {
		t.Fatalf("job %s after cancel, want canceling", j.Status)
	}
}

// Deleting a user or changing the admin token ends their sessions.
func TestSessionsEndWithTheirToken(t *testing.T) {
	e := newEnv(t, webui.Config{})
	b := e.browser()
	b.signIn(e.user("ann", "admin"))
	if pg := b.get("/"); pg.code != http.StatusOK {
		t.Fatal(pg.code)
	}
	users, _ := e.st.ListUsers(t.Context())
	if code, _ := e.admin_("DELETE", "/api/v4/berth/users/"+itoa(users[0].ID), nil); code != http.StatusNoContent {
		t.Fatalf("delete user: %d", code)
	}
	if pg := b.get("/"); pg.code != http.StatusSeeOther {
		t.Errorf("session of a deleted user: %d", pg.code)
	}
	a := e.browser()
	a.signIn(e.admin)
	if _, err := e.srv.EnsureAdminToken(t.Context(), "glpat-a-new-admin-token-for-the-test"); err != nil {
		t.Fatal(err)
	}
	if pg := a.get("/"); pg.code != http.StatusSeeOther {
		t.Errorf("session of a replaced admin token: %d", pg.code)
	}
}

// Masked variables' values and tokens never reach a page.
func TestNoSecretsInPages(t *testing.T) {
	e := newEnv(t, webui.Config{})
	p, _ := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	if code, b := e.admin_("POST", "/api/v4/projects/"+itoa(p.ID)+"/variables", map[string]any{"key": "SECRET", "value": "hunter2-masked-value", "masked": true}); code != http.StatusCreated {
		t.Fatalf("variable: %d %s", code, b)
	}
	pl, err := e.srv.Pipelines().CreatePipeline(t.Context(), pipelineRequest(p.ID))
	if err != nil {
		t.Fatal(err)
	}
	rtok := e.runner("r")
	job := e.take(rtok, "s_1")
	b := e.browser()
	b.signIn(e.admin)
	for _, path := range []string{"/", "/g/p/-/pipelines", "/g/p/-/pipelines/" + itoa(pl.ID), "/g/p/-/pipelines/" + itoa(pl.ID) + "?view=jobs",
		"/g/p/-/jobs/" + itoa(job.ID), "/-/runners", "/-/fleet"} {
		body := b.get(path).body
		for _, secret := range []string{"hunter2-masked-value", rtok, job.Token, e.admin} {
			if strings.Contains(body, secret) {
				t.Errorf("%s shows a secret (%.12s…)", path, secret)
			}
		}
	}
}

// Security headers on every answer of the UI.
func TestSecurityHeaders(t *testing.T) {
	e := newEnv(t, webui.Config{})
	pg := e.browser().get("/-/sign_in")
	for h, want := range map[string]string{"Content-Security-Policy": "script-src 'self'", "X-Frame-Options": "DENY",
		"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"} {
		if !strings.Contains(pg.header.Get(h), want) {
			t.Errorf("%s: %q, want %q", h, pg.header.Get(h), want)
		}
	}
}

// readEvents reads server-sent events from a stream until stop says so.
func readEvents(t *testing.T, b *webClient, path string, stop func(event, data string) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.e.http.URL+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	event, data := "", ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		case line == "":
			if event != "" && stop(event, data) {
				return
			}
			event, data = "", ""
		}
	}
	t.Fatalf("stream %s ended: %v", path, sc.Err())
}

// A one-time sign-in link (berth run --ui) works once, within its time.
func TestSignInLink(t *testing.T) {
	e := newEnv(t, webui.Config{})
	link, err := e.srv.UI().SignInURL(t.Context(), e.admin, "/-/runners", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	pg := b.get(link)
	if pg.code != http.StatusSeeOther || pg.header.Get("Location") != "/-/runners" {
		t.Fatalf("sign-in link: %d %q", pg.code, pg.header.Get("Location"))
	}
	if pg := b.get("/-/runners"); pg.code != http.StatusOK {
		t.Fatalf("after the link: %d", pg.code)
	}
	if pg := e.browser().get(link); pg.code != http.StatusUnauthorized {
		t.Errorf("the link a second time: %d, want 401", pg.code)
	}
	late, _ := e.srv.UI().SignInURL(t.Context(), e.admin, "/", time.Minute)
	e.clock.Advance(2 * time.Minute)
	if pg := e.browser().get(late); pg.code != http.StatusUnauthorized {
		t.Errorf("an expired link: %d, want 401", pg.code)
	}
}

// TestActionsBehindAProxy: behind a reverse proxy that gives the
// coordinator another Host, an action whose Origin is the host the proxy
// forwarded (X-Forwarded-Host) is this site's and goes through; one from
// another origin still does not.
func TestActionsBehindAProxy(t *testing.T) {
	e := newEnv(t, webui.Config{})
	_, _ = e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	job := e.take(e.runner("r"), "s_1")
	jobURL := "/g/p/-/jobs/" + itoa(job.ID)
	admin := e.browser()
	admin.signIn(e.admin)
	token := csrf(t, admin.get(jobURL))
	proxied := map[string]string{"Origin": "https://ci.example.com", "X-Forwarded-Host": "ci.example.com"}
	if pg := admin.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, map[string]string{"Origin": "https://evil.example",
		"X-Forwarded-Host": "ci.example.com"}); pg.code != http.StatusForbidden {
		t.Fatalf("another origin behind the proxy: %d, want 403", pg.code)
	}
	if pg := admin.do("POST", jobURL+"/cancel", url.Values{"csrf_token": {token}}, proxied); pg.code >= 400 {
		t.Fatalf("cancel through the proxy: %d", pg.code)
	}
	if j, _ := e.st.GetJob(t.Context(), job.ID); j.Status != store.StatusCanceling && j.Status != store.StatusCanceled {
		t.Fatalf("job %s after a cancel through the proxy", j.Status)
	}
}

// A project's members act on its pipelines and jobs from the UI: a
// developer on unprotected refs, a maintainer on protected ones too
// (GitLab's defaults); a member of another project, and a developer on a
// protected ref, may only look.
func TestMembersActInTheirProject(t *testing.T) {
	e := newEnv(t, webui.Config{})
	ctx := t.Context()
	p, main := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages}) // the default branch: protected
	other, _ := e.project("h/q", map[string]string{".gitlab-ci.yml": twoStages})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(twoStages), 0o644); err != nil {
		t.Fatal(err)
	}
	sha, err := e.srv.Pipelines().CommitDir(ctx, p.ID, "feature", dir, "feature")
	if err != nil {
		t.Fatal(err)
	}
	feature, err := e.srv.Pipelines().CreatePipeline(ctx, pipelines.PipelineRequest{ProjectID: p.ID, Ref: "feature", Sha: sha, Source: "push"})
	if err != nil {
		t.Fatal(err)
	}
	if !main.Protected || feature.Protected {
		t.Fatalf("protected: main %v, feature %v; want true, false", main.Protected, feature.Protected)
	}
	member := func(project *store.Project, name string, level store.MemberAccess) string {
		tok := e.user(name, "read-only")
		code, b := e.admin_("POST", "/api/v4/projects/"+itoa(project.ID)+"/members", restapi.MemberRequest{Username: name, AccessLevel: int(level)})
		if code != http.StatusCreated {
			t.Fatalf("adding %s: %d %s", name, code, b)
		}
		return tok
	}
	dev, maint, stranger := member(p, "dev", store.AccessDeveloper), member(p, "maint", store.AccessMaintainer), member(other, "stranger", store.AccessOwner)

	cancel := func(tok string, pl *store.Pipeline) (offered bool, code int) {
		t.Helper()
		b := e.browser()
		b.signIn(tok)
		u := "/g/p/-/pipelines/" + itoa(pl.ID)
		pg := b.get(u)
		if pg.code != http.StatusOK {
			t.Fatalf("%s: %d", u, pg.code)
		}
		return strings.Contains(pg.body, u+"/cancel"), b.do("POST", u+"/cancel", url.Values{"csrf_token": {csrf(t, pg)}}, nil).code
	}
	status := func(pl *store.Pipeline) store.Status {
		got, err := e.st.GetPipeline(ctx, pl.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	for _, tt := range []struct {
		who string
		tok string
		pl  *store.Pipeline
	}{{"another project's owner, feature", stranger, feature}, {"a developer, main (protected)", dev, main}} {
		if offered, code := cancel(tt.tok, tt.pl); offered || code != http.StatusForbidden {
			t.Errorf("%s: cancel offered %v, POST %d; want neither", tt.who, offered, code)
		}
	}
	if s := status(main); s.Finished() {
		t.Fatalf("main after refused cancels: %s", s)
	}
	if offered, code := cancel(dev, feature); !offered || code != http.StatusSeeOther || status(feature) != store.StatusCanceled {
		t.Errorf("a developer, feature: offered %v, POST %d, pipeline %s; want canceled", offered, code, status(feature))
	}
	if offered, code := cancel(maint, main); !offered || code != http.StatusSeeOther || status(main) != store.StatusCanceled {
		t.Errorf("a maintainer, main: offered %v, POST %d, pipeline %s; want canceled", offered, code, status(main))
	}
}
