package pipelines

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dotenv"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Trigger jobs (bridges) and their downstream pipelines, as GitLab's
// Ci::Bridge and Ci::CreateDownstreamPipelineService.
//
// A bridge is a job of its pipeline that is never queued for runners.
// When the engine would make it pending, it becomes running and its
// downstream pipeline is prepared (checked and compiled, which may read
// other projects or fetch remote includes) off the engine, then created
// on it, as CreatePipeline does:
//
//	created/manual/… ──(its turn)──► running ──► create downstream pipeline
//	                                    │  could not: failed (reason below)
//	                                    │  no strategy: success
//	                                    ▼  depend / mirror: follows it
//	        success | failed | canceled (| manual | skipped with mirror)
//
// Every processing of the bridge's pipeline reconciles its running
// bridges (reconcileBridges): one without a downstream pipeline gets one
// (after a crash between the two steps), one with a strategy takes the
// downstream pipeline's status. A downstream pipeline whose status
// changes marks its upstream pipeline, so the bridge follows promptly.

// Failure reasons of bridges, as GitLab names them.
const (
	ReasonDownstreamCreationFailed = "downstream_pipeline_creation_failed"
	ReasonProjectNotFound          = "downstream_bridge_project_not_found"
	ReasonInvalidTrigger           = "invalid_bridge_trigger"
	ReasonMaxDepth                 = "reached_max_descendant_pipelines_depth"
	ReasonHierarchySize            = "reached_max_pipeline_hierarchy_size"
	ReasonLoop                     = "pipeline_loop_detected"
	ReasonDataIntegrity            = "data_integrity_failure"
)

// bridgeReasonText is GitLab's description of each bridge failure reason
// (Gitlab::Ci::Status::Build::Failed::REASONS).
var bridgeReasonText = map[string]string{
	ReasonDownstreamCreationFailed: "downstream pipeline can not be created",
	ReasonProjectNotFound:          "downstream project could not be found",
	ReasonInvalidTrigger:           "downstream pipeline trigger definition is invalid",
	ReasonMaxDepth:                 "reached maximum depth of child pipelines",
	ReasonHierarchySize:            "downstream pipeline tree is too large",
	ReasonLoop:                     "job would create infinitely looping pipelines",
	ReasonDataIntegrity:            "data integrity failure",
}

// maxNestedChildren is how many pipelines a child pipeline may have above
// it in its project (GitLab's MAX_NESTED_CHILDREN): parent → child →
// grandchild, no further.
const maxNestedChildren = 2

// maxArtifactInclude bounds the artifacts archive and the file read for
// include:artifact (GitLab's max_artifacts_content_include_size default).
const maxArtifactInclude = 5 << 20

// downstreamSource is what createPipeline needs for a downstream pipeline.
type downstreamSource struct {
	upstream *store.Pipeline
	bridge   *store.Job
	// config, if set, builds the child configuration's file system from
	// the commit's, and configPath names its root file.
	config     func(commit fs.FS) fs.FS
	configPath string
}

// bridgeError is a bridge that cannot create its downstream pipeline.
type bridgeError struct {
	reason string
	msgs   []string
}

func (e *bridgeError) Error() string { return e.reason + ": " + strings.Join(e.msgs, "; ") }

func bridgeFail(reason string, msgs ...string) error { return &bridgeError{reason: reason, msgs: msgs} }

