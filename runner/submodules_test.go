package runner

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// submoduleServer serves, over git's smart HTTP and only to a job token,
// group/super.git with three submodules: lib (relative URL ../lib.git,
// which has a submodule of its own, nested, at ../nested.git) and abs (an
// absolute URL on the same host, which a clone reaches only with the
// job's credentials).
type submoduleServer struct {
	url, sha string
	wrong    atomic.Int32
}

func newSubmoduleServer(t *testing.T) *submoduleServer {
	t.Helper()
	backend, run := gitTools(t, "-c", "protocol.file.allow=always")
	s := &submoduleServer{}
	root := t.TempDir()
	repos := filepath.Join(root, "repos", "group")
	h := &cgi.Handler{Path: backend, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Join(root, "repos"), "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if jobTokenAuth(w, r, &s.wrong) {
			h.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/git/group/super.git"

	repo := func(name string, files map[string]string, subs map[string]string) {
		t.Helper()
		work := filepath.Join(root, "work", name)
		os.MkdirAll(work, 0o755)
		run(work, "init", "-q", "-b", "main")
		for f, content := range files {
			os.WriteFile(filepath.Join(work, f), []byte(content), 0o644)
		}
		run(work, "add", ".")
		for path, url := range subs {
			// Added from the bare repository on disk, then pointed at
			// the URL jobs see.
			run(work, "submodule", "add", "-q", filepath.Join(repos, filepath.Base(strings.TrimSuffix(url, ".git"))+".git"), path)
			run(work, "config", "-f", ".gitmodules", "submodule."+path+".url", url)
		}
		run(work, "add", ".")
		run(work, "commit", "-q", "-m", name)
		run(root, "clone", "-q", "--bare", work, filepath.Join(repos, name+".git"))
		if name == "super" {
			s.sha = run(work, "rev-parse", "HEAD")
		}
	}
	repo("nested", map[string]string{"nested.txt": "nested-content\n"}, nil)
	repo("lib", map[string]string{"lib.txt": "lib-content\n"}, map[string]string{"nested": "../nested.git"})
	repo("abs", map[string]string{"abs.txt": "abs-content\n"}, nil)
	repo("super", map[string]string{"README": "super-content\n"}, map[string]string{"lib": "../lib.git", "abs": srv.URL + "/git/group/abs.git"})
	return s
}

// GIT_SUBMODULE_STRATEGY as gitlab-runner: normal checks out the
// submodules, recursive theirs too, GIT_SUBMODULE_PATHS limits them, none
// (the default) leaves them; a submodule on the coordinator's host by an
// absolute URL fetches with the job token, and git in the job's script
// authenticates inside a submodule too. An unknown strategy fails the job.
func TestGitSubmoduleStrategy(t *testing.T) {
	e := newE2E(t)
	git := newSubmoduleServer(t)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil, nil)
	check := `for f in README lib/lib.txt lib/nested/nested.txt abs/abs.txt; do if [ -f "$f" ]; then echo "have:$f"; else echo "lack:$f"; fi; done`
	run := func(name string, vars map[string]string, extra ...string) (string, string) {
		t.Helper()
		spec := dispatch.JobSpec{Name: name, ProjectID: 1, ProjectFullPath: "group/super", RepoURL: git.url, Ref: "main", Sha: git.sha,
			Variables: []runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "clone"}},
			Steps:     script(append([]string{check}, extra...)...)}
		for k, v := range vars {
			spec.Variables = append(spec.Variables, runnerapi.Variable{Key: k, Value: v})
		}
		id := e.enqueue(t, spec)
		j := e.waitDone(t, id)
		return j.Status, e.trace(t, id)
	}
	expect := func(name, tr string, have ...string) {
		t.Helper()
		for _, f := range []string{"README", "lib/lib.txt", "lib/nested/nested.txt", "abs/abs.txt"} {
			want := "lack:" + f
			for _, h := range have {
				if h == f {
					want = "have:" + f
				}
			}
			if !strings.Contains(tr, want) {
				t.Errorf("%s: want %s\n%s", name, want, tr)
			}
		}
	}
	st, tr := run("none", nil)
	if st != "success" || !strings.Contains(tr, "Skipping Git submodules setup") {
		t.Fatalf("none: %s\n%s", st, tr)
	}
	expect("none", tr, "README")

	st, tr = run("normal", map[string]string{"GIT_SUBMODULE_STRATEGY": "normal"},
		"cd lib && git fetch -q origin && echo fetched-in-submodule")
	if st != "success" || !strings.Contains(tr, "Updating/initializing submodules...") || !strings.Contains(tr, "fetched-in-submodule") {
		t.Fatalf("normal: %s\n%s", st, tr)
	}
	expect("normal", tr, "README", "lib/lib.txt", "abs/abs.txt")

	st, tr = run("recursive", map[string]string{"GIT_SUBMODULE_STRATEGY": "recursive", "GIT_SUBMODULE_DEPTH": "1"})
	if st != "success" || !strings.Contains(tr, "Updating/initializing submodules recursively with git depth set to 1...") {
		t.Fatalf("recursive: %s\n%s", st, tr)
	}
	expect("recursive", tr, "README", "lib/lib.txt", "lib/nested/nested.txt", "abs/abs.txt")

	st, tr = run("paths", map[string]string{"GIT_SUBMODULE_STRATEGY": "recursive", "GIT_SUBMODULE_PATHS": ":(exclude)abs"})
	if st != "success" {
		t.Fatalf("paths: %s\n%s", st, tr)
	}
	expect("paths", tr, "README", "lib/lib.txt", "lib/nested/nested.txt")

	st, tr = run("unknown", map[string]string{"GIT_SUBMODULE_STRATEGY": "deep"})
	if st != "failed" || !strings.Contains(tr, `unknown GIT_SUBMODULE_STRATEGY "deep"`) {
		t.Fatalf("unknown: %s\n%s", st, tr)
	}
	if n := git.wrong.Load(); n != 0 {
		t.Errorf("%d requests with credentials that are not a job token", n)
	}
	if strings.Contains(strings.ReplaceAll(tr, "glcbt-[MASKED]", ""), "glcbt-") {
		t.Error("a job token in the trace")
	}
}
