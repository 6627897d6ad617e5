package runner

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// gitServer serves one repository over smart HTTP with git http-backend
// (through net/http/cgi), accepting only gitlab-ci-token with a job
// token, as GitLab does for CI clones.
type gitServer struct {
	url    string
	sha    string
	wrong  atomic.Int32 // requests with credentials that are not a job token
	served atomic.Int32
}

func newGitServer(t *testing.T) *gitServer {
	t.Helper()
	s, h := newGitHandler(t)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/git/group/demo.git"
	return s
}

// gitTools finds git and its git-http-backend (skipping the test, or
// failing it where dependencies are required, without them) and returns
// the backend's path and a runner of git commands with a fixed identity
// (args go before the command's own, as "-c k=v").
func gitTools(t *testing.T, args ...string) (backend string, run func(dir string, args ...string) string) {
	t.Helper()
	git := testenv.LookPath(t, "git")
	execPath, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	backend = filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		testenv.Missing(t, "git-http-backend not found at %s", backend)
	}
	pre := args
	return backend, func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(git, append(append([]string{}, pre...), args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
}

// jobTokenAuth reports whether a request to a test git server carries a
// job token's credentials (gitlab-ci-token:glcbt-…); wrong counts those
// that carry other credentials. It answers 401 itself otherwise.
func jobTokenAuth(w http.ResponseWriter, r *http.Request, wrong *atomic.Int32) bool {
	user, pass, ok := r.BasicAuth()
	if ok && user == "gitlab-ci-token" && strings.HasPrefix(pass, "glcbt-") {
		return true
	}
	// git asks without credentials first, then with those of the URL.
	if ok && wrong != nil {
		wrong.Add(1)
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
	w.WriteHeader(http.StatusUnauthorized)
	return false
}

// newGitHandler is the repository of newGitServer and its handler (the
// repository at /git/group/demo.git; url left to the caller).
func newGitHandler(t *testing.T) (*gitServer, http.Handler) {
	t.Helper()
	backend, run := gitTools(t)
	root := t.TempDir()
	work := filepath.Join(root, "work")
	os.MkdirAll(work, 0o755)
	run(work, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(work, "README"), []byte("demo-repo-content\n"), 0o644)
	os.WriteFile(filepath.Join(work, ".gitignore"), []byte("vendor/\nout/\n"), 0o644)
	run(work, "add", ".")
	run(work, "commit", "-q", "-m", "first")
	os.WriteFile(filepath.Join(work, "second.txt"), []byte("two\n"), 0o644)
	run(work, "add", ".")
	run(work, "commit", "-q", "-m", "second")
	s := &gitServer{sha: run(work, "rev-parse", "HEAD")}
	run(root, "clone", "-q", "--bare", work, filepath.Join(root, "repos", "group", "demo.git"))
	h := &cgi.Handler{
		Path: backend,
		Root: "/git",
		Env:  []string{"GIT_PROJECT_ROOT=" + filepath.Join(root, "repos"), "GIT_HTTP_EXPORT_ALL=1"},
	}
	return s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !jobTokenAuth(w, r, &s.wrong) {
			return
		}
		s.served.Add(1)
		h.ServeHTTP(w, r)
	})
}

