package pipelines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// PipelineError is a pipeline that could not be created from its
// configuration (invalid YAML, filtered out by workflow rules, unknown
// ref): the messages are GitLab's "base" errors.
type PipelineError struct {
	Errors []string
}

func (e *PipelineError) Error() string { return strings.Join(e.Errors, "; ") }

// Sources lists GitLab's CI_PIPELINE_SOURCE values; berth run may
// pretend any of them (--source), for rules that test it.
var Sources = []string{"push", "web", "api", "schedule", "trigger", "pipeline", "parent_pipeline", "merge_request_event",
	"external_pull_request_event", "external", "chat", "webide", "ondemand_dast_scan", "ondemand_dast_validation",
	"security_orchestration_policy", "container_registry_push", "duo_workflow", "pipeline_execution_policy_schedule"}

// Pipeline sources, as CI_PIPELINE_SOURCE names them.
const (
	SourcePush = "push"
	SourceAPI  = "api"
	SourceWeb  = "web"
	// SourceParentPipeline is a child pipeline's, SourcePipeline a
	// multi-project downstream pipeline's (trigger jobs).
	SourceParentPipeline = "parent_pipeline"
	SourcePipeline       = "pipeline"
)

// PipelineRequest asks for a pipeline.
type PipelineRequest struct {
	ProjectID int64
	// Ref is a branch or tag name, or a full refs/heads/… or refs/tags/…
	// name. A plain name is a branch if the branch exists, else a tag.
	Ref string
	// Sha is the commit (default: the ref's); BeforeSha the commit the
	// ref pointed to before a push (default: none).
	Sha, BeforeSha string
	// Source is CI_PIPELINE_SOURCE (default api).
	Source string
	// Variables are pipeline variables (the API's variables): highest
	// precedence.
	Variables []PipelineVariable
	// Inputs are the pipeline's inputs, for a spec:inputs header of the
	// configuration (ci.Env.Inputs).
	Inputs map[string]any
	// Jobs, if set, keeps only these jobs (by name, or by the name before
	// parallel expansion) and, transitively, the jobs they need or take
	// artifacts from (berth run JOB...). Berth only.
	Jobs []string
	// StoreConfigErrors stores a pipeline whose configuration is invalid
	// as failed, with the errors as its yaml_errors, instead of returning
	// them as a *PipelineError: what pushes and schedules get, which
	// nobody waits on (GitLab's save_on_errors), and berth run, which
	// shows them.
	StoreConfigErrors bool
	// scheduleDescription is the description of the schedule that runs
	// the pipeline (CI_PIPELINE_SCHEDULE_DESCRIPTION).
	scheduleDescription string
}

// PipelineVariable is a variable given when creating a pipeline.
type PipelineVariable struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	// VariableType is env_var (default) or file.
	VariableType string `json:"variable_type,omitempty"`
	// Raw: the value is not expanded, neither by the runner nor when
	// forwarded downstream.
	Raw bool `json:"raw,omitempty"`
}

// requestVariable asks for a stored pipeline variable again (a
// schedule's, an upstream pipeline's forwarded).
func requestVariable(v store.PipelineVariable) PipelineVariable {
	pv := PipelineVariable{Key: v.Key, Value: v.Value, Raw: v.Raw}
	if v.File {
		pv.VariableType = "file"
	}
	return pv
}

// ciConfigPath is where the configuration is read from.
const ciConfigPath = ".gitlab-ci.yml"

// CreatePipeline compiles the configuration of a commit of a project and
// creates its pipeline: the jobs are stored as created, then the engine
// enqueues the first ones before CreatePipeline returns. Errors:
// ErrNotFound (project), *PipelineError (ref, configuration, workflow
// rules); with StoreConfigErrors (a push, a schedule) a failed pipeline
// holds the configuration errors instead, as GitLab does.
func (s *Engine) CreatePipeline(ctx context.Context, req PipelineRequest) (*store.Pipeline, error) {
	return s.create(ctx, req, nil)
}

// create is CreatePipeline of a pipeline that may be downstream of ds.
func (s *Engine) create(ctx context.Context, req PipelineRequest, ds *downstreamSource) (*store.Pipeline, error) {
	// Compiling reads the repository and may fetch remote includes over
	// the network: it happens here, in the caller's goroutine and
	// context, never on the engine, which every pipeline waits on.
	prep, err := s.preparePipeline(ctx, req, ds)
	if err != nil {
		return nil, err
	}
	var out *store.Pipeline
	err = s.onEngine(ctx, func(ctx context.Context) error {
		p, err := s.createPipeline(ctx, prep)
		out = p
		return err
	})
	return out, err
}