// bridgeJob builds the stored job of a trigger job.
func (s *Engine) bridgeJob(proj *store.Project, pl *store.Pipeline, cj *ci.Job, base, high []runnerapi.Variable, now time.Time) (*store.Job, error) {
	vars := slices.Clone(base)
	vars = append(vars,
		runnerapi.Variable{Key: "CI_JOB_NAME", Value: cj.Name, Public: true},
		runnerapi.Variable{Key: "CI_JOB_STAGE", Value: cj.Stage, Public: true},
		runnerapi.Variable{Key: "CI_PIPELINE_ID", Value: strconv.FormatInt(pl.ID, 10), Public: true},
		runnerapi.Variable{Key: "CI_PROJECT_ID", Value: strconv.FormatInt(proj.ID, 10), Public: true},
		runnerapi.Variable{Key: "CI_COMMIT_SHA", Value: pl.Sha, Public: true},
		runnerapi.Variable{Key: "CI_COMMIT_REF_NAME", Value: pl.Ref, Public: true},
	)
	vars = append(vars, cj.OwnVariables()...)
	for _, v := range cj.Variables {
		vars = append(vars, runnerapi.Variable{Key: v.Key, Value: v.Value, Raw: v.Raw, Public: true})
	}
	vars = append(vars, high...)
	g := graph.Job{
		StageIndex: cj.StageIndex, DAG: cj.Scheduling == ci.ScheduleDAG, When: string(cj.When),
		AllowFailure: cj.AllowFailure, ResourceGroup: cj.ResourceGroup,
		Bridge:       &graph.Bridge{Trigger: *cj.Trigger, YAMLVariables: cj.Variables, Variables: vars, HighVariables: len(high)},
		Dependencies: cj.Dependencies,
	}
	if cj.Environment != nil {
		g.Environment = cj.Environment.Name
	}
	for _, n := range cj.Needs {
		g.Needs = append(g.Needs, graph.Need{Job: n.Job, Artifacts: n.Artifacts})
	}
	raw, err := json.Marshal(g)
	if err != nil {
		return nil, err
	}
	return &store.Job{
		Status: store.StatusCreated, ProjectID: proj.ID, PipelineID: pl.ID, Name: cj.Name, Stage: cj.Stage,
		Ref: pl.Ref, Protected: pl.Protected, Graph: raw, CreatedAt: now, UpdatedAt: now,
	}, nil
}

// startBridge runs a bridge whose turn has come (from one of its waiting
// statuses): it becomes running and gets its downstream pipeline. Engine
// goroutine only.
func (s *Engine) startBridge(ctx context.Context, j *store.Job, from store.Status, deps []int64) (*store.Job, error) {
	now := s.clock.Now().UTC()
	nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{from},
		store.JobUpdate{Status: store.StatusRunning, Dependencies: deps, StartedAt: now, QueuedAt: now, UpdatedAt: now})
	if err != nil {
		return nil, err
	}
	return s.runBridge(ctx, nj)
}

// DownstreamOf returns a bridge's downstream pipeline, nil if it has none.
func (s *Engine) DownstreamOf(ctx context.Context, bridgeID int64) (*store.Pipeline, error) {
	ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{SourceJobID: bridgeID, Limit: 1})
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	return ps[0], nil
}

