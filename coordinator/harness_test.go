package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/internal/fakeclock"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// openTestStore opens the store the coordinator's tests run on: SQLite in
// dir, or, with BERTH_TEST_STORE=postgres, a fresh schema of the
// PostgreSQL database BERTH_TEST_POSTGRES names (.ci/run runs the
// package's tests both ways).
func openTestStore(t testing.TB, dir string) store.Store {
	t.Helper()
	var (
		st  store.Store
		err error
	)
	switch kind := os.Getenv("BERTH_TEST_STORE"); kind {
	case "", "sqlite":
		st, err = sqlite.Open(context.Background(), filepath.Join(dir, "berth.db"))
	case "postgres":
		st, err = postgres.Open(context.Background(), testenv.Postgres(t))
	default:
		t.Fatalf("BERTH_TEST_STORE=%q: want sqlite or postgres", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// env is a coordinator served over real HTTP on loopback with a real
// store (SQLite in a temporary directory, see openTestStore).
type env struct {
	t     testing.TB
	srv   *Server
	st    store.Store
	http  *httptest.Server
	clock *fakeclock.Clock
	admin string
}

// ownURL as a Config's ExternalURL makes newEnv use its test server's
// address, so that URLs the coordinator hands out (repositories, Pages,
// the ID tokens' issuer) reach it.
const ownURL = "own"

func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	return newEnvWith(t, cfg, Options{})
}

// newEnvWith is newEnv with collaborators of the test's own (the store,
// artifacts and clock are always the env's).
func newEnvWith(t testing.TB, cfg Config, opts Options) *env {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	if cfg.ExternalURL == ownURL {
		cfg.ExternalURL = "http://" + hs.Listener.Addr().String()
	}
	ctx := context.Background()
	dir := t.TempDir()
	st := openTestStore(t, dir)
	arts, err := artifacts.NewDir(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	clock := fakeclock.New(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	if cfg.LongPollTimeout == 0 {
		cfg.LongPollTimeout = 2 * time.Second
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = time.Hour // tests call Reap themselves
	}
	opts.Store, opts.Artifacts, opts.Clock = st, arts, clock
	srv, err := New(cfg, opts)
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

type resp struct {
	code   int
	header http.Header
	body   []byte
}

func (r resp) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}

// do sends a request; body may be nil, []byte or a value to encode as JSON.
func (e *env) do(method, path string, body any, header map[string]string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, e.http.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, raw := body.([]byte); body != nil && !raw {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{code: res.StatusCode, header: res.Header, body: b}
}

func (e *env) adminDo(method, path string, body any) resp {
	return e.do(method, path, body, map[string]string{runnerapi.HeaderPrivateToken: e.admin})
}

func expectCode(t testing.TB, what string, r resp, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: status %d, want %d (body %s)", what, r.code, code, r.body)
	}
}

// createRunner creates a runner through the admin API and returns its token.
func (e *env) createRunner(req restapi.CreateRunnerRequest) string {
	e.t.Helper()
	if req.RunnerType == "" {
		req.RunnerType = "instance_type"
	}
	r := e.adminDo("POST", "/api/v4/user/runners", req)
	expectCode(e.t, "create runner", r, http.StatusCreated)
	var out runnerapi.RunnerTokenResponse
	r.json(e.t, &out)
	return out.Token
}

func simpleSpec(name string) dispatch.JobSpec {
	return dispatch.JobSpec{Name: name, ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"echo hi"}, Timeout: 3600, When: "on_success"}}}
}

func (e *env) enqueue(spec dispatch.JobSpec) int64 {
	e.t.Helper()
	j, err := e.srv.Enqueue(context.Background(), spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return j.ID
}

// twoPhase is the info of a runner that acknowledges the jobs it is
// handed (PUT state=running), as gitlab-runner 18.5 and later and Berth's
// runner do; without it a job runs from its hand-out.
var twoPhase = &runnerapi.Info{Features: runnerapi.Features{TwoPhaseJobCommit: true}}

// request asks for a job once with the given last_update, as a runner
// with two-phase commit.
func (e *env) request(tok, systemID, lastUpdate string) (resp, *runnerapi.JobResponse) {
	e.t.Helper()
	r := e.do("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: tok, SystemID: systemID, LastUpdate: lastUpdate, Info: twoPhase}, nil)
	if r.code != http.StatusCreated {
		return r, nil
	}
	var job runnerapi.JobResponse
	r.json(e.t, &job)
	return r, &job
}

// take requests a job and fails the test if none is handed out.
func (e *env) take(tok string) *runnerapi.JobResponse {
	e.t.Helper()
	r, job := e.request(tok, "s_test", "")
	if job == nil {
		e.t.Fatalf("jobs/request: status %d, want 201 (body %s)", r.code, r.body)
	}
	return job
}

func (e *env) update(job *runnerapi.JobResponse, req runnerapi.UpdateJobRequest) resp {
	e.t.Helper()
	if req.Token == "" {
		req.Token = job.Token
	}
	return e.do("PUT", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10), req, map[string]string{runnerapi.HeaderJobToken: job.Token})
}

func (e *env) patch(job *runnerapi.JobResponse, contentRange string, data []byte) resp {
	e.t.Helper()
	h := map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": "text/plain"}
	if contentRange != "" {
		h[runnerapi.HeaderContentRange] = contentRange
	}
	return e.do("PATCH", "/api/v4/jobs/"+strconv.FormatInt(job.ID, 10)+"/trace", data, h)
}

func (e *env) job(id int64) *store.Job {
	e.t.Helper()
	j, err := e.st.GetJob(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

// waitFor polls cond; the bound only limits how long a broken
// implementation hangs, it is not a timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
