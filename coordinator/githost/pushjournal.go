package githost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// A push moves refs (git, in the repository) and then creates pipelines
// (the store): two systems, no common transaction. The push journal makes
// the pair recoverable. Before git runs, the ref updates a push asks for
// are written durably to a file of their own in the repository's
// berth-pushes directory; the file is removed once every pipeline they
// call for exists (Options.Pushed succeeded for each). A coordinator that
// starts finds the files a crash left (ReplayPushes) and creates, for
// every update whose ref now points at the pushed commit, the pipeline it
// is missing. (A pipeline that a crash left half-created, stored with no
// jobs, is the coordinator's to fail at the same start.)
//
//	journal written ──► git receive-pack ──► pipelines created ──► journal removed
//	        crash anywhere here: the next start replays the journal
//
// A journal is JSON, {"updates":[{"Old":…,"New":…,"Ref":…},…]}: a file
// an older Berth left is replayed by a newer one.

// pushJournalDir is the journal's directory inside a bare repository.
const pushJournalDir = "berth-pushes"

type pushJournal struct {
	Updates []RefUpdate `json:"updates"`
}

// journalPush records a push's updates durably and returns the file to
// remove once they are done ("" when there is nothing to record).
func journalPush(repo *gitrepo.Repo, updates []RefUpdate) (string, error) {
	var keep []RefUpdate
	for _, u := range updates {
		if u.New != gitrepo.ZeroSha {
			keep = append(keep, u)
		}
	}
	if len(keep) == 0 {
		return "", nil
	}
	dir := filepath.Join(repo.Dir, pushJournalDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("push journal: %w", err)
	}
	b, err := json.Marshal(pushJournal{Updates: keep})
	if err != nil {
		return "", err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := filepath.Join(dir, hex.EncodeToString(rnd[:])+".json")
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("push journal: %w", err)
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, name)
	}
	if werr == nil {
		werr = syncDir(dir)
	}
	if werr != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("push journal: %w", werr)
	}
	return name, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReplayPushes replays every project's push journals, the pushes a crash
// interrupted: each journaled update whose ref still points at its pushed
// commit goes to replay (which decides whether its pipeline is missing),
// in the order the push listed them; a journal is removed once replay
// succeeded for all of its updates, and kept for the next start
// otherwise. Call it once at start, before serving. It returns an error
// only when it cannot list the projects; a journal it cannot replay is
// logged and kept.
func (h *Host) ReplayPushes(ctx context.Context, replay PushFunc) error {
	if h.dir == "" {
		return nil
	}
	projects, err := h.store.ListProjects(ctx)
	if err != nil {
		return fmt.Errorf("recovering pushes: %w", err)
	}
	for _, p := range projects {
		dir := filepath.Join(h.RepoPath(p.ID), pushJournalDir)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // no journal: nothing to recover
		}
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			if !strings.HasSuffix(e.Name(), ".json") {
				os.Remove(path) // a journal write the crash interrupted
				continue
			}
			if err := h.replayPush(ctx, p, path, replay); err != nil {
				h.log.Error("replaying a push journal", "project_id", p.ID, "file", path, "err", err)
			}
		}
	}
	return nil
}

func (h *Host) replayPush(ctx context.Context, p *store.Project, path string, replay PushFunc) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var j pushJournal
	if err := json.Unmarshal(b, &j); err != nil {
		h.log.Warn("unreadable push journal removed", "project_id", p.ID, "file", path, "err", err)
		return os.Remove(path)
	}
	repo, err := h.Repo(ctx, p)
	if err != nil {
		return err
	}
	refs, err := repo.Refs(ctx)
	if err != nil {
		return err
	}
	for _, u := range j.Updates {
		if refs[u.Ref] != u.New {
			continue // git refused the update, or a later push moved the ref
		}
		if err := replay(ctx, p, repo, u); err != nil {
			return err
		}
	}
	return os.Remove(path)
}