type e2e struct {
	t     *testing.T
	srv   *coordinator.Server
	admin *client.Client
	// adminToken is the coordinator's admin token (git pushes).
	adminToken string
	url        string
	// options, if set, changes the Options of the managers started.
	options func(*Options)
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := embedded.Open(ctx, embedded.Options{DataDir: t.TempDir(), Listener: ln,
		Config: coordinator.Config{LongPollTimeout: 2 * time.Second, TraceUpdateInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	admin, err := c.EnsureAdminToken(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	return &e2e{t: t, srv: c.Server, admin: client.New(c.URL, admin), adminToken: admin, url: c.URL}
}

// startRunner creates a runner on the coordinator and runs a manager
// with the shell executor for it.
func (e *e2e) startRunner(dir string) *Manager {
	e.t.Helper()
	m, _ := e.startRunnerWith(dir, restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: "e2e"}, nil, nil)
	return m
}

// startRunnerWith is startRunner with the runner's settings on the
// coordinator, a change to its config entry (nil: none) and a wrapper of
// its executor provider (nil: the shell executor as it is). It returns
// the manager and the runner's token.
func (e *e2e) startRunnerWith(dir string, req restapi.CreateRunnerRequest, tune func(*config.Runner), wrap func(executor.Provider) executor.Provider) (*Manager, string) {
	e.t.Helper()
	ctx := context.Background()
	tok, err := e.admin.CreateRunner(ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	rc := &config.Runner{
		Name: "e2e", URL: e.url, Token: tok.Token, Executor: "shell",
		BuildsDir: filepath.Join(dir, "builds"), CacheDir: filepath.Join(dir, "cache"),
	}
	if tune != nil {
		tune(rc)
	}
	cfg := &config.Config{Concurrent: 2, ShutdownTimeout: 10, Runners: []*config.Runner{rc}}
	if err := cfg.Validate(); err != nil {
		e.t.Fatal(err)
	}
	opts := Options{
		Logger:       slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		PollInterval: 50 * time.Millisecond,
		// A sleeping job sends no trace; the keep-alive carries
		// Job-Status: canceling back.
		ForceSendInterval: 500 * time.Millisecond,
		TraceInterval:     200 * time.Millisecond,
		RequestBackoff:    network.Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond, Factor: 2},
		Version:           "e2e",
		NewProvider: func(rc *config.Runner) (executor.Provider, error) {
			var p executor.Provider = shell.New(shell.Config{Helper: helperBinary(e.t), KillGrace: time.Second})
			if wrap != nil {
				p = wrap(p)
			}
			return p, nil
		},
	}
	if e.options != nil {
		e.options(&opts)
	}
	m, err := New(cfg, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			e.t.Error("runner did not stop")
		}
	})
	return m, tok.Token
}

func (e *e2e) enqueue(t *testing.T, spec dispatch.JobSpec) int64 {
	t.Helper()
	j, err := e.srv.Enqueue(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return j.ID
}

// waitDone waits for a final status; the bound only stops a hang.
func (e *e2e) waitDone(t *testing.T, id int64) *restapi.JobJSON {
	t.Helper()
	var j *restapi.JobJSON
	waitFor(t, "job to finish", func() bool {
		var err error
		j, err = e.admin.Job(context.Background(), 1, id)
		if err != nil {
			t.Fatal(err)
		}
		switch j.Status {
		case "success", "failed", "canceled":
			return true
		}
		return false
	})
	return j
}

func (e *e2e) trace(t *testing.T, id int64) string {
	t.Helper()
	var b bytes.Buffer
	if err := e.admin.Trace(context.Background(), 1, id, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func script(lines ...string) []runnerapi.Step {
	return []runnerapi.Step{{Name: "script", Script: lines, Timeout: 3600, When: "on_success"}}
}

func TestEndToEndWithTheRealCoordinator(t *testing.T) {
	e := newE2E(t)
	git := newGitServer(t)
	m := e.startRunner(t.TempDir())
	const secret = "s3cr3t-value-e2e-42"
	base := func(name string) dispatch.JobSpec {
		return dispatch.JobSpec{
			Name: name, ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
			Variables: []runnerapi.Variable{{Key: "DEPLOY_SECRET", Value: secret, Masked: true}},
			Cache:     []runnerapi.Cache{{Key: "deps-$CI_COMMIT_REF_NAME-non_protected", Paths: []string{"vendor/"}, Policy: "pull-push", When: "on_success"}},
		}
	}

	t.Run("artifacts and cache between jobs, masked secret", func(t *testing.T) {
		build := base("build")
		build.Steps = script(
			"cat README",
			"if [ -f vendor/dep.txt ]; then echo cache-hit; else echo cache-miss; fi",
			"mkdir -p vendor out/sub && echo dependency > vendor/dep.txt",
			"echo built-from-$(cat README) > out/sub/result.txt",
			"echo scratch > out/skip.tmp",
			`echo "the secret is $DEPLOY_SECRET"`,
		)
		build.Artifacts = []runnerapi.Artifact{{Name: "build-output", Paths: []string{"out/**"}, Exclude: []string{"out/*.tmp"}, When: "on_success", ArtifactType: "archive", ArtifactFormat: "zip"}}
		a := e.enqueue(t, build)
		ja := e.waitDone(t, a)
		tra := e.trace(t, a)
		if ja.Status != "success" {
			t.Fatalf("build: %s %s\n%s", ja.Status, ja.FailureReason, tra)
		}
		if !strings.Contains(tra, "demo-repo-content") || !strings.Contains(tra, "cache-miss") || !strings.Contains(tra, "the secret is [MASKED]") {
			t.Fatalf("build trace:\n%s", tra)
		}
		if len(ja.Artifacts) == 0 {
			t.Fatalf("build uploaded no artifacts:\n%s", tra)
		}

		test := base("test")
		test.Dependencies = []int64{a}
		test.Steps = script(
			"cat out/sub/result.txt",
			"test ! -e out/skip.tmp && echo exclude-honoured",
			"if [ -f vendor/dep.txt ]; then echo cache-hit; else echo cache-miss; fi",
			`echo "again $DEPLOY_SECRET"`,
		)
		b := e.enqueue(t, test)
		jb := e.waitDone(t, b)
		trb := e.trace(t, b)
		if jb.Status != "success" {
			t.Fatalf("test: %s %s\n%s", jb.Status, jb.FailureReason, trb)
		}
		for _, want := range []string{"built-from-demo-repo-content", "exclude-honoured", "cache-hit"} {
			if !strings.Contains(trb, want) {
				t.Errorf("test trace lacks %q:\n%s", want, trb)
			}
		}
		for id, tr := range map[int64]string{a: tra, b: trb} {
			if strings.Contains(tr, secret) {
				t.Errorf("job %d: masked secret in the stored trace", id)
			}
			if strings.Contains(strings.ReplaceAll(tr, "glcbt-[MASKED]", ""), "glcbt-") {
				t.Errorf("job %d: job token in the stored trace", id)
			}
		}
		if git.served.Load() == 0 || git.wrong.Load() != 0 {
			t.Errorf("git server: %d served, %d with wrong credentials (clones must authenticate with the job token)", git.served.Load(), git.wrong.Load())
		}
	})

	t.Run("cache policy from a variable", func(t *testing.T) {
		withPolicy := func(name, policy string, vars ...runnerapi.Variable) dispatch.JobSpec {
			spec := base(name)
			spec.Variables = append(spec.Variables, vars...)
			spec.Cache = []runnerapi.Cache{{Key: "policy-var-non_protected", Paths: []string{"pv/"}, Policy: policy, When: "on_success"}}
			spec.Steps = script("if [ -f pv/x ]; then echo pv-hit; else echo pv-miss; fi", "mkdir -p pv && touch pv/x")
			return spec
		}
		pull := e.enqueue(t, withPolicy("pull-only", "$POLICY", runnerapi.Variable{Key: "POLICY", Value: "pull"}))
		if j := e.waitDone(t, pull); j.Status != "success" {
			t.Fatalf("pull-only: %s\n%s", j.Status, e.trace(t, pull))
		}
		if tr := e.trace(t, pull); strings.Contains(tr, "Creating cache") {
			t.Errorf("policy $POLICY=pull archived the cache:\n%s", tr)
		}
		check := e.enqueue(t, withPolicy("check", "pull-push"))
		if j := e.waitDone(t, check); j.Status != "success" || !strings.Contains(e.trace(t, check), "pv-miss") {
			t.Errorf("after a pull-only job the cache must be empty: %s\n%s", j.Status, e.trace(t, check))
		}
		bad := e.enqueue(t, withPolicy("bad", "$POLICY", runnerapi.Variable{Key: "POLICY", Value: "sometimes"}))
		j := e.waitDone(t, bad)
		if tr := e.trace(t, bad); j.Status != "failed" || !strings.Contains(tr, `unknown cache policy "sometimes"`) || strings.Contains(tr, "pv-") {
			t.Errorf("unknown policy: %s, want failed before the script\n%s", j.Status, tr)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		spec := base("slow")
		spec.Timeout = 1
		spec.Steps = script("echo starting", "sleep 1000")
		id := e.enqueue(t, spec)
		j := e.waitDone(t, id)
		if j.Status != "failed" || j.FailureReason != "job_execution_timeout" {
			t.Fatalf("job %s %s\n%s", j.Status, j.FailureReason, e.trace(t, id))
		}
		if tr := e.trace(t, id); !strings.Contains(tr, "execution took longer than") {
			t.Fatalf("trace:\n%s", tr)
		}
	})

	t.Run("cancel runs after_script", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "after-ran")
		spec := base("cancel-me")
		spec.Steps = append(script("echo waiting-for-cancel", "sleep 1000"),
			runnerapi.Step{Name: "after_script", Script: []string{"echo after-script-status=$CI_JOB_STATUS", "touch " + marker}, Timeout: 60, When: "always"})
		id := e.enqueue(t, spec)
		waitFor(t, "job to run", func() bool { return strings.Contains(e.trace(t, id), "waiting-for-cancel") })
		if _, err := e.admin.CancelJob(context.Background(), 1, id); err != nil {
			t.Fatal(err)
		}
		j := e.waitDone(t, id)
		tr := e.trace(t, id)
		if j.Status != "canceled" {
			t.Fatalf("job %s %s\n%s", j.Status, j.FailureReason, tr)
		}
		if _, err := os.Stat(marker); err != nil || !strings.Contains(tr, "after-script-status=canceled") {
			t.Fatalf("after_script did not run on cancel (%v):\n%s", err, tr)
		}
	})

	t.Run("fetch strategy, depth and none", func(t *testing.T) {
		first := base("fetch-1")
		first.Variables = append(first.Variables, runnerapi.Variable{Key: "GIT_STRATEGY", Value: "fetch"}, runnerapi.Variable{Key: "GIT_DEPTH", Value: "1"})
		first.Steps = script("touch .git/berth-marker", "echo commits=$(git rev-list --count HEAD)")
		id := e.enqueue(t, first)
		if j := e.waitDone(t, id); j.Status != "success" || !strings.Contains(e.trace(t, id), "commits=1") {
			t.Fatalf("fetch with depth 1: %s\n%s", j.Status, e.trace(t, id))
		}
		// The coordinator has fetch-1's final update a moment before the
		// runner frees its slot: fetch-2 must find slot 0 (its build
		// directory) free, not run beside it in slot 1.
		waitFor(t, "fetch-1's slot to be freed", func() bool {
			t := m.currentWorkers()[0].slots
			t.mu.Lock()
			defer t.mu.Unlock()
			return !slices.Contains(t.used, true)
		})
		second := first
		second.Name = "fetch-2"
		second.Steps = script("test -e .git/berth-marker && echo reused-git-directory", "cat second.txt")
		id = e.enqueue(t, second)
		tr := ""
		if j := e.waitDone(t, id); j.Status != "success" {
			t.Fatalf("second fetch: %s\n%s", j.Status, e.trace(t, id))
		}
		tr = e.trace(t, id)
		if !strings.Contains(tr, "Reinitialized existing Git repository") || !strings.Contains(tr, "reused-git-directory") {
			t.Fatalf("fetch did not reuse the repository:\n%s", tr)
		}
		served := git.served.Load()
		none := base("none")
		none.Variables = append(none.Variables, runnerapi.Variable{Key: "GIT_STRATEGY", Value: "none"})
		none.Steps = script("echo no-git")
		id = e.enqueue(t, none)
		if j := e.waitDone(t, id); j.Status != "success" || !strings.Contains(e.trace(t, id), "Skipping Git repository setup") {
			t.Fatalf("GIT_STRATEGY=none: %s\n%s", j.Status, e.trace(t, id))
		}
		if git.served.Load() != served {
			t.Fatal("GIT_STRATEGY=none contacted the git server")
		}
	})
}
