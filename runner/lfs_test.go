package runner

import (
	"encoding/json"
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
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// lfsServer serves group/lfs.git over git's smart HTTP and its Git LFS
// objects over the LFS batch API (basic transfer), both only to a job
// token; the repository's big.bin is an LFS object.
type lfsServer struct {
	url, sha  string
	batches   atomic.Int32 // batch requests with a job token
	downloads atomic.Int32
}

func newLFSServer(t *testing.T) *lfsServer {
	t.Helper()
	backend, run := gitTools(t)
	testenv.LookPath(t, "git-lfs")
	root := t.TempDir()
	work := filepath.Join(root, "work")
	os.MkdirAll(work, 0o755)
	run(work, "init", "-q", "-b", "main")
	run(work, "lfs", "install", "--local")
	run(work, "lfs", "track", "*.bin")
	os.WriteFile(filepath.Join(work, "big.bin"), []byte("lfs-object-content\n"), 0o644)
	os.WriteFile(filepath.Join(work, "README"), []byte("lfs-repo\n"), 0o644)
	run(work, "add", ".")
	run(work, "commit", "-q", "-m", "lfs")
	s := &lfsServer{sha: run(work, "rev-parse", "HEAD")}
	run(root, "clone", "-q", "--bare", work, filepath.Join(root, "repos", "group", "lfs.git"))
	objects := filepath.Join(work, ".git", "lfs", "objects")

	gh := &cgi.Handler{Path: backend, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Join(root, "repos"), "GIT_HTTP_EXPORT_ALL=1"}}
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/lfs-objects/"):
			oid := strings.TrimPrefix(r.URL.Path, "/lfs-objects/")
			if len(oid) != 64 || strings.ContainsAny(oid, "./") {
				http.NotFound(w, r)
				return
			}
			s.downloads.Add(1)
			http.ServeFile(w, r, filepath.Join(objects, oid[:2], oid[2:4], oid))
			return
		case !jobTokenAuth(w, r, nil):
			return
		case strings.HasSuffix(r.URL.Path, "/info/lfs/objects/batch"):
			s.batches.Add(1)
			var req struct {
				Operation string `json:"operation"`
				Objects   []struct {
					OID  string `json:"oid"`
					Size int64  `json:"size"`
				} `json:"objects"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Operation != "download" {
				http.Error(w, "bad batch", http.StatusUnprocessableEntity)
				return
			}
			type action struct {
				Href string `json:"href"`
			}
			type object struct {
				OID           string            `json:"oid"`
				Size          int64             `json:"size"`
				Authenticated bool              `json:"authenticated"`
				Actions       map[string]action `json:"actions"`
			}
			resp := struct {
				Transfer string   `json:"transfer"`
				Objects  []object `json:"objects"`
			}{Transfer: "basic"}
			for _, o := range req.Objects {
				resp.Objects = append(resp.Objects, object{OID: o.OID, Size: o.Size, Authenticated: true,
					Actions: map[string]action{"download": {Href: srv.URL + "/lfs-objects/" + o.OID}}})
			}
			w.Header().Set("Content-Type", "application/vnd.git-lfs+json")
			_ = json.NewEncoder(w).Encode(resp)
			return
		}
		gh.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/git/group/lfs.git"
	return s
}

// Git LFS objects are pulled after the checkout (git lfs pull, with the
// job token), as gitlab-runner does, where git-lfs is installed; the
// job's GIT_LFS_SKIP_SMUDGE leaves the pointers.
func TestGitLFS(t *testing.T) {
	e := newE2E(t)
	lfs := newLFSServer(t)
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil, nil)
	run := func(name string, vars ...runnerapi.Variable) (*restapi.JobJSON, string) {
		t.Helper()
		id := e.enqueue(t, dispatch.JobSpec{Name: name, ProjectID: 1, ProjectFullPath: "group/lfs", RepoURL: lfs.url, Ref: "main", Sha: lfs.sha,
			Variables: append([]runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "clone"}}, vars...), Steps: script("cat big.bin", "git status --porcelain")})
		return e.waitDone(t, id), e.trace(t, id)
	}
	j, tr := run("pull")
	if j.Status != "success" || !strings.Contains(tr, "\nlfs-object-content") || lfs.batches.Load() == 0 || lfs.downloads.Load() == 0 {
		t.Fatalf("LFS pull: %s, %d batches, %d downloads\n%s", j.Status, lfs.batches.Load(), lfs.downloads.Load(), tr)
	}
	before := lfs.downloads.Load()
	j, tr = run("skip", runnerapi.Variable{Key: "GIT_LFS_SKIP_SMUDGE", Value: "1"})
	if j.Status != "success" || !strings.Contains(tr, "version https://git-lfs.github.com/spec/v1") || lfs.downloads.Load() != before {
		t.Fatalf("GIT_LFS_SKIP_SMUDGE=1: %s\n%s", j.Status, tr)
	}
}
