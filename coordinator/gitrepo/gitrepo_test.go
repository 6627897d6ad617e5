package gitrepo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/berthci/berth/internal/testenv"
)

func needGit(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "git")
}

func TestCommitDirAndRead(t *testing.T) {
	needGit(t)
	ctx := t.Context()
	repo, err := Init(ctx, filepath.Join(t.TempDir(), "r.git"), "trunk")
	if err != nil {
		t.Fatal(err)
	}
	// Init is idempotent.
	if _, err := Init(ctx, repo.Dir, "trunk"); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	work := t.TempDir()
	testenv.WriteFiles(t, work, map[string]string{
		".gitlab-ci.yml": "test:\n  script: [true]\n",
		"src/a.go":       "package a\n",
		"build/out.bin":  "ignored",
		".gitignore":     "build/\n",
	})
	sha1, created, err := CommitDir(ctx, repo.Dir, work, "trunk", "first\n\nbody text", Author{})
	if err != nil || !created {
		t.Fatalf("CommitDir: %s %v %v", sha1, created, err)
	}
	refs, err := repo.Refs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if refs["refs/heads/trunk"] != sha1 {
		t.Errorf("refs = %v, want trunk at %s", refs, sha1)
	}
	c, err := repo.Commit(ctx, sha1)
	if err != nil {
		t.Fatal(err)
	}
	if c.Title() != "first" || c.Description() != "body text" || len(c.Parents) != 0 || c.AuthorName != "Berth" {
		t.Errorf("commit = %+v (title %q, description %q)", c, c.Title(), c.Description())
	}

	fsys, err := repo.FS(ctx, sha1)
	if err != nil {
		t.Fatal(err)
	}
	if err := fstest.TestFS(fsys, ".gitlab-ci.yml", "src/a.go", ".gitignore"); err != nil {
		t.Errorf("fstest: %v", err)
	}
	if _, err := fs.Stat(fsys, "build/out.bin"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ignored file: Stat error %v, want not exist", err)
	}

	// No change: no commit.
	same, created, err := CommitDir(ctx, repo.Dir, work, "trunk", "again", Author{})
	if err != nil || created || same != sha1 {
		t.Errorf("CommitDir without changes = %s, %v, %v; want %s, false", same, created, err, sha1)
	}

	testenv.WriteFiles(t, work, map[string]string{"src/b.go": "package a\n"})
	if err := os.Remove(filepath.Join(work, ".gitignore")); err != nil {
		t.Fatal(err)
	}
	sha2, created, err := CommitDir(ctx, repo.Dir, work, "trunk", "second", Author{Name: "A", Email: "a@x"})
	if err != nil || !created {
		t.Fatalf("second CommitDir: %v", err)
	}
	c2, err := repo.Commit(ctx, sha2)
	if err != nil || !slices.Equal(c2.Parents, []string{sha1}) {
		t.Fatalf("second commit parents %v (err %v), want [%s]", c2.Parents, err, sha1)
	}
	changed, err := repo.ChangedFiles(ctx, sha1, sha2)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".gitignore", "build/out.bin", "src/b.go"}
	if !slices.Equal(changed, want) {
		t.Errorf("ChangedFiles = %v, want %v", changed, want)
	}
	if _, err := repo.ChangedFiles(ctx, ZeroSha, sha2); !errors.Is(err, ErrNotFound) {
		t.Errorf("ChangedFiles from the zero sha: %v, want ErrNotFound", err)
	}
	last, err := repo.LastCommitTouching(ctx, sha2, "src/a.go")
	if err != nil || last != sha1 {
		t.Errorf("LastCommitTouching(src/a.go) = %q, %v; want %s", last, err, sha1)
	}
	if got, err := repo.ResolveCommit(ctx, "trunk"); err != nil || got != sha2 {
		t.Errorf("ResolveCommit(trunk) = %q, %v", got, err)
	}
	for _, bad := range []string{"nope", "", "--all", "trunk~5"} {
		if _, err := repo.ResolveCommit(ctx, bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("ResolveCommit(%q): %v, want ErrNotFound", bad, err)
		}
	}
}