// runBridge moves a running bridge on and returns it as stored: one with
// its downstream pipeline follows it; one without gets it prepared in
// the background (once: a bridge being prepared is left alone). Engine
// goroutine only.
func (s *Engine) runBridge(ctx context.Context, j *store.Job) (*store.Job, error) {
	ds, err := s.DownstreamOf(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	if ds != nil {
		return s.followDownstream(ctx, j, ds)
	}
	e := &s.engine
	e.mu.Lock()
	busy := e.bridges[j.ID]
	e.bridges[j.ID] = true
	e.mu.Unlock()
	if !busy {
		s.bg.Add(1)
		go s.prepareBridge(j)
	}
	return j, nil
}

// prepareBridge prepares a bridge's downstream pipeline off the engine,
// then creates it (or fails the bridge) on the engine.
func (s *Engine) prepareBridge(j *store.Job) {
	defer s.bg.Done()
	done := func() {
		s.engine.mu.Lock()
		delete(s.engine.bridges, j.ID)
		s.engine.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	prep, perr := s.prepareDownstream(ctx, j)
	err := s.onEngine(ctx, func(ctx context.Context) error {
		defer done()
		defer s.engine.mark(j.PipelineID)
		cur, err := s.store.GetJob(ctx, j.ID)
		if err != nil {
			return err
		}
		if cur.Status != store.StatusRunning {
			return nil // canceled meanwhile
		}
		if ds, err := s.DownstreamOf(ctx, j.ID); err != nil || ds != nil {
			return err
		}
		if perr == nil {
			// The tree may have grown while this one was prepared.
			perr = s.checkHierarchy(ctx, prep.ds.upstream, prep.req.Source == SourceParentPipeline)
		}
		var ds *store.Pipeline
		if perr == nil {
			ds, perr = s.createPipeline(ctx, prep)
		}
		_, err = s.bridgeCreated(ctx, cur, ds, perr)
		return err
	})
	if err != nil {
		done()
		if ctx.Err() == nil {
			s.log.Error("creating a downstream pipeline", "job_id", j.ID, "err", err)
		}
	}
}

// bridgeCreated records the outcome of creating a bridge's downstream
// pipeline: the bridge follows it, or fails with the reason. Engine
// goroutine only.
func (s *Engine) bridgeCreated(ctx context.Context, j *store.Job, ds *store.Pipeline, err error) (*store.Job, error) {
	var (
		be *bridgeError
		pe *PipelineError
	)
	switch {
	case errors.As(err, &be):
		return s.failBridge(ctx, j, be.reason, be.msgs)
	case errors.As(err, &pe):
		return s.failBridge(ctx, j, ReasonDownstreamCreationFailed, pe.Errors)
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrGitDisabled):
		return s.failBridge(ctx, j, ReasonDownstreamCreationFailed, []string{err.Error()})
	case err != nil && ctx.Err() != nil:
		return nil, err // shutting down: the bridge is resumed later
	case err != nil:
		s.log.Error("creating a downstream pipeline", "job_id", j.ID, "err", err)
		return s.failBridge(ctx, j, ReasonDataIntegrity, []string{err.Error()})
	}
	kind := "multi-project"
	if ds.Source == SourceParentPipeline {
		kind = "child"
	}
	s.logs.AddLine(ctx, j.ID, fmt.Sprintf("Created %s pipeline #%d (%s/api/v4/projects/%d/pipelines/%d), status %s\n",
		kind, ds.ID, s.baseURL(), ds.ProjectID, ds.ID, ds.Status))
	s.log.Info("downstream pipeline created", "job_id", j.ID, "pipeline_id", j.PipelineID, "downstream_pipeline_id", ds.ID, "kind", kind)
	return s.followDownstream(ctx, j, ds)
}

// failBridge fails a bridge with a reason; the messages go to its log.
func (s *Engine) failBridge(ctx context.Context, j *store.Job, reason string, msgs []string) (*store.Job, error) {
	text := "ERROR: " + bridgeReasonText[reason]
	for _, m := range msgs {
		text += "\n  " + m
	}
	s.logs.AddLine(ctx, j.ID, text+"\n")
	now := s.clock.Now().UTC()
	nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusRunning},
		store.JobUpdate{Status: store.StatusFailed, FailureReason: reason, FinishedAt: now, UpdatedAt: now})
	if err != nil {
		return nil, err
	}
	s.log.Info("bridge failed", "job_id", j.ID, "reason", reason, "messages", msgs)
	return nj, nil
}

// bridgeStatus is the status a bridge takes from its downstream pipeline
// (GitLab's Ci::Bridge#inherit_status_from_downstream), "" to keep its
// own.
func bridgeStatus(strategy string, downstream store.Status) store.Status {
	switch strategy {
	case "":
		return store.StatusSuccess
	case "mirror":
		switch downstream {
		case store.StatusSuccess, store.StatusCanceled, store.StatusFailed, store.StatusManual, store.StatusSkipped:
			return downstream
		}
	default: // depend
		switch downstream {
		case store.StatusSuccess, store.StatusCanceled, store.StatusFailed:
			return downstream
		case store.StatusSkipped:
			return store.StatusFailed
		}
	}
	return ""
}

