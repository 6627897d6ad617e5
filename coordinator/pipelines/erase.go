package pipelines

import (
	"context"
	"fmt"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
)

// EraseJob erases a finished job's data, as GitLab's POST
// /projects/:id/jobs/:job_id/erase: every artifact of the job, its VM
// snapshot included (object and record), then its log, archived or not,
// and records the time as the job's ErasedAt. It returns the job.
//
// ErrNotAllowed, and nothing erased, for a job that is not finished or
// has neither artifacts nor log left (GitLab's Ci::Build#erasable?, so a
// second erase is refused). A failure part way leaves what was not yet
// erased, and the job still erasable: erasing it again finishes.
func (s *Engine) EraseJob(ctx context.Context, id int64) (*store.Job, error) {
	j, err := s.loadJob(ctx, id)
	if err != nil {
		return nil, err
	}
	if !j.Status.Finished() {
		return nil, fmt.Errorf("job %d is %s, not finished: %w", id, j.Status, ErrNotAllowed)
	}
	arts, err := s.store.ListArtifacts(ctx, id)
	if err != nil {
		return nil, err
	}
	ti, err := s.store.TraceInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(arts) == 0 && ti.Size == 0 {
		return nil, fmt.Errorf("job %d has no artifacts or log left to erase: %w", id, ErrNotAllowed)
	}
	if err := artifacts.DeleteRecorded(ctx, s.store, s.artifacts, arts); err != nil {
		return nil, fmt.Errorf("erasing the artifacts of job %d: %w", id, err)
	}
	// An archived log is brought back and its object deleted first.
	if err := s.logs.Reset(ctx, id); err != nil {
		return nil, fmt.Errorf("erasing the log of job %d: %w", id, err)
	}
	out, err := s.store.TransitionJob(ctx, id, []store.Status{j.Status},
		store.JobUpdate{Status: j.Status, ErasedAt: s.clock.Now().UTC()})
	if err != nil {
		return nil, fmt.Errorf("recording the erase of job %d: %w", id, err)
	}
	s.log.Info("job erased", "job_id", id, "artifacts", len(arts), "log_bytes", ti.Size)
	return out, nil
}

// DeleteJobArtifacts deletes every artifact of a job, its VM snapshot
// included (object and record), whatever the job's status, as GitLab's
// DELETE /projects/:id/jobs/:job_id/artifacts; the log stays. A job
// without artifacts is no error; an artifact a running job uploads
// afterwards is kept.
func (s *Engine) DeleteJobArtifacts(ctx context.Context, id int64) error {
	if _, err := s.loadJob(ctx, id); err != nil {
		return err
	}
	arts, err := s.store.ListArtifacts(ctx, id)
	if err != nil {
		return err
	}
	if err := artifacts.DeleteRecorded(ctx, s.store, s.artifacts, arts); err != nil {
		return fmt.Errorf("deleting the artifacts of job %d: %w", id, err)
	}
	if len(arts) > 0 {
		s.log.Info("job artifacts deleted", "job_id", id, "artifacts", len(arts))
	}
	return nil
}

// DeletePipeline deletes a pipeline, as GitLab's DELETE
// /projects/:id/pipelines/:pipeline_id: a pipeline still running is
// canceled first (its running jobs' runners learn it at their next
// update, then find the job gone), then every object of its jobs —
// artifacts, VM snapshots, archived logs — leaves the artifact storage,
// and the pipeline and its jobs the store, with their logs and
// deployments. Pages deployments made by its jobs stay published, and
// its child pipelines stay (as in GitLab). A failure part way leaves the
// pipeline, with what was not yet deleted: deleting it again finishes.
func (s *Engine) DeletePipeline(ctx context.Context, id int64) error {
	return s.onEngine(ctx, func(ctx context.Context) error {
		st, err := s.PipelineState(ctx, id)
		if err != nil {
			return err
		}
		pl := st.Pipeline
		if !pl.Status.Finished() {
			if _, err := s.cancelPipeline(ctx, id); err != nil {
				return fmt.Errorf("canceling pipeline %d before its deletion: %w", id, err)
			}
		}
		// Canceling changes the jobs' statuses, not which jobs there are.
		jobs := st.Jobs
		objects := 0
		for _, j := range jobs {
			arts, err := s.store.ListArtifacts(ctx, j.ID)
			if err != nil {
				return err
			}
			if err := artifacts.DeleteRecorded(ctx, s.store, s.artifacts, arts); err != nil {
				return fmt.Errorf("deleting pipeline %d: %w", id, err)
			}
			if err := s.logs.DeleteArchive(ctx, j.ID); err != nil {
				return fmt.Errorf("deleting pipeline %d: %w", id, err)
			}
			objects += len(arts)
		}
		if err := s.store.DeletePipeline(ctx, id); err != nil {
			return err
		}
		s.log.Info("pipeline deleted", "pipeline_id", id, "project_id", pl.ProjectID, "jobs", len(jobs), "artifacts", objects)
		return nil
	})
}
