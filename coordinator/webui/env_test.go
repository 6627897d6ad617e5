package webui_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/internal/fakeclock"
	"github.com/berthci/berth/runnerapi"
)

// env is a coordinator with its web UI, served on loopback, its store
// SQLite in a temporary directory and its clock a fake one.
type env struct {
	t     testing.TB
	srv   *coordinator.Server
	st    store.Store
	http  *httptest.Server
	clock *fakeclock.Clock
	admin string
}

func newEnv(t testing.TB, ui webui.Config) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	arts, err := artifacts.NewDir(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(nil)
	clock := fakeclock.New(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	if ui.RefreshInterval == 0 {
		ui.RefreshInterval = 200 * time.Millisecond
	}
	cfg := coordinator.Config{ExternalURL: "http://" + hs.Listener.Addr().String(), LongPollTimeout: time.Second,
		ReapInterval: time.Hour, RepoDir: filepath.Join(dir, "repos"), UI: ui, TraceArchiveAfter: -1}
	// A secrets key, as embedded coordinators have: failed jobs' VM
	// snapshots are taken.
	key, err := sealed.LoadOrCreateKey(filepath.Join(dir, "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := coordinator.New(cfg, coordinator.Options{Store: st, Artifacts: arts, Clock: clock, SecretsKey: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hs.Config.Handler = srv.Handler()
	hs.Start()
	admin, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
		st.Close()
	})
	return &env{t: t, srv: srv, st: st, http: hs, clock: clock, admin: admin}
}

// project creates a project whose main branch holds files, and returns it
// with the pipeline of its commit.
func (e *env) project(path string, files map[string]string) (*store.Project, *store.Pipeline) {
	e.t.Helper()
	ctx := context.Background()
	p, err := e.srv.Pipelines().CreateProject(ctx, pipelines.ProjectSpec{Path: path})
	if err != nil {
		e.t.Fatal(err)
	}
	dir := e.t.TempDir()
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	sha, err := e.srv.Pipelines().CommitDir(ctx, p.ID, "main", dir, "test")
	if err != nil {
		e.t.Fatal(err)
	}
	pl, err := e.srv.Pipelines().CreatePipeline(ctx, pipelines.PipelineRequest{ProjectID: p.ID, Ref: "main", Sha: sha, Source: "push"})
	if err != nil {
		e.t.Fatal(err)
	}
	if pl.YAMLErrors != "" {
		e.t.Fatalf("pipeline errors: %s", pl.YAMLErrors)
	}
	return p, pl
}

// api calls the coordinator's APIs with a header set.
func (e *env) api(method, path string, body any, header map[string]string) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, e.http.URL+path, rd)
	if _, ok := body.([]byte); !ok && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *env) admin_(method, path string, body any) (int, []byte) {
	return e.api(method, path, body, map[string]string{"PRIVATE-TOKEN": e.admin})
}

// runner creates an instance runner and returns its token.
func (e *env) runner(desc string, tags ...string) string {
	e.t.Helper()
	untagged := true
	code, b := e.admin_("POST", "/api/v4/user/runners", restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: desc, TagList: tags, RunUntagged: &untagged})
	if code != http.StatusCreated {
		e.t.Fatalf("creating runner: %d %s", code, b)
	}
	var out runnerapi.RunnerTokenResponse
	_ = json.Unmarshal(b, &out)
	return out.Token
}

// take asks for a job as a runner manager offering levels, waiting up to a
// few seconds for one; it acknowledges it (running).
func (e *env) take(tok, systemID string, levels ...string) *runnerapi.JobResponse {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		code, b := e.api("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: tok, SystemID: systemID,
			Info: &runnerapi.Info{Name: "berth", Version: "test", Executor: "shell", IsolationLevels: levels}}, nil)
		if code == http.StatusCreated {
			var job runnerapi.JobResponse
			_ = json.Unmarshal(b, &job)
			e.update(&job, "running")
			return &job
		}
	}
	e.t.Fatal("no job handed out")
	return nil
}