// followDownstream gives a bridge the status its strategy takes from its
// downstream pipeline.
func (s *Engine) followDownstream(ctx context.Context, j *store.Job, ds *store.Pipeline) (*store.Job, error) {
	g := graph.Decode(j.Graph)
	to := bridgeStatus(g.Bridge.Trigger.Strategy, ds.Status)
	if to == "" || to == j.Status {
		return j, nil
	}
	now := s.clock.Now().UTC()
	u := store.JobUpdate{Status: to, UpdatedAt: now}
	if to.Finished() {
		u.FinishedAt = now
	}
	nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusRunning, store.StatusManual}, u)
	if errors.Is(err, store.ErrConflict) {
		return s.store.GetJob(ctx, j.ID)
	}
	if err != nil {
		return nil, err
	}
	if to.Finished() && g.Bridge.Trigger.Strategy != "" {
		s.logs.AddLine(ctx, j.ID, fmt.Sprintf("Downstream pipeline #%d %s\n", ds.ID, ds.Status))
	}
	return nj, nil
}

// reconcileBridges moves the bridges of a pipeline on: a running bridge
// without a downstream pipeline gets one, a bridge with a strategy takes
// its downstream pipeline's status, and the unfinished child pipeline of
// a canceled bridge is canceled. It reports whether a job changed.
// Engine goroutine only.
func (s *Engine) reconcileBridges(ctx context.Context, jobs []*store.Job) (bool, error) {
	changed := false
	for _, j := range jobs {
		// The status first: decoding a graph for every job on every pass
		// would cost a big pipeline more than the rest of the pass.
		if j.Retried || (j.Status != store.StatusRunning && j.Status != store.StatusManual && j.Status != store.StatusCanceled) || !graph.IsBridge(j) {
			continue
		}
		switch j.Status {
		case store.StatusRunning:
			nj, err := s.runBridge(ctx, j)
			if err != nil {
				return changed, err
			}
			changed = changed || nj.Status != j.Status
		case store.StatusManual, store.StatusCanceled:
			ds, err := s.DownstreamOf(ctx, j.ID)
			if err != nil || ds == nil {
				if err != nil {
					return changed, err
				}
				continue
			}
			if j.Status == store.StatusCanceled {
				if ds.Source == SourceParentPipeline && !ds.Status.Finished() {
					if _, err := s.cancelPipeline(ctx, ds.ID); err != nil {
						return changed, err
					}
				}
				continue
			}
			nj, err := s.followDownstream(ctx, j, ds)
			if err != nil {
				return changed, err
			}
			changed = changed || nj.Status != j.Status
		}
	}
	return changed, nil
}

