package pipelines

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
)

// Needs outside the pipeline (needs:pipeline, needs:project): the job
// downloads the artifacts of a job of another pipeline of its parent-child
// hierarchy, or of another project's latest successful pipeline of a ref.
// They do not order anything: they are resolved when the job is queued,
// to the job ids its payload lists as dependencies; one that cannot be
// resolved fails the job with missing_dependency_failure, as GitLab does
// when a dependency's artifacts are missing.

// crossNeedsOf expands a job's cross needs.
func crossNeedsOf(cns []ci.CrossNeed, vars map[string]string) []graph.CrossNeed {
	var out []graph.CrossNeed
	for _, cn := range cns {
		g := graph.CrossNeed{Job: dispatch.ExpandString(cn.Job, vars), Artifacts: cn.Artifacts}
		if cn.Pipeline != "" {
			g.OnPipeline, g.Pipeline = true, strings.TrimSpace(dispatch.ExpandString(cn.Pipeline, vars))
		} else {
			g.Project = strings.Trim(dispatch.ExpandString(cn.Project, vars), "/")
			g.Ref = dispatch.ExpandString(cn.Ref, vars)
		}
		out = append(out, g)
	}
	return out
}

// errMissingDependency: a cross need names nothing the job may read.
var errMissingDependency = errors.New("missing dependency")

// resolveCrossNeeds returns the ids of the jobs whose artifacts j's cross
// needs name (those with artifacts: true).
func (s *Engine) resolveCrossNeeds(ctx context.Context, j *store.Job, needs []graph.CrossNeed) ([]int64, error) {
	var ids []int64
	for _, n := range needs {
		var (
			dep *store.Job
			err error
		)
		if n.OnPipeline {
			dep, err = s.hierarchyJob(ctx, j, n)
		} else {
			dep, err = s.otherProjectJob(ctx, j, n)
		}
		if err != nil {
			return nil, err
		}
		if n.Artifacts {
			ids = append(ids, dep.ID)
		}
	}
	return ids, nil
}

// hierarchyJob finds the latest job named n.Job of pipeline n.Pipeline,
// which must belong to the same parent-child hierarchy as j's pipeline
// (same project, same root pipeline through parent_pipeline links).
func (s *Engine) hierarchyJob(ctx context.Context, j *store.Job, n graph.CrossNeed) (*store.Job, error) {
	id, err := strconv.ParseInt(n.Pipeline, 10, 64)
	if err != nil || id <= 0 {
		return nil, fmt.Errorf("%w: needs:pipeline is %q, not a pipeline id (pass it from the parent, e.g. PARENT_PIPELINE_ID: $CI_PIPELINE_ID in the trigger job's variables)", errMissingDependency, n.Pipeline)
	}
	missing := fmt.Errorf("%w: job %q of pipeline %d (needs:pipeline) is not in this pipeline's hierarchy or has not succeeded", errMissingDependency, n.Job, id)
	target, err := s.store.GetPipeline(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, missing
	}
	if err != nil {
		return nil, err
	}
	mine, err := s.store.GetPipeline(ctx, j.PipelineID)
	if err != nil {
		return nil, err
	}
	r1, err := s.hierarchyRoot(ctx, mine)
	if err != nil {
		return nil, err
	}
	r2, err := s.hierarchyRoot(ctx, target)
	if err != nil {
		return nil, err
	}
	if r1 != r2 || target.ProjectID != j.ProjectID {
		return nil, missing
	}
	return s.succeededJob(ctx, target.ID, n.Job, missing)
}

// hierarchyRoot follows parent_pipeline links up to the root pipeline of
// a parent-child hierarchy (bounded: GitLab nests at most 2 levels).
func (s *Engine) hierarchyRoot(ctx context.Context, p *store.Pipeline) (int64, error) {
	for range 10 {
		if p.UpstreamPipelineID == 0 || p.Source != SourceParentPipeline {
			return p.ID, nil
		}
		up, err := s.store.GetPipeline(ctx, p.UpstreamPipelineID)
		if errors.Is(err, store.ErrNotFound) {
			return p.ID, nil
		}
		if err != nil {
			return 0, err
		}
		p = up
	}
	return p.ID, nil
}

// otherProjectJob finds the job named n.Job of the newest pipeline of project
// n.Project on n.Ref that has it succeeded, in a project j's project may
// read (the include:project access rule).
func (s *Engine) otherProjectJob(ctx context.Context, j *store.Job, n graph.CrossNeed) (*store.Job, error) {
	missing := fmt.Errorf("%w: no successful job %q on %s of project %s (needs:project)", errMissingDependency, n.Job, n.Ref, n.Project)
	to, err := s.store.ProjectByPath(ctx, n.Project)
	if errors.Is(err, store.ErrNotFound) {
		return nil, missing
	}
	if err != nil {
		return nil, err
	}
	dep, err := s.LatestSucceededJob(ctx, j.ProjectID, to, n.Ref, n.Job)
	if err == nil && dep == nil {
		return nil, missing
	}
	return dep, err
}

// LatestSucceededJob is the job named name of the newest pipeline of
// project to on ref that has it succeeded, if project fromID may read to
// (the include:project access rule); nil when there is none or it may
// not. It is what needs:project and the job token's download of a ref's
// latest artifacts find.
func (s *Engine) LatestSucceededJob(ctx context.Context, fromID int64, to *store.Project, ref, name string) (*store.Job, error) {
	from, err := s.store.GetProject(ctx, fromID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !mayInclude(from, to) {
		return nil, nil
	}
	const page = 50
	for off := 0; off < 1000; off += page {
		ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{ProjectID: to.ID, Ref: ref, Newest: true, Limit: page, Offset: off})
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if dep, err := s.succeededJob(ctx, p.ID, name, errMissingDependency); err == nil {
				return dep, nil
			} else if !errors.Is(err, errMissingDependency) {
				return nil, err
			}
		}
		if len(ps) < page {
			break
		}
	}
	return nil, nil
}

// succeededJob is the latest successful job named name of a pipeline.
func (s *Engine) succeededJob(ctx context.Context, pipelineID int64, name string, missing error) (*store.Job, error) {
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: pipelineID})
	if err != nil {
		return nil, err
	}
	var found *store.Job
	for _, x := range jobs {
		if x.Name == name && x.Status == store.StatusSuccess && (found == nil || x.ID > found.ID) {
			found = x
		}
	}
	if found == nil {
		return nil, missing
	}
	return found, nil
}

// failUnqueued fails a pipeline job that was about to be queued (from is
// its current status), with the reason in its log, and has the engine
// look at its pipeline again.
func (s *Engine) failUnqueued(ctx context.Context, j *store.Job, from store.Status, reason, msg string) (*store.Job, error) {
	now := s.clock.Now().UTC()
	nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{from},
		store.JobUpdate{Status: store.StatusFailed, FailureReason: reason, FinishedAt: now, UpdatedAt: now})
	if err != nil {
		return nil, err
	}
	s.logs.AddLine(ctx, nj.ID, "ERROR: Job failed: "+msg+"\n")
	s.log.Info("job failed before it was queued", "job_id", j.ID, "reason", reason, "message", msg)
	s.engine.mark(j.PipelineID)
	return nj, nil
}