// preparedPipeline is a compiled configuration waiting to be stored.
type preparedPipeline struct {
	req              PipelineRequest
	proj             *store.Project
	repo             *gitrepo.Repo
	ref, sha, before string
	tag, protected   bool
	vars             []*store.Variable
	pv               *varList
	compiled         *ci.Pipeline
	configErrors     []string          // the configuration is invalid
	ds               *downstreamSource // a trigger job's downstream pipeline
}

// preparePipeline resolves the ref and compiles the configuration; ds is
// set for a downstream pipeline (a trigger job's).
func (s *Engine) preparePipeline(ctx context.Context, req PipelineRequest, ds *downstreamSource) (*preparedPipeline, error) {
	proj, err := s.store.GetProject(ctx, req.ProjectID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("project %d: %w", req.ProjectID, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if req.Source == "" {
		req.Source = SourceAPI
	}
	for _, v := range req.Variables {
		if !ValidVariableKey(v.Key) {
			return nil, &PipelineError{Errors: []string{fmt.Sprintf("variable key %q: only letters, digits and _ are allowed", v.Key)}}
		}
	}
	repo, err := s.git.Repo(ctx, proj)
	if err != nil {
		return nil, err
	}
	ref, tag, sha, err := resolveRef(ctx, repo, req.Ref)
	if err != nil {
		return nil, err
	}
	if req.Sha != "" {
		sha = req.Sha
	}
	commit, err := repo.Commit(ctx, sha)
	if err != nil {
		return nil, &PipelineError{Errors: []string{"Commit not found"}}
	}
	before := req.BeforeSha
	if before == "" {
		before = gitrepo.ZeroSha
	}
	fsys, err := repo.FS(ctx, sha)
	if err != nil {
		return nil, err
	}
	configFS, configPath := fsys, ciConfigPath
	if ds != nil && ds.config != nil {
		configFS, configPath = ds.config(fsys), ds.configPath
	}
	protected := !tag && proj.Protects(ref)
	vars, err := s.store.ListVariables(ctx, proj.ID)
	if err != nil {
		return nil, err
	}
	pv := s.pipelineVars(proj, commit, ref, tag, before, req.Source, protected)
	if req.scheduleDescription != "" {
		pv.add("CI_PIPELINE_SCHEDULE_DESCRIPTION", req.scheduleDescription)
	}
	if ds != nil {
		// GitLab 18.9's upstream variables, known before the pipeline.
		pv.add("CI_UPSTREAM_PIPELINE_ID", strconv.FormatInt(ds.upstream.ID, 10))
		pv.add("CI_UPSTREAM_PROJECT_ID", strconv.FormatInt(ds.upstream.ProjectID, 10))
		pv.add("CI_UPSTREAM_JOB_ID", strconv.FormatInt(ds.bridge.ID, 10))
	}
	env := ci.Env{
		Predefined: pv.asMap(),
		Variables:  map[string]string{},
		Exists:     ci.FSExists(fsys),
		Changes:    s.changesFunc(repo, sha, before),
		// Blob ids from the commit's tree, last commits before sha.
		CacheKey: ci.FSCacheKey(fsys, func(ctx context.Context, path string) (string, error) {
			return repo.LastCommitTouching(ctx, sha, path)
		}),
		Includes: s.includeResolver(proj),
		ExistsIn: s.existsIn(proj),
		Inputs:   req.Inputs,
	}
	for _, v := range vars {
		if !v.Protected || protected {
			env.Variables[v.Key] = v.Value
		}
	}
	for _, v := range req.Variables {
		env.Variables[v.Key] = v.Value
	}
	prep := &preparedPipeline{req: req, proj: proj, repo: repo, ref: ref, sha: sha, before: before, tag: tag,
		protected: protected, vars: vars, pv: pv, ds: ds}
	compiled, err := ci.Compile(ctx, ci.Source{FS: configFS, Path: configPath}, env)
	var list ci.ErrorList
	switch {
	case errors.As(err, &list):
		for _, e := range list {
			prep.configErrors = append(prep.configErrors, e.Error())
		}
		if !req.StoreConfigErrors {
			return nil, &PipelineError{Errors: prep.configErrors}
		}
		return prep, nil
	case err != nil:
		return nil, fmt.Errorf("compiling %s at %s: %w", configPath, dispatch.ShortSha(sha), err)
	}
	prep.compiled = compiled
	return prep, nil
}

// createPipeline stores a prepared pipeline and its jobs; it runs on the
// engine.
func (s *Engine) createPipeline(ctx context.Context, prep *preparedPipeline) (*store.Pipeline, error) {
	req, proj, repo, sha, pv, vars, compiled := prep.req, prep.proj, prep.repo, prep.sha, prep.pv, prep.vars, prep.compiled
	now := s.clock.Now().UTC()
	pl := &store.Pipeline{ProjectID: proj.ID, Ref: prep.ref, Tag: prep.tag, Sha: sha, BeforeSha: prep.before, Source: req.Source,
		Status: store.StatusCreated, Protected: prep.protected, CreatedAt: now, UpdatedAt: now}
	for _, v := range req.Variables {
		pl.Variables = append(pl.Variables, store.PipelineVariable{Key: v.Key, Value: v.Value, File: v.VariableType == "file", Raw: v.Raw})
	}
	if ds := prep.ds; ds != nil {
		pl.UpstreamPipelineID, pl.SourceJobID = ds.upstream.ID, ds.bridge.ID
	}
	if msgs := prep.configErrors; msgs != nil {
		// Only StoreConfigErrors gets here: a failed pipeline holds the
		// errors.
		pl.Status, pl.YAMLErrors, pl.FailureReason = store.StatusFailed, strings.Join(msgs, "\n"), "config_error"
		pl.FinishedAt = now
		if err := s.store.CreatePipeline(ctx, pl); err != nil {
			return nil, err
		}
		s.log.Info("pipeline failed: configuration errors", "pipeline_id", pl.ID, "errors", len(msgs))
		return pl, nil
	}
	var err error
	if !compiled.Created {
		reason := compiled.Reason
		if reason == "" {
			reason = "Pipeline filtered out by workflow rules."
		}
		return nil, &PipelineError{Errors: []string{reason}}
	}

	if len(req.Jobs) > 0 {
		if compiled.Jobs, err = selectJobs(compiled.Jobs, req.Jobs); err != nil {
			return nil, err
		}
	}
	if err := s.store.CreatePipeline(ctx, pl); err != nil {
		return nil, err
	}
	// A ref of its own keeps the commit fetchable whatever happens to the
	// branch (GitLab's refs/pipelines/ID); clones fetch it.
	pipelineRef := "refs/pipelines/" + strconv.FormatInt(pl.ID, 10)
	if err := repo.UpdateRef(ctx, pipelineRef, sha, ""); err != nil {
		return nil, err
	}
	pv.add("CI_PIPELINE_ID", strconv.FormatInt(pl.ID, 10))
	pv.add("CI_PIPELINE_IID", strconv.FormatInt(pl.IID, 10))
	pv.add("CI_PIPELINE_URL", fmt.Sprintf("%s/api/v4/projects/%d/pipelines/%d", s.baseURL(), proj.ID, pl.ID))
	pv.add("CI_PIPELINE_CREATED_AT", now.Format(time.RFC3339))

	jobs, err := s.pipelineJobs(proj, pl, compiled, pv, vars, req.Variables, pipelineRef)
	if err == nil {
		err = s.store.CreateJobs(ctx, jobs)
	}
	if err != nil {
		if uerr := s.failPipelineWithoutJobs(ctx, pl.ID, "the pipeline's jobs could not be stored: "+err.Error()); uerr != nil {
			s.log.Error("failing a pipeline whose jobs could not be created", "pipeline_id", pl.ID, "err", uerr)
		}
		return nil, fmt.Errorf("creating the jobs of pipeline %d: %w", pl.ID, err)
	}
	s.log.Info("pipeline created", "pipeline_id", pl.ID, "project_id", proj.ID, "ref", prep.ref, "sha", dispatch.ShortSha(sha),
		"source", req.Source, "jobs", len(jobs))
	if err := s.processPipeline(ctx, pl.ID); err != nil {
		return nil, err
	}
	return s.store.GetPipeline(ctx, pl.ID)
}

// selectJobs keeps the named jobs and, transitively, the jobs they need
// or download artifacts from.
func selectJobs(jobs []*ci.Job, names []string) ([]*ci.Job, error) {
	byName := map[string]*ci.Job{}
	for _, j := range jobs {
		byName[j.Name] = j
	}
	keep := map[string]bool{}
	var visit func(j *ci.Job)
	visit = func(j *ci.Job) {
		if keep[j.Name] {
			return
		}
		keep[j.Name] = true
		for _, n := range j.Needs {
			if d := byName[n.Job]; d != nil {
				visit(d)
			}
		}
		for _, n := range j.Dependencies {
			if d := byName[n]; d != nil {
				visit(d)
			}
		}
	}
	var missing []string
	for _, name := range names {
		found := false
		for _, j := range jobs {
			if j.Name == name || j.BaseName == name {
				visit(j)
				found = true
			}
		}
		if !found {
			missing = append(missing, fmt.Sprintf("job %q is not in the pipeline", name))
		}
	}
	if len(missing) > 0 {
		return nil, &PipelineError{Errors: missing}
	}
	var out []*ci.Job
	for _, j := range jobs {
		if keep[j.Name] {
			if len(j.Dependencies) > 0 {
				c := *j
				c.Dependencies = slices.DeleteFunc(slices.Clone(j.Dependencies), func(n string) bool { return !keep[n] })
				j = &c
			}
			out = append(out, j)
		}
	}
	return out, nil
}

// LatestPipeline is the newest pipeline of a ref's head commit (the
// project's default branch when ref is empty), as GitLab's
// Project#latest_pipeline: nil when that commit has none. A ref that does
// not exist is a *PipelineError.
func (s *Engine) LatestPipeline(ctx context.Context, projectID int64, ref string) (*store.Pipeline, error) {
	proj, err := s.store.GetProject(ctx, projectID)
	if err != nil {
		return nil, err
	}
	if ref == "" {
		ref = proj.DefaultBranch
	}
	repo, err := s.git.Repo(ctx, proj)
	if err != nil {
		return nil, err
	}
	name, _, sha, err := resolveRef(ctx, repo, ref)
	if err != nil {
		return nil, err
	}
	pls, err := s.store.ListPipelines(ctx, store.PipelineFilter{ProjectID: proj.ID, Ref: name, Sha: sha, Newest: true, Limit: 1})
	if err != nil || len(pls) == 0 {
		return nil, err
	}
	return pls[0], nil
}

// resolveRef turns a ref as given into (name, tag, commit).
func resolveRef(ctx context.Context, repo *gitrepo.Repo, ref string) (string, bool, string, error) {
	notFound := &PipelineError{Errors: []string{"Reference not found"}}
	if ref == "" {
		return "", false, "", notFound
	}
	refs, err := repo.Refs(ctx)
	if err != nil {
		return "", false, "", err
	}
	switch {
	case strings.HasPrefix(ref, "refs/heads/"):
		if sha, ok := refs[ref]; ok {
			return strings.TrimPrefix(ref, "refs/heads/"), false, sha, nil
		}
	case strings.HasPrefix(ref, "refs/tags/"):
		if sha, ok := refs[ref]; ok {
			return strings.TrimPrefix(ref, "refs/tags/"), true, sha, nil
		}
	default:
		if sha, ok := refs["refs/heads/"+ref]; ok {
			return ref, false, sha, nil
		}
		if sha, ok := refs["refs/tags/"+ref]; ok {
			return ref, true, sha, nil
		}
	}
	return "", false, "", notFound
}

// varList is an ordered list of variables with unique keys.
type varList struct{ vars []runnerapi.Variable }

func (l *varList) add(k, v string) {
	for i := range l.vars {
		if l.vars[i].Key == k {
			l.vars[i].Value = v
			return
		}
	}
	l.vars = append(l.vars, runnerapi.Variable{Key: k, Value: v, Public: true})
}

func (l *varList) asMap() map[string]string {
	m := make(map[string]string, len(l.vars))
	for _, v := range l.vars {
		m[v.Key] = v.Value
	}
	return m
}

// handOutVars are set by the hand-out code (runnerhttp) for every job; the
// pipeline's own copy of them is used for rules only.
var handOutVars = map[string]bool{
	"CI_PIPELINE_ID": true, "CI_PROJECT_ID": true, "CI_COMMIT_SHA": true, "CI_COMMIT_SHORT_SHA": true,
	"CI_COMMIT_BEFORE_SHA": true, "CI_COMMIT_REF_NAME": true, "CI_SERVER_URL": true, "CI_API_V4_URL": true,
	"CI": true, "GITLAB_CI": true, "CI_SERVER": true,
}

// pipelineVars are the predefined variables of a pipeline (GitLab's
// pipeline, project, commit and server variables).
func (s *Engine) pipelineVars(p *store.Project, c *gitrepo.Commit, ref string, tag bool, before, source string, protected bool) *varList {
	l := &varList{}
	base := s.baseURL()
	u, _ := url.Parse(base)
	ns, name := "", p.Path
	if i := strings.LastIndex(p.Path, "/"); i >= 0 {
		ns, name = p.Path[:i], p.Path[i+1:]
	}
	root, _, _ := strings.Cut(p.Path, "/")
	if ns == "" {
		root = ""
	}
	l.add("CI", "true")
	l.add("GITLAB_CI", "true")
	l.add("CI_SERVER", "yes")
	l.add("CI_SERVER_URL", base)
	l.add("CI_API_V4_URL", base+"/api/v4")
	l.add("CI_SERVER_NAME", "Berth")
	l.add("CI_TEMPLATE_REGISTRY_HOST", dispatch.TemplateRegistryHost)
	if u != nil {
		l.add("CI_SERVER_HOST", u.Hostname())
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		l.add("CI_SERVER_PORT", port)
		l.add("CI_SERVER_PROTOCOL", u.Scheme)
		l.add("CI_SERVER_FQDN", u.Host)
	}
	l.add("CI_PIPELINE_SOURCE", source)
	l.add("CI_CONFIG_PATH", ciConfigPath)
	l.add("CI_PROJECT_ID", strconv.FormatInt(p.ID, 10))
	l.add("CI_PROJECT_NAME", name)
	l.add("CI_PROJECT_TITLE", p.Name)
	l.add("CI_PROJECT_DESCRIPTION", p.Description)
	l.add("CI_PROJECT_PATH", p.Path)
	l.add("CI_PROJECT_PATH_SLUG", ci.Slug(p.Path, 1024))
	l.add("CI_PROJECT_NAMESPACE", ns)
	l.add("CI_PROJECT_ROOT_NAMESPACE", root)
	l.add("CI_PROJECT_URL", base+"/"+p.Path)
	l.add("CI_PROJECT_VISIBILITY", p.Visibility)
	l.add("CI_DEFAULT_BRANCH", p.DefaultBranch)
	l.add("CI_COMMIT_SHA", c.Sha)
	l.add("CI_COMMIT_SHORT_SHA", dispatch.ShortSha(c.Sha))
	l.add("CI_COMMIT_BEFORE_SHA", before)
	l.add("CI_COMMIT_REF_NAME", ref)
	l.add("CI_COMMIT_REF_SLUG", ci.Slug(ref, 63))
	l.add("CI_COMMIT_REF_PROTECTED", strconv.FormatBool(protected))
	if tag {
		l.add("CI_COMMIT_TAG", ref)
	} else {
		l.add("CI_COMMIT_BRANCH", ref)
	}
	l.add("CI_COMMIT_MESSAGE", c.Message)
	l.add("CI_COMMIT_TITLE", c.Title())
	l.add("CI_COMMIT_DESCRIPTION", c.Description())
	l.add("CI_COMMIT_AUTHOR", fmt.Sprintf("%s <%s>", c.AuthorName, c.AuthorEmail))
	l.add("CI_COMMIT_TIMESTAMP", c.AuthorDate)
	l.add("CI_PAGES_URL", s.pages.URL(p.Path, ""))
	if u != nil {
		l.add("CI_PAGES_HOSTNAME", u.Hostname())
	}
	return l
}

// changesFunc answers rules:changes: the files changed between the push's
// before commit and sha, or between compare_to (merge base) and sha. With
// no before commit (a new branch, a tag, an API pipeline) it is true, as
// in GitLab.
func (s *Engine) changesFunc(repo *gitrepo.Repo, sha, before string) ci.ChangesFunc {
	return func(ctx context.Context, q ci.ChangesQuery) (bool, error) {
		from := before
		if q.CompareTo != "" {
			base, err := repo.ResolveCommit(ctx, q.CompareTo)
			if err != nil {
				return false, fmt.Errorf("rules:changes:compare_to %q: not a branch, tag or commit of the project", q.CompareTo)
			}
			if mb, err := repo.MergeBase(ctx, base, sha); err == nil {
				base = mb
			}
			from = base
		}
		files, err := repo.ChangedFiles(ctx, from, sha)
		if errors.Is(err, gitrepo.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return ci.ChangesMatch(q.Paths, files), nil
	}
}

// pipelineJobs builds the stored jobs of a compiled pipeline.
func (s *Engine) pipelineJobs(proj *store.Project, pl *store.Pipeline, p *ci.Pipeline, pv *varList,
	projectVars []*store.Variable, reqVars []PipelineVariable, pipelineRef string) ([]*store.Job, error) {
	now := s.clock.Now().UTC()
	refType, refspecs := "branch", []string{"+" + pipelineRef + ":" + pipelineRef, "+refs/heads/" + pl.Ref + ":refs/remotes/origin/" + pl.Ref}
	if pl.Tag {
		refType, refspecs = "tag", []string{"+" + pipelineRef + ":" + pipelineRef, "+refs/tags/" + pl.Ref + ":refs/tags/" + pl.Ref}
	}
	depth := s.cfg.GitDepth
	if depth < 0 {
		depth = 0
	}
	var base []runnerapi.Variable
	for _, v := range pv.vars {
		if !handOutVars[v.Key] {
			base = append(base, v)
		}
	}
	var high []runnerapi.Variable
	for _, v := range projectVars {
		if v.Protected && !pl.Protected {
			continue
		}
		high = append(high, runnerapi.Variable{Key: v.Key, Value: v.Value, File: v.File, Masked: v.Masked, Raw: v.Raw, Public: false})
	}
	for _, v := range reqVars {
		high = append(high, runnerapi.Variable{Key: v.Key, Value: v.Value, File: v.VariableType == "file", Raw: v.Raw})
	}
	var jobs []*store.Job
	for _, cj := range p.Jobs {
		if cj.Trigger != nil {
			j, err := s.bridgeJob(proj, pl, cj, base, high, now)
			if err != nil {
				return nil, fmt.Errorf("job %q: %w", cj.Name, err)
			}
			jobs = append(jobs, j)
			continue
		}
		timeout := cj.EffectiveTimeout(time.Duration(s.cfg.DefaultJobTimeout)*time.Second, 0)
		parts, err := cj.RunnerPayload(timeout)
		if err != nil {
			return nil, fmt.Errorf("job %q: %w", cj.Name, err)
		}
		parts.SeparateCaches(cj, pl.Protected)
		vars := slices.Clone(base)
		// What the job is created with expands its environment and
		// Pages keywords (GitLab expands them at pipeline creation).
		known := dispatch.ExpandVariables(slices.Concat(pv.vars, []runnerapi.Variable{{Key: "CI_JOB_NAME", Value: cj.Name},
			{Key: "CI_JOB_STAGE", Value: cj.Stage}}, parts.Variables, high))
		genv, envVars := jobEnvironment(cj.Environment, known)
		gpages, pagesVars := s.pages.JobPages(proj, cj.Pages, known)
		vars = append(vars, envVars...)
		vars = append(vars, pagesVars...)
		vars = append(vars, parts.Variables...)
		vars = append(vars, high...)
		spec := dispatch.JobSpec{
			Name: cj.Name, Stage: cj.Stage, ProjectID: proj.ID, ProjectName: proj.Name, ProjectFullPath: proj.Path,
			PipelineID: pl.ID, Ref: pl.Ref, RefType: refType, Sha: pl.Sha, BeforeSha: pl.BeforeSha, Protected: pl.Protected,
			RepoURL: s.baseURL() + "/" + proj.Path + ".git", Refspecs: refspecs, Depth: depth, AllowGitFetch: true,
			Tags: cj.Tags, Timeout: int(timeout / time.Second), Variables: vars, Steps: parts.Steps, Hooks: parts.Hooks,
			Image: parts.Image, Services: parts.Services, Artifacts: parts.Artifacts, Cache: parts.Cache,
			Isolation: string(cj.Isolation), HighVariables: len(high),
			IDTokens: parts.IDTokens, Secrets: parts.Secrets, PipelineSource: pl.Source, CIConfigPath: ciConfigPath,
		}
		if spec.Timeout <= 0 {
			spec.Timeout = s.cfg.DefaultJobTimeout
		}
		if err := spec.Validate(); err != nil {
			return nil, fmt.Errorf("job %q: %w", cj.Name, err)
		}
		rawSpec, err := json.Marshal(spec)
		if err != nil {
			return nil, err
		}
		g := graph.Job{
			StageIndex: cj.StageIndex, DAG: cj.Scheduling == ci.ScheduleDAG, Dependencies: cj.Dependencies,
			When: string(cj.When), StartInSeconds: int64(cj.StartIn / time.Second), AllowFailure: cj.AllowFailure,
			AllowFailureExitCodes: cj.AllowFailureExitCodes, RetryMax: cj.Retry.Max, RetryWhen: cj.Retry.When,
			RetryExitCodes: cj.Retry.ExitCodes, ResourceGroup: cj.ResourceGroup, Interruptible: cj.Interruptible,
		}
		if genv != nil {
			g.Environment, g.Env = genv.Name, genv
		}
		g.Release, g.Pages = cj.Release, gpages
		g.CrossNeeds = crossNeedsOf(cj.CrossNeeds, known)
		for _, n := range cj.Needs {
			g.Needs = append(g.Needs, graph.Need{Job: n.Job, Artifacts: n.Artifacts})
		}
		rawGraph, err := json.Marshal(g)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, &store.Job{
			Status: store.StatusCreated, ProjectID: proj.ID, PipelineID: pl.ID, Name: cj.Name, Stage: cj.Stage,
			Ref: pl.Ref, Protected: pl.Protected, Tags: queue.NormalizeTags(cj.Tags), Timeout: spec.Timeout,
			Isolation: string(spec.RequestedIsolation()), Spec: rawSpec, Graph: rawGraph, CreatedAt: now, UpdatedAt: now,
		})
	}
	return jobs, nil
}

// ValidVariableKey: letters, digits and '_', at most 255 (GitLab's rule).
func ValidVariableKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// jobInPipeline loads a job for an action through the API.
func (s *Engine) loadJob(ctx context.Context, id int64) (*store.Job, error) {
	j, err := s.store.GetJob(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %d: %w", id, ErrNotFound)
	}
	return j, err
}

// PlayJob starts a manual job, or a scheduled (delayed) one at once; a
// finished manual job is retried. ErrNotAllowed for any other job.
func (s *Engine) PlayJob(ctx context.Context, id int64) (*store.Job, error) {
	var out *store.Job
	err := s.onEngine(ctx, func(ctx context.Context) error {
		j, err := s.loadJob(ctx, id)
		if err != nil {
			return err
		}
		g := graph.Decode(j.Graph)
		if g.Bridge != nil && g.When != "manual" {
			// A bridge mirroring a manual downstream pipeline is not an
			// action of its own.
			return fmt.Errorf("job %d (%s) is not playable: %w", id, j.Status, ErrNotAllowed)
		}
		switch {
		case j.PipelineID != 0 && (j.Status == store.StatusManual || j.Status == store.StatusScheduled):
			jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: j.PipelineID})
			if err != nil {
				return err
			}
			nj, err := s.enqueuePipelineJob(ctx, j, jobs, j.Status)
			if errors.Is(err, store.ErrConflict) {
				return fmt.Errorf("job %d is no longer %s: %w", id, j.Status, ErrNotAllowed)
			}
			if err != nil {
				return err
			}
			out = nj
		case g.When == "manual" && !j.Retried && (j.Status == store.StatusSuccess || j.Status == store.StatusFailed || j.Status == store.StatusCanceled):
			jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: j.PipelineID})
			if err != nil {
				return err
			}
			nj, err := s.retryJob(ctx, j, true, jobs)
			if err != nil {
				return err
			}
			out = nj
		default:
			return fmt.Errorf("job %d (%s) is not playable: %w", id, j.Status, ErrNotAllowed)
		}
		s.log.Info("job played", "job_id", id, "now", out.ID)
		if j.PipelineID != 0 {
			if err := s.processPipeline(ctx, j.PipelineID); err != nil {
				return err
			}
		}
		out, err = s.store.GetJob(ctx, out.ID)
		return err
	})
	return out, err
}

