package githost

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/internal/testenv"
)

func TestRefsDigest(t *testing.T) {
	testenv.LookPath(t, "git")
	ctx := t.Context()
	gitDir := filepath.Join(t.TempDir(), "p.git")
	repo, err := gitrepo.Init(ctx, gitDir, "main")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	sha, _, err := gitrepo.CommitDir(ctx, gitDir, src, "main", "one", gitrepo.Author{})
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.UpdateRef(ctx, "refs/pipelines/1", sha, ""); err != nil {
		t.Fatal(err)
	}
	exact := []string{"+refs/pipelines/1:refs/pipelines/1", "+refs/heads/main:refs/remotes/origin/main"}
	wild := []string{"+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"}
	d1, w1 := refsDigest(gitDir, exact, 20, sha), refsDigest(gitDir, wild, 20, sha)
	if d1 == "" || w1 == "" || d1 == w1 {
		t.Fatalf("digests %q %q: want two different ones", d1, w1)
	}
	if refsDigest(gitDir, exact, 20, sha) != d1 {
		t.Error("the same refs give another digest")
	}
	if refsDigest(gitDir, exact, 10, sha) == d1 || refsDigest(gitDir, exact, 20, "0123") == d1 {
		t.Error("the depth or the commit does not change the digest")
	}

	// A ref the exact refspecs do not read: theirs stays, the wildcard's
	// changes.
	if err := repo.UpdateRef(ctx, "refs/heads/other", sha, ""); err != nil {
		t.Fatal(err)
	}
	if refsDigest(gitDir, exact, 20, sha) != d1 {
		t.Error("a branch the refspecs do not name changed the digest")
	}
	w2 := refsDigest(gitDir, wild, 20, sha)
	if w2 == w1 {
		t.Error("a new branch did not change the digest of refs/heads/*")
	}
	// Moving a ref they read changes it.
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := gitrepo.CommitDir(ctx, gitDir, src, "main", "two", gitrepo.Author{}); err != nil {
		t.Fatal(err)
	}
	d2 := refsDigest(gitDir, exact, 20, sha)
	if d2 == d1 {
		t.Error("moving refs/heads/main did not change the digest")
	}
	// Packing refs (git gc) changes nothing: the values are the same.
	if out, err := exec.Command("git", "--git-dir", gitDir, "pack-refs", "--all").CombinedOutput(); err != nil {
		t.Fatalf("pack-refs: %v %s", err, out)
	}
	if got := refsDigest(gitDir, exact, 20, sha); got != d2 {
		t.Error("packing the refs changed the digest")
	}
	if got := refsDigest(gitDir, wild, 20, sha); got == w2 || got == "" {
		// main moved since w2; the packed values are read.
		t.Errorf("the wildcard digest after main moved and refs were packed: %q", got)
	}
	// The same refs in a repository made anew give the same digest (berth
	// run's next run, whose kept checkouts then skip their fetch).
	again := filepath.Join(t.TempDir(), "p.git")
	if _, err := gitrepo.Init(ctx, again, "main"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "--git-dir", again, "fetch", "-q", gitDir, "+refs/*:refs/*").CombinedOutput(); err != nil {
		t.Fatalf("copying the refs: %v %s", err, out)
	}
	if got := refsDigest(again, exact, 20, sha); got != d2 {
		t.Errorf("the same refs in another repository: %q, want %q", got, d2)
	}
	// What it cannot vouch for gets none.
	for _, bad := range [][]string{nil, {"+HEAD:refs/x"}, {"+refs/heads/*/x:refs/y/*/x"}, {"+refs/../x:refs/x"}} {
		if got := refsDigest(gitDir, bad, 20, sha); got != "" {
			t.Errorf("refspecs %q: digest %q, want none", bad, got)
		}
	}
	if err := os.MkdirAll(filepath.Join(gitDir, "reftable"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := refsDigest(gitDir, exact, 20, sha); got != "" {
		t.Errorf("a reftable repository: digest %q, want none", got)
	}
	if refsDigest(filepath.Join(t.TempDir(), "missing.git"), exact, 20, sha) != "" || refsDigest(gitDir, exact, 20, "") != "" {
		t.Error("a missing repository or commit got a digest")
	}
}