func TestParseTreeMalformed(t *testing.T) {
	for _, in := range []string{"garbage\x00", "100644 blob abc\tx\x00", "100644 blob abc nope\tx\x00"} {
		if _, err := parseTree([]byte(in)); err == nil {
			t.Errorf("parseTree(%q): no error", in)
		}
	}
	tr, err := parseTree([]byte("160000 commit 0123 -\tsub\x00100644 blob ab 3\t../x\x00"))
	if err != nil || len(tr.files) != 0 {
		t.Errorf("submodules and invalid paths must be skipped: %v %v", tr.files, err)
	}
}

func TestCreateTag(t *testing.T) {
	needGit(t)
	ctx := t.Context()
	r, err := Init(ctx, filepath.Join(t.TempDir(), "r.git"), "main")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"a.txt": "a"})
	sha, _, err := CommitDir(ctx, r.Dir, src, "main", "first", Author{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CreateTag(ctx, "v1", sha, "", Author{}); err != nil {
		t.Fatal(err)
	}
	if err := r.CreateTag(ctx, "v2", sha, "Release 2\n", Author{Name: "CI", Email: "ci@x"}); err != nil {
		t.Fatal(err)
	}
	refs, err := r.Refs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if refs["refs/tags/v1"] != sha || refs["refs/tags/v2"] != sha {
		t.Errorf("refs = %v, want both tags at %s", refs, sha)
	}
	out, err := r.git(ctx, nil, nil, "cat-file", "-p", "refs/tags/v2")
	if err != nil || !strings.Contains(string(out), "tagger CI <ci@x>") || !strings.Contains(string(out), "Release 2") {
		t.Errorf("annotated tag: %s %v", out, err)
	}
	if err := r.CreateTag(ctx, "v1", sha, "", Author{}); err == nil {
		t.Error("creating an existing tag succeeded")
	}
}

// The settings Init writes are git's: git reads them back.
func TestInitSettings(t *testing.T) {
	needGit(t)
	dir := filepath.Join(t.TempDir(), "p.git")
	r, err := Init(t.Context(), dir, "trunk")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"http.receivepack": "true", "receive.advertisePushOptions": "true",
		"uploadpack.allowAnySHA1InWant": "true", "core.logAllRefUpdates": "false", "core.bare": "true",
	} {
		out, err := r.git(t.Context(), nil, nil, "config", "--get", key)
		if got := strings.TrimSpace(string(out)); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", key, got, err, want)
		}
	}
	if head, err := os.ReadFile(filepath.Join(dir, "HEAD")); err != nil || strings.TrimSpace(string(head)) != "ref: refs/heads/trunk" {
		t.Errorf("HEAD %q (%v)", head, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "hooks")); !os.IsNotExist(err) {
		t.Errorf("sample hooks were copied (%v)", err)
	}
}

// With DateFor, the same files make the same commit in another
// repository; without, the date is now.
func TestCommitDirDateFor(t *testing.T) {
	needGit(t)
	src := t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"a.txt": "a"})
	when := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	var trees []string
	author := Author{DateFor: func(tree string) time.Time { trees = append(trees, tree); return when }}
	var shas []string
	for range 2 {
		dir := filepath.Join(t.TempDir(), "p.git")
		if _, err := Init(t.Context(), dir, "main"); err != nil {
			t.Fatal(err)
		}
		sha, _, err := CommitDir(t.Context(), dir, src, "main", "m", author)
		if err != nil {
			t.Fatal(err)
		}
		c, err := (&Repo{Dir: dir}).Commit(t.Context(), sha)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := time.Parse(time.RFC3339, c.AuthorDate); err != nil || !d.Equal(when) {
			t.Errorf("commit date %q (%v), want %v", c.AuthorDate, err, when)
		}
		shas = append(shas, sha)
	}
	if shas[0] != shas[1] || len(trees) != 2 || trees[0] != trees[1] {
		t.Errorf("commits %v of trees %v: want one commit of one tree", shas, trees)
	}
}