// RetryJob retries a finished job (success, failed or canceled; not one
// already retried) and returns the new job. ErrNotAllowed otherwise.
func (s *Engine) RetryJob(ctx context.Context, id int64) (*store.Job, error) {
	var out *store.Job
	err := s.onEngine(ctx, func(ctx context.Context) error {
		j, err := s.loadJob(ctx, id)
		if err != nil {
			return err
		}
		if j.Retried || !(j.Status == store.StatusSuccess || j.Status == store.StatusFailed || j.Status == store.StatusCanceled) {
			return fmt.Errorf("job %d (%s) is not retryable: %w", id, j.Status, ErrNotAllowed)
		}
		if graph.IsBridge(j) && (j.FailureReason == ReasonMaxDepth || j.FailureReason == ReasonLoop) {
			// Retrying cannot help (GitLab's Ci::Bridge#retryable?).
			return fmt.Errorf("job %d failed with %s: %w", id, j.FailureReason, ErrNotAllowed)
		}
		var jobs []*store.Job
		if j.PipelineID != 0 {
			if jobs, err = s.store.ListJobs(ctx, store.JobFilter{PipelineID: j.PipelineID}); err != nil {
				return err
			}
		}
		nj, err := s.retryJob(ctx, j, true, jobs)
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("job %d was retried already: %w", id, ErrNotAllowed)
		}
		if err != nil {
			return err
		}
		s.log.Info("job retried", "job_id", id, "new_job_id", nj.ID)
		if j.PipelineID != 0 {
			if err := s.processPipeline(ctx, j.PipelineID); err != nil {
				return err
			}
		}
		out, err = s.store.GetJob(ctx, nj.ID)
		return err
	})
	return out, err
}

