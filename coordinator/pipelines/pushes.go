package pipelines

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// Pipelines from pushes. Git hosting (coordinator/githost) receives a
// push, journals it and finds the refs it created or moved; it hands each
// to PushPipeline, and at start hands those of the journals a crash left
// to ReplayPushes. What a push means for pipelines is decided here.

// interruptedPipelineError is the YAML error of a pipeline a crash left
// without jobs.
const interruptedPipelineError = "pipeline creation was interrupted: the coordinator stopped before the pipeline's jobs were stored (a pushed commit gets a new pipeline on restart; otherwise create it again)"

// PushPipeline creates the pipeline of one pushed ref if its commit has a
// CI configuration. It returns an error only when the pipeline should
// exist but could not be created (a retry may succeed); a commit without
// configuration, or one the workflow filters out, is no error.
func (s *Engine) PushPipeline(ctx context.Context, p *store.Project, repo *gitrepo.Repo, u githost.RefUpdate) error {
	fsys, err := repo.FS(ctx, u.New)
	if err != nil {
		return fmt.Errorf("reading pushed commit %s: %w", dispatch.ShortSha(u.New), err)
	}
	if _, err := fs.Stat(fsys, ciConfigPath); err != nil {
		s.log.Info("pushed commit has no CI configuration: no pipeline", "project_id", p.ID, "ref", u.Ref)
		return nil
	}
	before := u.Old
	if !strings.HasPrefix(u.Ref, "refs/heads/") {
		before = gitrepo.ZeroSha
	}
	pl, err := s.CreatePipeline(ctx, PipelineRequest{ProjectID: p.ID, Ref: u.Ref, Sha: u.New, BeforeSha: before, Source: SourcePush,
		StoreConfigErrors: true})
	var perr *PipelineError
	if errors.As(err, &perr) {
		s.log.Info("push: no pipeline", "project_id", p.ID, "ref", u.Ref, "why", err)
		return nil
	}
	if err != nil {
		return err
	}
	s.log.Info("push: pipeline created", "project_id", p.ID, "ref", u.Ref, "pipeline_id", pl.ID, "status", pl.Status)
	return nil
}

// ReplayPushes replays every push journal: each update whose ref still
// points at its pushed commit and has no pipeline (other than one in
// interrupted, failed at this start) gets one.
func (s *Engine) ReplayPushes(ctx context.Context, interrupted map[int64]bool) error {
	return s.git.ReplayPushes(ctx, func(ctx context.Context, p *store.Project, repo *gitrepo.Repo, u githost.RefUpdate) error {
		ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{ProjectID: p.ID, Sha: u.New})
		if err != nil {
			return err
		}
		for _, pl := range ps {
			if pl.Source == SourcePush && !interrupted[pl.ID] {
				return nil // done
			}
		}
		s.log.Info("push recovered after a restart: creating its pipeline", "project_id", p.ID, "ref", u.Ref, "sha", dispatch.ShortSha(u.New))
		return s.PushPipeline(ctx, p, repo, u)
	})
}

// FailInterrupted fails every pipeline still "created" with no
// jobs (created before before, unless that is zero): a crash stopped its
// creation between the two writes. It returns their ids.
func (s *Engine) FailInterrupted(ctx context.Context, before time.Time) (map[int64]bool, error) {
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
func (s *Engine) failPipelineWithoutJobs(ctx context.Context, id int64, why string) error {
	now := s.clock.Now().UTC()
	_, err := s.store.UpdatePipeline(ctx, id, store.PipelineUpdate{Status: store.StatusFailed, FinishedAt: now, UpdatedAt: now,
		FailureReason: "unknown_failure", YAMLErrors: why})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("failing pipeline %d: %w", id, err)
	}
	return nil
}
