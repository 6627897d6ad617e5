package coordinator

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/store"
)

// TestCrashDuringPushIsRecovered: a coordinator killed after git moved a
// branch but before the pipeline existed lost the pipeline for good, and
// one killed between storing a pipeline and its jobs left it failed
// without a word (issue 9, defect 6). The next start fails the
// half-created pipeline with the reason and creates the missing one.
func TestCrashDuringPushIsRecovered(t *testing.T) {
	e := newGitEnv(t, Config{})
	p, err := e.srv.pipelines.CreateProject(t.Context(), pipelines.ProjectSpec{Path: "p"})
	if err != nil {
		t.Fatal(err)
	}
	// An ordinary push leaves no journal behind.
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\n"})
	waitFor(t, "the push's pipeline", func() bool { return len(mustPipelines(t, e)) == 1 })
	journalDir := filepath.Join(e.srv.git.RepoPath(p.ID), "berth-pushes")
	if left, _ := os.ReadDir(journalDir); len(left) != 0 {
		t.Fatalf("journal left after a completed push: %v", left)
	}
	repo, err := e.srv.git.Repo(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	refs, _ := repo.Refs(t.Context())
	old := refs["refs/heads/main"]

	// The state a crash leaves: the journal of a push whose branch moved,
	// with a half-created pipeline for it, and an update git refused.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte("b:\n  script: [x]\nc:\n  script: [x]\n"), 0o644)
	e.srv.Close()
	sha, err := e.srv.pipelines.CommitDir(t.Context(), p.ID, "main", dir, "pushed before the crash")
	if err != nil {
		t.Fatal(err)
	}
	// The journal as githost writes it (its format on disk is kept: a
	// journal an older Berth left is replayed).
	journal := fmt.Sprintf(`{"updates":[{"Old":%q,"New":%q,"Ref":"refs/heads/main"},{"Old":%q,"New":%q,"Ref":"refs/heads/refused"}]}`,
		old, sha, gitrepo.ZeroSha, sha)
	if err := os.MkdirAll(journalDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(journalDir, "0123456789abcdef.json"), []byte(journal), 0o600); err != nil {
		t.Fatal(err)
	}
	half := &store.Pipeline{ProjectID: p.ID, Ref: "main", Sha: sha, BeforeSha: old, Source: pipelines.SourcePush, Status: store.StatusCreated}
	if err := e.st.CreatePipeline(t.Context(), half); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(journalDir, "torn.json.tmp"), []byte(`{"upd`), 0o600)

	srv2, err := New(Config{ExternalURL: e.http.URL}, Options{Store: e.st, Artifacts: e.srv.artifacts, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()

	got, err := e.st.GetPipeline(t.Context(), half.ID)
	if err != nil || got.Status != store.StatusFailed || !strings.Contains(got.YAMLErrors, "interrupted") {
		t.Errorf("half-created pipeline: %+v %v, want failed saying it was interrupted", got, err)
	}
	ps, err := e.st.ListPipelines(t.Context(), store.PipelineFilter{ProjectID: p.ID, Sha: sha})
	if err != nil {
		t.Fatal(err)
	}
	var recovered *store.Pipeline
	for _, pl := range ps {
		if pl.ID != half.ID {
			if recovered != nil {
				t.Fatalf("two pipelines recovered for one push: %d and %d", recovered.ID, pl.ID)
			}
			recovered = pl
		}
	}
	if recovered == nil || recovered.Source != pipelines.SourcePush || recovered.Ref != "main" {
		t.Fatalf("recovered pipeline %+v, want one for the pushed commit on main", recovered)
	}
	jobs, _ := e.st.ListJobs(t.Context(), store.JobFilter{PipelineID: recovered.ID})
	if len(jobs) != 2 {
		t.Errorf("recovered pipeline has %d jobs, want 2", len(jobs))
	}
	if left, _ := os.ReadDir(journalDir); len(left) != 0 {
		t.Errorf("journal left after recovery: %v", left)
	}
}