// CancelPipeline cancels every cancelable job of a pipeline (created,
// waiting, scheduled, pending, running; not manual ones, as GitLab) and
// returns the pipeline.
//
// Its child pipelines are canceled with it, as GitLab cascades a cancel
// to child pipelines (multi-project downstream pipelines run on; a
// bridge that depends on one is canceled).
func (s *Engine) CancelPipeline(ctx context.Context, id int64) (*store.Pipeline, error) {
	var out *store.Pipeline
	err := s.onEngine(ctx, func(ctx context.Context) error {
		var err error
		out, err = s.cancelPipeline(ctx, id)
		return err
	})
	return out, err
}

// cancelPipeline is CancelPipeline on the engine goroutine.
func (s *Engine) cancelPipeline(ctx context.Context, id int64) (*store.Pipeline, error) {
	st, err := s.PipelineState(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, j := range st.Jobs {
		if j.Retried || j.Status == store.StatusManual {
			continue
		}
		if _, err := s.CancelJob(ctx, j); err != nil {
			return nil, err
		}
	}
	children, err := s.DownstreamPipelines(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, c := range children {
		if c.Source == SourceParentPipeline && !c.Status.Finished() {
			if _, err := s.cancelPipeline(ctx, c.ID); err != nil {
				return nil, fmt.Errorf("canceling child pipeline %d: %w", c.ID, err)
			}
		}
	}
	if err := s.processPipeline(ctx, id); err != nil {
		return nil, err
	}
	return s.store.GetPipeline(ctx, id)
}

// RetryPipeline retries the failed and canceled jobs of a pipeline and
// lets skipped ones be decided again. ErrNotAllowed when nothing is
// retryable.
func (s *Engine) RetryPipeline(ctx context.Context, id int64) (*store.Pipeline, error) {
	var out *store.Pipeline
	err := s.onEngine(ctx, func(ctx context.Context) error {
		st, err := s.PipelineState(ctx, id)
		if err != nil {
			return err
		}
		now := s.clock.Now().UTC()
		n := 0
		for _, j := range st.Jobs {
			if j.Retried {
				continue
			}
			switch j.Status {
			case store.StatusFailed, store.StatusCanceled:
				if _, err := s.retryJob(ctx, j, false, st.Jobs); err != nil && !errors.Is(err, store.ErrConflict) {
					return err
				}
				n++
			case store.StatusSkipped:
				if _, err := s.store.TransitionJob(ctx, j.ID, []store.Status{store.StatusSkipped},
					store.JobUpdate{Status: store.StatusCreated, UpdatedAt: now}); err != nil && !errors.Is(err, store.ErrConflict) {
					return err
				}
			}
		}
		if n == 0 {
			return fmt.Errorf("pipeline %d has no failed or canceled jobs: %w", id, ErrNotAllowed)
		}
		s.log.Info("pipeline retried", "pipeline_id", id, "jobs", n)
		if err := s.processPipeline(ctx, id); err != nil {
			return err
		}
		out, err = s.store.GetPipeline(ctx, id)
		return err
	})
	return out, err
}
