package githost

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// journalFiles lists the files of a project's push journal directory.
func journalFiles(t *testing.T, e *hostEnv, p *store.Project) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.h.RepoPath(p.ID), pushJournalDir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

// A push hands each ref it created or moved to Pushed, unless it asks
// for ci.skip; its journal goes once Pushed succeeded for every ref and
// stays for ReplayPushes when one failed.
func TestPushHandsChangedRefs(t *testing.T) {
	e := newHostEnv(t)
	p := e.createProject(t, "group/demo")
	sha := e.pushFiles(t, "group/demo", "main", map[string]string{"a.txt": "one"})
	if got, want := e.takePushed(), []RefUpdate{{Old: gitrepo.ZeroSha, New: sha, Ref: "refs/heads/main"}}; !slices.Equal(got, want) {
		t.Errorf("first push handed %+v, want %+v", got, want)
	}
	if left := journalFiles(t, e, p); len(left) != 0 {
		t.Errorf("journal left after a push whose refs were all handed over: %v", left)
	}

	e.pushFiles(t, "group/demo", "main", map[string]string{"a.txt": "two"}, "-o", "ci.skip")
	if got := e.takePushed(); len(got) != 0 {
		t.Errorf("a ci.skip push handed %+v, want nothing", got)
	}
	if left := journalFiles(t, e, p); len(left) != 0 {
		t.Errorf("a ci.skip push left a journal: %v", left)
	}

	e.mu.Lock()
	e.failPush = errors.New("store unavailable")
	e.mu.Unlock()
	sha3 := e.pushFiles(t, "group/demo", "main", map[string]string{"a.txt": "three"})
	if left := journalFiles(t, e, p); len(left) != 1 || !strings.HasSuffix(left[0], ".json") {
		t.Fatalf("journal after a push whose pipeline failed: %v, want one file", left)
	}
	var replayed []RefUpdate
	err := e.h.ReplayPushes(t.Context(), func(_ context.Context, rp *store.Project, repo *gitrepo.Repo, u RefUpdate) error {
		if rp.ID != p.ID || repo.Dir != e.h.RepoPath(p.ID) {
			t.Errorf("replay of project %d in %s, want %d in %s", rp.ID, repo.Dir, p.ID, e.h.RepoPath(p.ID))
		}
		replayed = append(replayed, u)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(replayed) != 1 || replayed[0].New != sha3 || replayed[0].Ref != "refs/heads/main" {
		t.Errorf("replayed %+v, want the failed push's update of main to %s", replayed, sha3)
	}
	if left := journalFiles(t, e, p); len(left) != 0 {
		t.Errorf("journal left after a successful replay: %v", left)
	}
}

// The file side of the journal: what is written, what a replay hands
// over (only updates whose ref is still at the pushed commit), what it
// cleans up, and that a failed replay keeps the journal.
func TestReplayPushes(t *testing.T) {
	e := newHostEnv(t)
	p := e.createProject(t, "p")
	repo, err := e.h.Repo(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	sha, _, err := gitrepo.CommitDir(t.Context(), repo.Dir, src, "main", "one", gitrepo.Author{})
	if err != nil {
		t.Fatal(err)
	}

	// Deletions are not journaled: they start nothing.
	if name, err := journalPush(repo, []RefUpdate{{Old: sha, New: gitrepo.ZeroSha, Ref: "refs/heads/gone"}}); err != nil || name != "" {
		t.Fatalf("journaling only a deletion: %q, %v; want no file", name, err)
	}
	name, err := journalPush(repo, []RefUpdate{
		{Old: gitrepo.ZeroSha, New: sha, Ref: "refs/heads/main"},
		{Old: gitrepo.ZeroSha, New: sha, Ref: "refs/heads/refused"}, // git refused it: no such ref
		{Old: sha, New: gitrepo.ZeroSha, Ref: "refs/heads/gone"},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"updates":[{"Old":"` + gitrepo.ZeroSha + `","New":"` + sha + `","Ref":"refs/heads/main"},{"Old":"` + gitrepo.ZeroSha + `","New":"` + sha + `","Ref":"refs/heads/refused"}]}`; string(b) != want {
		t.Errorf("journal on disk:\n%s\nwant\n%s", b, want)
	}
	dir := filepath.Dir(name)
	if err := os.WriteFile(filepath.Join(dir, "torn.json.tmp"), []byte(`{"upd`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "garbled.json"), []byte(`{"upd`), 0o600); err != nil {
		t.Fatal(err)
	}

	var calls []RefUpdate
	replay := func(fail error) PushFunc {
		return func(_ context.Context, _ *store.Project, _ *gitrepo.Repo, u RefUpdate) error {
			calls = append(calls, u)
			return fail
		}
	}
	if err := e.h.ReplayPushes(t.Context(), replay(errors.New("store unavailable"))); err != nil {
		t.Fatal(err)
	}
	if left := journalFiles(t, e, p); !slices.Equal(left, []string{filepath.Base(name)}) {
		t.Errorf("after a failed replay: %v, want only the journal kept (the torn and garbled files removed)", left)
	}
	calls = nil
	if err := e.h.ReplayPushes(t.Context(), replay(nil)); err != nil {
		t.Fatal(err)
	}
	if want := []RefUpdate{{Old: gitrepo.ZeroSha, New: sha, Ref: "refs/heads/main"}}; !slices.Equal(calls, want) {
		t.Errorf("replay handed %+v, want %+v", calls, want)
	}
	if left := journalFiles(t, e, p); len(left) != 0 {
		t.Errorf("journal left after a successful replay: %v", left)
	}

	// Without git hosting there is nothing to replay.
	off := New(Options{Store: e.st})
	if err := off.ReplayPushes(t.Context(), replay(errors.New("called"))); err != nil {
		t.Errorf("ReplayPushes without a directory: %v", err)
	}
	if _, err := off.Repo(t.Context(), p); !errors.Is(err, ErrDisabled) {
		t.Errorf("Repo without a directory: %v, want ErrDisabled", err)
	}
}