// prepareDownstream checks and compiles the downstream pipeline of a
// running bridge. A *bridgeError or *PipelineError says why it cannot be
// created. It reads the store but changes nothing: it runs off the
// engine.
func (s *Engine) prepareDownstream(ctx context.Context, j *store.Job) (*preparedPipeline, error) {
	g := graph.Decode(j.Graph)
	b := g.Bridge
	up, err := s.store.GetPipeline(ctx, j.PipelineID)
	if err != nil {
		return nil, err
	}
	proj, err := s.store.GetProject(ctx, j.ProjectID)
	if err != nil {
		return nil, err
	}
	// The dependencies' dotenv variables: the bridge sees them as a job
	// would, before its project's and pipeline's variables.
	denv, err := s.dependencyDotenv(ctx, j)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	for _, v := range dotenv.Insert(slices.Clone(b.Variables), b.HighVariables, denv) {
		vars[v.Key] = v.Value
	}
	vars["CI_JOB_ID"] = strconv.FormatInt(j.ID, 10)
	if !b.Trigger.Child() {
		// Protected project variables stay in their project (GitLab's
		// exclude_protected_variables_from_multi_project_pipeline_triggers):
		// they expand nothing that goes to another one.
		pvs, err := s.store.ListVariables(ctx, proj.ID)
		if err != nil {
			return nil, err
		}
		for _, v := range pvs {
			if v.Protected {
				delete(vars, v.Key)
			}
		}
	}
	if err := s.checkHierarchy(ctx, up, b.Trigger.Child()); err != nil {
		return nil, err
	}

	// What the downstream pipeline gets: the bridge's YAML variables
	// (expanded with what the bridge sees), then its dependencies' dotenv
	// variables (expanded too) and the upstream pipeline's variables;
	// later ones win (GitLab's Downstream::Generator).
	var dvars []PipelineVariable
	if b.Trigger.ForwardYAMLVariables {
		for _, v := range b.YAMLVariables {
			val := v.Value
			if !v.Raw {
				val = ci.ExpandVariables(val, vars)
			}
			dvars = append(dvars, PipelineVariable{Key: v.Key, Value: val})
		}
	}
	if b.Trigger.ForwardPipelineVariables {
		for _, v := range denv {
			dvars = append(dvars, PipelineVariable{Key: v.Key, Value: ci.ExpandVariables(v.Value, vars)})
		}
		for _, v := range up.Variables {
			dvars = append(dvars, requestVariable(v))
		}
	}
	dvars = lastByKey(dvars)
	src := &downstreamSource{upstream: up, bridge: j}

	req := PipelineRequest{Variables: dvars}
	if b.Trigger.Child() {
		req.ProjectID, req.Sha, req.BeforeSha, req.Source = proj.ID, up.Sha, up.BeforeSha, SourceParentPipeline
		req.Ref = "refs/heads/" + up.Ref
		if up.Tag {
			req.Ref = "refs/tags/" + up.Ref
		}
		if err := s.childConfig(ctx, j, up, b.Trigger.Include, src); err != nil {
			return nil, err
		}
	} else {
		target := strings.TrimSpace(ci.ExpandVariables(b.Trigger.Project, vars))
		dp, err := s.store.ProjectByPath(ctx, strings.Trim(target, "/"))
		if errors.Is(err, store.ErrNotFound) {
			return nil, bridgeFail(ReasonProjectNotFound, fmt.Sprintf("project %q does not exist", target))
		}
		if err != nil {
			return nil, err
		}
		if dp.ID == proj.ID {
			return nil, bridgeFail(ReasonInvalidTrigger, "a multi-project trigger cannot target its own project; use trigger:include for a child pipeline")
		}
		if err := s.checkLoop(ctx, up); err != nil {
			return nil, err
		}
		req.ProjectID, req.Source, req.Inputs = dp.ID, SourcePipeline, b.Trigger.Inputs
		req.Ref = ci.ExpandVariables(b.Trigger.Branch, vars)
		if req.Ref == "" {
			req.Ref = dp.DefaultBranch
		}
	}
	prep, err := s.preparePipeline(ctx, req, src)
	if err != nil {
		return nil, err
	}
	if prep.configErrors != nil { // only pushes keep them; a bridge's source is not one
		return nil, &PipelineError{Errors: prep.configErrors}
	}
	return prep, nil
}

// lastByKey keeps the last variable of each key, in the order of first
// appearance.
func lastByKey(vs []PipelineVariable) []PipelineVariable {
	idx := map[string]int{}
	var out []PipelineVariable
	for _, v := range vs {
		if i, ok := idx[v.Key]; ok {
			out[i] = v
			continue
		}
		idx[v.Key] = len(out)
		out = append(out, v)
	}
	return out
}

// checkHierarchy enforces GitLab's limits before a downstream pipeline is
// added under up: a child pipeline at most maxNestedChildren levels below
// the top of its project's chain, and at most MaxPipelineHierarchySize
// pipelines in the whole tree.
func (s *Engine) checkHierarchy(ctx context.Context, up *store.Pipeline, child bool) error {
	if child {
		n, cur := 1, up
		for cur.Source == SourceParentPipeline && cur.UpstreamPipelineID != 0 {
			next, err := s.store.GetPipeline(ctx, cur.UpstreamPipelineID)
			if err != nil {
				return err
			}
			n, cur = n+1, next
		}
		if n > maxNestedChildren {
			return bridgeFail(ReasonMaxDepth, fmt.Sprintf("child pipelines can be nested %d levels deep at most", maxNestedChildren))
		}
	}
	root := up
	for root.UpstreamPipelineID != 0 {
		next, err := s.store.GetPipeline(ctx, root.UpstreamPipelineID)
		if err != nil {
			return err
		}
		root = next
	}
	count, queue := 1, []int64{root.ID}
	for len(queue) > 0 && count < s.cfg.MaxPipelineHierarchySize {
		ps, err := s.store.ListPipelines(ctx, store.PipelineFilter{UpstreamPipelineID: queue[0]})
		if err != nil {
			return err
		}
		queue = queue[1:]
		for _, p := range ps {
			count++
			queue = append(queue, p.ID)
		}
	}
	if count >= s.cfg.MaxPipelineHierarchySize {
		return bridgeFail(ReasonHierarchySize, fmt.Sprintf("the pipeline tree holds %d pipelines, the limit is %d", count, s.cfg.MaxPipelineHierarchySize))
	}
	return nil
}