func (e *env) update(job *runnerapi.JobResponse, state string) int {
	e.t.Helper()
	code, _ := e.api("PUT", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10), runnerapi.UpdateJobRequest{Token: job.Token, State: state},
		map[string]string{runnerapi.HeaderJobToken: job.Token})
	return code
}

// appendLog sends the next piece of a job's log; offset is the log's size.
func (e *env) appendLog(job *runnerapi.JobResponse, offset int, data string) int {
	e.t.Helper()
	code, b := e.api("PATCH", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10)+"/trace", []byte(data), map[string]string{
		runnerapi.HeaderJobToken: job.Token, "Content-Type": "text/plain",
		runnerapi.HeaderContentRange: fmt.Sprintf("%d-%d", offset, offset+len(data)-1)})
	if code != http.StatusAccepted {
		e.t.Fatalf("trace patch: %d %s", code, b)
	}
	return offset + len(data)
}

// uploadArchive uploads a zip of files as a running job's artifacts.
func (e *env) uploadArchive(job *runnerapi.JobResponse, files map[string]string) {
	e.t.Helper()
	var zbuf bytes.Buffer
	zw := zip.NewWriter(&zbuf)
	for name, content := range files {
		w, _ := zw.Create(name)
		_, _ = w.Write([]byte(content))
	}
	_ = zw.Close()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "artifacts.zip")
	_, _ = fw.Write(zbuf.Bytes())
	_ = mw.Close()
	code, b := e.api("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_type=archive&artifact_format=zip", job.ID), body.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
	if code != http.StatusCreated {
		e.t.Fatalf("uploading artifacts: %d %s", code, b)
	}
}

// user creates a web UI user with a role and returns its token.
func (e *env) user(name, role string) string {
	e.t.Helper()
	code, b := e.admin_("POST", "/api/v4/berth/users", restapi.CreateUserRequest{Name: name, Role: role})
	if code != http.StatusCreated {
		e.t.Fatalf("creating user: %d %s", code, b)
	}
	var u restapi.UserJSON
	_ = json.Unmarshal(b, &u)
	return u.Token
}

// browser is an HTTP client with cookies, as a browser without
// JavaScript is.
type webClient struct {
	e *env
	c *http.Client
}

func (e *env) browser() *webClient {
	jar, _ := cookiejar.New(nil)
	return &webClient{e: e, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	code   int
	header http.Header
	body   string
}

func (b *webClient) do(method, path string, form url.Values, header map[string]string) page {
	b.e.t.Helper()
	var rd io.Reader
	if form != nil {
		rd = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, b.e.http.URL+path, rd)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{resp.StatusCode, resp.Header, string(body)}
}

func (b *webClient) get(path string) page { return b.do("GET", path, nil, nil) }

var hiddenCSRF = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// csrf is the CSRF token of a page's forms.
func csrf(t testing.TB, p page) string {
	t.Helper()
	m := hiddenCSRF.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no CSRF token on the page (%d):\n%.2000s", p.code, p.body)
	}
	return m[1]
}

// signIn signs the browser in with a token.
func (b *webClient) signIn(tok string) {
	b.e.t.Helper()
	form := b.get("/-/sign_in")
	p := b.do("POST", "/-/sign_in", url.Values{"token": {tok}, "csrf_token": {csrf(b.e.t, form)}, "return_to": {"/"}}, nil)
	if p.code != http.StatusSeeOther || p.header.Get("Location") != "/" {
		b.e.t.Fatalf("sign in: %d %s\n%.1000s", p.code, p.header.Get("Location"), p.body)
	}
}

func pipelineRequest(projectID int64) pipelines.PipelineRequest {
	return pipelines.PipelineRequest{ProjectID: projectID, Ref: "main", Source: "web"}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
