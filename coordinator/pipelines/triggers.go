package pipelines

import (
	"context"
	"errors"
	"fmt"

	"github.com/berthci/berth/coordinator/store"
)

// Pipelines asked for through the trigger API (POST
// /projects/:id/trigger/pipeline): with a trigger token, as the token's
// owner, source trigger; with a running job's CI_JOB_TOKEN, as the job's
// downstream pipeline, source pipeline (GitLab's
// Ci::PipelineTriggerService).

// SourceTrigger is CI_PIPELINE_SOURCE of a pipeline a trigger token made.
const SourceTrigger = "trigger"

// TriggerRequest is what the trigger API asks for.
type TriggerRequest struct {
	ProjectID int64
	Ref       string
	Variables []PipelineVariable
	Inputs    map[string]any
	// Payload is TRIGGER_PAYLOAD, a file variable: the request's
	// parameters but the token, as JSON.
	Payload string
}

func (req TriggerRequest) pipelineRequest(source string) PipelineRequest {
	vars := append([]PipelineVariable(nil), req.Variables...)
	if req.Payload != "" {
		vars = append(vars, PipelineVariable{Key: "TRIGGER_PAYLOAD", Value: req.Payload, VariableType: "file", Raw: true})
	}
	return PipelineRequest{ProjectID: req.ProjectID, Ref: req.Ref, Source: source, Variables: vars, Inputs: req.Inputs}
}

// TriggerWithToken creates the pipeline a trigger token asks for, with
// its owner's access (a *PipelineError, GitLab's words, when the owner
// is gone or may not run pipelines on the ref), and records the token's
// use.
func (s *Engine) TriggerWithToken(ctx context.Context, t *store.PipelineTrigger, req TriggerRequest) (*store.Pipeline, error) {
	ok, why, err := s.OwnerMayRun(ctx, t.OwnerID, t.ProjectID, req.Ref)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &PipelineError{Errors: []string{"Insufficient permissions to create a new pipeline: " + why}}
	}
	pl, err := s.CreatePipeline(ctx, req.pipelineRequest(SourceTrigger))
	if err != nil {
		return nil, err
	}
	if err := s.store.TouchPipelineTrigger(ctx, t.ID, s.clock.Now().UTC()); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("recording a trigger token's use", "trigger_id", t.ID, "err", err)
	}
	return pl, nil
}

// TriggerFromJob creates the pipeline a running job asks for with its
// CI_JOB_TOKEN, in a project the job token reaches (its own, public ones,
// those of its top-level group; ErrNotFound otherwise): a downstream
// pipeline of the job's (source pipeline), linked to it as a
// multi-project trigger job's is, so that the same loop rule applies.
func (s *Engine) TriggerFromJob(ctx context.Context, j *store.Job, req TriggerRequest) (*store.Pipeline, error) {
	from, err := s.store.GetProject(ctx, j.ProjectID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	to, err := s.store.GetProject(ctx, req.ProjectID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if from == nil || to == nil || !mayInclude(from, to) {
		// The job token's reach in the API: its own project, public
		// ones and those of its top-level group (needs:project's rule).
		return nil, fmt.Errorf("project %d for a job of project %d: %w", req.ProjectID, j.ProjectID, ErrNotFound)
	}
	up, err := s.store.GetPipeline(ctx, j.PipelineID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("pipeline of job %d: %w", j.ID, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var be *bridgeError
	if err := s.checkLoop(ctx, up); errors.As(err, &be) {
		return nil, &PipelineError{Errors: be.msgs}
	} else if err != nil {
		return nil, err
	}
	return s.create(ctx, req.pipelineRequest(SourcePipeline), &downstreamSource{upstream: up, bridge: j})
}

// OwnerMayRun reports whether a user may still create pipelines of a
// project on ref: the admin token (owner 0) always may; else the user
// must exist and be a developer, a maintainer on a protected ref. why
// says what is missing.
func (s *Engine) OwnerMayRun(ctx context.Context, ownerID, projectID int64, ref string) (ok bool, why string, err error) {
	if ownerID == 0 {
		return true, "", nil
	}
	u, err := s.store.GetUser(ctx, ownerID)
	if errors.Is(err, store.ErrNotFound) {
		return false, fmt.Sprintf("its owner (user %d) no longer exists", ownerID), nil
	}
	if err != nil {
		return false, "", err
	}
	proj, err := s.store.GetProject(ctx, projectID)
	if err != nil {
		return false, "", err
	}
	level, err := store.AccessOf(ctx, s.store, u, projectID)
	if err != nil {
		return false, "", err
	}
	if need := proj.RunAccess(ref); level < need {
		return false, fmt.Sprintf("its owner %s may not run pipelines on %s (access level %d, needs %d)", u.Name, ref, level, need), nil
	}
	return true, "", nil
}