// checkLoop refuses a multi-project pipeline whose upstream chain already
// ran the same (project, ref, source) more than twice (GitLab's
// has_cyclic_dependency?, which allows one cycle: A → B → A → B).
func (s *Engine) checkLoop(ctx context.Context, up *store.Pipeline) error {
	seen := map[string]int{}
	for cur := up; ; {
		if cur.Source != SourceParentPipeline {
			k := fmt.Sprintf("%d\x00%s\x00%s", cur.ProjectID, cur.Ref, cur.Source)
			seen[k]++
			if seen[k] > 2 {
				return bridgeFail(ReasonLoop, "the upstream pipelines already ran this project and ref twice")
			}
		}
		if cur.UpstreamPipelineID == 0 {
			return nil
		}
		next, err := s.store.GetPipeline(ctx, cur.UpstreamPipelineID)
		if err != nil {
			return err
		}
		cur = next
	}
}

// childConfig sets the configuration of a child pipeline on src: the
// commit's files, plus a generated root file whose include: holds the
// trigger's entries as written, and the files of include:artifact taken
// from the named jobs' artifacts archives, included locally. Any include
// kind the compiler knows works in a child pipeline the same way.
func (s *Engine) childConfig(ctx context.Context, j *store.Job, up *store.Pipeline, incs []ci.TriggerInclude, src *downstreamSource) error {
	extra := map[string][]byte{}
	var entries []string
	var jobs []*store.Job
	for _, inc := range incs {
		entry := inc.Entry
		if inc.Artifact != "" {
			if jobs == nil {
				var err error
				if jobs, err = s.store.ListJobs(ctx, store.JobFilter{PipelineID: up.ID}); err != nil {
					return err
				}
			}
			name, data, err := s.artifactInclude(ctx, latestByName(jobs)[inc.Job], inc)
			if err != nil {
				return err
			}
			extra[name] = data
			entry = map[string]any{"local": name}
		}
		b, err := json.Marshal(entry)
		if err != nil {
			return err
		}
		entries = append(entries, "  "+string(b))
	}
	root := fmt.Sprintf(".berth/trigger/%d.yml", j.ID)
	// JSON is YAML: one entry a line, so errors name the entry's line.
	extra[root] = []byte("{\"include\": [\n" + strings.Join(entries, ",\n") + "\n]}\n")
	src.configPath = root
	src.config = func(commit fs.FS) fs.FS { return &overlayFS{base: commit, files: extra} }
	return nil
}

