package runner

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// Git LFS objects are pulled after the checkout (git lfs pull, with the
// job token), as gitlab-runner does, where git-lfs is installed — here
// from Berth's own git hosting, whose LFS server lets a job's token read
// its project's objects; the job's GIT_LFS_SKIP_SMUDGE leaves the
// pointers.
func TestGitLFS(t *testing.T) {
	e := newE2E(t)
	_, git := gitTools(t)
	testenv.LookPath(t, "git-lfs")
	p, err := e.admin.CreateProject(t.Context(), restapi.CreateProjectRequest{Path: "group/lfs"})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	git(work, "init", "-q", "-b", "main")
	git(work, "lfs", "install", "--local")
	git(work, "lfs", "track", "*.bin")
	os.WriteFile(filepath.Join(work, "big.bin"), []byte("lfs-object-content\n"), 0o644)
	git(work, "add", ".")
	git(work, "commit", "-q", "-m", "lfs")
	sha := git(work, "rev-parse", "HEAD")
	push, _ := url.Parse(e.url + "/group/lfs.git")
	push.User = url.UserPassword("root", e.adminToken)
	git(work, "push", "-q", "-o", "ci.skip", push.String(), "main")

	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, nil, nil)
	run := func(name string, vars ...runnerapi.Variable) (*restapi.JobJSON, string) {
		t.Helper()
		id := e.enqueue(t, dispatch.JobSpec{Name: name, ProjectID: p.ID, ProjectFullPath: "group/lfs", RepoURL: e.url + "/group/lfs.git",
			Ref: "main", Sha: sha, Variables: append([]runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "clone"}}, vars...),
			Steps: script("cat big.bin", "git status --porcelain")})
		return e.waitDone(t, id), e.trace(t, id)
	}
	j, tr := run("pull")
	if j.Status != "success" || !strings.Contains(tr, "\nlfs-object-content") {
		t.Fatalf("LFS pull: %s\n%s", j.Status, tr)
	}
	j, tr = run("skip", runnerapi.Variable{Key: "GIT_LFS_SKIP_SMUDGE", Value: "1"})
	if j.Status != "success" || !strings.Contains(tr, "version https://git-lfs.github.com/spec/v1") || strings.Contains(tr, "\nlfs-object-content") {
		t.Fatalf("GIT_LFS_SKIP_SMUDGE=1: %s\n%s", j.Status, tr)
	}
}
