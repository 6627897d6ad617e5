package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// A push moves refs (git, in the repository) and then creates pipelines
// (the store): two systems, no common transaction. The push journal makes
// the pair recoverable. Before git runs, the ref updates a push asks for
// are written durably to a file of their own in the repository's
// berth-pushes directory; the file is removed once every pipeline they
// call for exists. A coordinator that starts finds the files a crash left
// and creates, for every update whose ref now points at the pushed commit,
// the pipeline it is missing. A pipeline that a crash left half-created
// (stored, with no jobs) is failed with the reason at the same start.
//
//	journal written ──► git receive-pack ──► pipelines created ──► journal removed
//	        crash anywhere here: the next Start replays the journal

// pushJournalDir is the journal's directory inside a bare repository.
const pushJournalDir = "berth-pushes"

// interruptedPipelineError is the YAML error of a pipeline a crash left
// without jobs.
const interruptedPipelineError = "pipeline creation was interrupted: the coordinator stopped before the pipeline's jobs were stored (a pushed commit gets a new pipeline on restart; otherwise create it again)"

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

// replayPushes replays every push journal: each update whose ref still
// points at its pushed commit and has no pipeline (other than one in
// interrupted, failed at this start) gets one.
func (s *Server) replayPushes(ctx context.Context, interrupted map[int64]bool) error {
	if s.repoDir == "" {
		return nil
	}
	projects, err := s.store.ListProjects(ctx)
	if err != nil {
		return fmt.Errorf("recovering pushes: %w", err)
	}
	for _, p := range projects {
		dir := filepath.Join(s.repoPath(p.ID), pushJournalDir)
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
			if err := s.replayPush(ctx, p, path, interrupted); err != nil {
				s.log.Error("replaying a push journal", "project_id", p.ID, "file", path, "err", err)
			}
		}
	}
	return nil
}

func (s *Server) replayPush(ctx context.Context, p *store.Project, path string, interrupted map[int64]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var j pushJournal
	if err := json.Unmarshal(b, &j); err != nil {
		s.log.Warn("unreadable push journal removed", "project_id", p.ID, "file", path, "err", err)
		return os.Remove(path)
	}
	repo, err := s.repo(ctx, p)
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
		ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{ProjectID: p.ID, Sha: u.New})
		if err != nil {
			return err
		}
		done := false
		for _, pl := range ps {
			if pl.Source == SourcePush && !interrupted[pl.ID] {
				done = true
			}
		}
		if done {
			continue
		}
		s.log.Info("push recovered after a restart: creating its pipeline", "project_id", p.ID, "ref", u.Ref, "sha", shortSha(u.New))
		if err := s.pushPipeline(ctx, p, repo, u); err != nil {
			return err
		}
	}
	return os.Remove(path)
}

// failInterruptedPipelines fails every pipeline still "created" with no
// jobs (created before before, unless that is zero): a crash stopped its
// creation between the two writes. It returns their ids.
func (s *Server) failInterruptedPipelines(ctx context.Context, before time.Time) (map[int64]bool, error) {
	ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{Statuses: []store.Status{store.StatusCreated}})
	if err != nil {
		return nil, fmt.Errorf("finding interrupted pipelines: %w", err)
	}
	out := map[int64]bool{}
	for _, pl := range ps {
		if !before.IsZero() && !pl.CreatedAt.Before(before) {
			continue
		}
		jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
		if err != nil {
			return nil, fmt.Errorf("finding interrupted pipelines: %w", err)
		}
		if len(jobs) > 0 {
			continue
		}
		if err := s.failPipelineWithoutJobs(ctx, pl.ID, interruptedPipelineError); err != nil {
			return nil, err
		}
		s.log.Warn("interrupted pipeline failed", "pipeline_id", pl.ID)
		out[pl.ID] = true
	}
	return out, nil
}

// failPipelineWithoutJobs fails a pipeline whose jobs could not be stored,
// saying why.
func (s *Server) failPipelineWithoutJobs(ctx context.Context, id int64, why string) error {
	now := s.clock.Now().UTC()
	_, err := s.store.UpdatePipeline(ctx, id, store.PipelineUpdate{Status: store.StatusFailed, FinishedAt: now, UpdatedAt: now,
		FailureReason: "unknown_failure", YAMLErrors: why})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("failing pipeline %d: %w", id, err)
	}
	return nil
}