// artifactInclude reads an include:artifact file from a job's artifacts
// archive and returns the local path it takes in the child configuration.
func (s *Engine) artifactInclude(ctx context.Context, job *store.Job, inc ci.TriggerInclude) (string, []byte, error) {
	notFound := bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("Job `%s` not found in parent pipeline or does not have artifacts!", inc.Job))
	if job == nil || graph.IsBridge(job) {
		return "", nil, notFound
	}
	arts, err := s.store.ListArtifacts(ctx, job.ID)
	if err != nil {
		return "", nil, err
	}
	var archive *store.Artifact
	for _, a := range arts {
		if a.Type == "archive" {
			archive = a
		}
	}
	if archive == nil {
		return "", nil, notFound
	}
	if archive.Size > maxArtifactInclude {
		return "", nil, bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("Artifacts archive for job `%s` is too large: max %d bytes", inc.Job, maxArtifactInclude))
	}
	rc, _, err := s.artifacts.Open(ctx, archive.StorageKey)
	if err != nil {
		return "", nil, err
	}
	defer rc.Close()
	zipped, err := io.ReadAll(io.LimitReader(rc, maxArtifactInclude+1))
	if err != nil {
		return "", nil, err
	}
	zr, err := zip.NewReader(bytes.NewReader(zipped), int64(len(zipped)))
	if err != nil {
		return "", nil, bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("Artifacts archive for job `%s` is not a zip archive", inc.Job))
	}
	want := path.Clean(strings.TrimPrefix(inc.Artifact, "/"))
	for _, f := range zr.File {
		if path.Clean(f.Name) != want || f.FileInfo().IsDir() {
			continue
		}
		if f.UncompressedSize64 > maxArtifactInclude {
			return "", nil, bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("File `%s` in the `%s` artifacts archive is too large", want, inc.Job))
		}
		r, err := f.Open()
		if err != nil {
			return "", nil, err
		}
		data, err := io.ReadAll(io.LimitReader(r, maxArtifactInclude))
		r.Close()
		if err != nil {
			return "", nil, err
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return "", nil, bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("File `%s` is empty!", want))
		}
		name := fmt.Sprintf(".berth/artifacts/%d/%s", job.ID, want)
		if ext := path.Ext(name); ext != ".yml" && ext != ".yaml" {
			name += ".yml"
		}
		return name, data, nil
	}
	return "", nil, bridgeFail(ReasonDownstreamCreationFailed, fmt.Sprintf("Path `%s` does not exist inside the `%s` artifacts archive!", want, inc.Job))
}

// overlayFS is a commit's files plus generated ones (a child pipeline's
// root file and its artifact includes); the generated ones win.
type overlayFS struct {
	base  fs.FS
	files map[string][]byte
}

func (o *overlayFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if data, ok := o.files[name]; ok {
		return &memFile{name: path.Base(name), r: bytes.NewReader(data), size: int64(len(data))}, nil
	}
	return o.base.Open(name)
}

// memFile is one generated file.
type memFile struct {
	name string
	r    *bytes.Reader
	size int64
}

func (f *memFile) Stat() (fs.FileInfo, error) { return memInfo{f.name, f.size}, nil }
func (f *memFile) Read(b []byte) (int, error) { return f.r.Read(b) }
func (f *memFile) Close() error               { return nil }

type memInfo struct {
	name string
	size int64
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o444 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }

// DownstreamPipelines returns the pipelines the bridges of a pipeline
// created (retried bridges' too), ordered by id.
func (s *Engine) DownstreamPipelines(ctx context.Context, pipelineID int64) ([]*store.Pipeline, error) {
	return s.store.ListPipelines(ctx, store.PipelineFilter{UpstreamPipelineID: pipelineID})
}

// cancelBridge cancels a bridge that has not finished: no runner holds it,
// so it is canceled at once; its child pipeline is canceled by the engine
// (reconcileBridges). Manual bridges are left, as manual jobs are.
func (s *Engine) cancelBridge(ctx context.Context, j *store.Job) (*store.Job, error) {
	switch j.Status {
	case store.StatusCreated, store.StatusScheduled, store.StatusWaitingForResource, store.StatusPending, store.StatusRunning:
	default:
		return j, nil
	}
	now := s.clock.Now().UTC()
	nj, err := s.store.TransitionJob(ctx, j.ID, []store.Status{j.Status},
		store.JobUpdate{Status: store.StatusCanceled, FinishedAt: now, UpdatedAt: now})
	if errors.Is(err, store.ErrConflict) {
		return s.store.GetJob(ctx, j.ID)
	}
	if err != nil {
		return nil, err
	}
	s.JobChanged(nj)
	return nj, nil
}

// dependencyDotenv reads the dotenv variables of a bridge's dependencies
// (GitLab's Ci::Processable#dependency_variables).
func (s *Engine) dependencyDotenv(ctx context.Context, j *store.Job) ([]runnerapi.Variable, error) {
	arts, err := store.ArtifactsOf(ctx, s.store, j.Dependencies)
	if err != nil {
		return nil, fmt.Errorf("dependencies of trigger job %d: %w", j.ID, err)
	}
	return dotenv.Variables(ctx, s.artifacts, s.log, arts, j.Dependencies, s.clock.Now())
}
