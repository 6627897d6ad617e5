package githost

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/token"
)

// adminSetting is the setting the tests keep the admin token's digest in.
const adminSetting = "admin_token_digest"

// hostEnv is a Host served over real HTTP on loopback, with a SQLite
// store and a Pushed that records what it is handed (and fails while
// failPush is set).
type hostEnv struct {
	h     *Host
	st    store.Store
	http  *httptest.Server
	admin string

	mu       sync.Mutex
	pushed   []RefUpdate
	failPush error
}

func newHostEnv(t *testing.T) *hostEnv {
	t.Helper()
	testenv.LookPath(t, "git")
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := &hostEnv{st: st, admin: "test-admin-token"}
	if err := st.PutSetting(ctx, adminSetting, token.Digest(e.admin)); err != nil {
		t.Fatal(err)
	}
	e.h = New(Options{Dir: filepath.Join(dir, "repos"), Store: st, AdminTokenSetting: adminSetting, Pushed: e.record})
	e.http = httptest.NewServer(e.h)
	t.Cleanup(func() {
		e.http.Close()
		st.Close()
	})
	return e
}

func (e *hostEnv) record(_ context.Context, _ *store.Project, _ *gitrepo.Repo, u RefUpdate) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failPush != nil {
		return e.failPush
	}
	e.pushed = append(e.pushed, u)
	return nil
}

// takePushed returns what Pushed was handed since the last call.
func (e *hostEnv) takePushed() []RefUpdate {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.pushed
	e.pushed = nil
	return out
}

func (e *hostEnv) createProject(t *testing.T, path string) *store.Project {
	t.Helper()
	p := &store.Project{Path: path, Name: path, DefaultBranch: "main", Visibility: "private", CreatedAt: time.Now().UTC()}
	if err := e.st.CreateProject(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if _, err := gitrepo.Init(t.Context(), e.h.RepoPath(p.ID), p.DefaultBranch); err != nil {
		t.Fatal(err)
	}
	return p
}

// pushFiles commits files to branch of the project's repository over
// smart HTTP with the admin token and returns the commit.
func (e *hostEnv) pushFiles(t *testing.T, project, branch string, files map[string]string, opts ...string) string {
	t.Helper()
	return testenv.PushFiles(t, e.http.URL+"/"+project+".git", "root", e.admin, branch, files, opts...)
}
