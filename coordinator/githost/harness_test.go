package githost

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// gitRun runs git in dir with extra environment, failing t on error.
func gitRun(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := gitOutput(dir, env, args...)
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func gitOutput(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "HOME="+dir,
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@x")
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// authEnv makes git send HTTP basic credentials without putting them in
// a URL.
func authEnv(user, pass string) []string {
	cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Basic " + cred}
}

// pushFiles commits files to branch of the project's repository over
// smart HTTP with the admin token and returns the commit.
func (e *hostEnv) pushFiles(t *testing.T, project, branch string, files map[string]string, opts ...string) string {
	t.Helper()
	dir := t.TempDir()
	gitRun(t, dir, nil, "init", "-q", "-b", branch)
	remote := e.http.URL + "/" + project + ".git"
	if _, err := gitOutput(dir, authEnv("root", e.admin), "fetch", "-q", remote, branch); err == nil {
		gitRun(t, dir, nil, "reset", "-q", "--hard", "FETCH_HEAD")
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, dir, nil, "add", "-A")
	gitRun(t, dir, nil, "commit", "-q", "-m", "change "+branch)
	args := append([]string{"push", "-q"}, opts...)
	args = append(args, remote, "HEAD:refs/heads/"+branch)
	gitRun(t, dir, authEnv("root", e.admin), args...)
	return gitRun(t, dir, nil, "rev-parse", "HEAD")
}
