package resthttp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
)

// pipelineRoutes registers the GitLab-shaped project, pipeline, job and
// variable endpoints, and Berth's id-only lookups: for instance admins,
// and for a project's members at GitLab's levels — guests see the
// project, reporters its pipelines and jobs, developers run, cancel and
// retry them (maintainers on a protected ref), maintainers change the
// project and its variables, owners delete pipelines.
func (s *API) pipelineRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v4/projects", s.admin(s.handleCreateProject))
	mux.HandleFunc("GET /api/v4/projects", s.authed(s.handleListProjects))
	mux.HandleFunc("GET /api/v4/projects/{project}", s.projectMember(store.AccessGuest, s.handleGetProject))
	mux.HandleFunc("PUT /api/v4/projects/{project}", s.projectMember(store.AccessMaintainer, s.handleUpdateProject))
	mux.HandleFunc("POST /api/v4/projects/{project}/pipeline", s.projectMember(store.AccessDeveloper, s.handleCreatePipeline))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines", s.projectMember(store.AccessReporter, s.handleListPipelines))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}", s.projectMember(store.AccessReporter, s.handleGetPipeline))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}/test_report", s.projectMember(store.AccessReporter, s.handleTestReport))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}/test_report_summary", s.projectMember(store.AccessReporter, s.handleTestReportSummary))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/latest", s.projectMember(store.AccessReporter, s.handleLatestPipeline))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}/variables", s.projectMember(store.AccessMaintainer, s.handlePipelineVariables))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}/jobs", s.projectMember(store.AccessReporter, s.handlePipelineJobs))
	mux.HandleFunc("GET /api/v4/projects/{project}/pipelines/{pipeline}/bridges", s.projectMember(store.AccessReporter, s.handlePipelineBridges))
	mux.HandleFunc("POST /api/v4/projects/{project}/pipelines/{pipeline}/cancel", s.projectMember(store.AccessDeveloper, s.handleCancelPipeline))
	mux.HandleFunc("POST /api/v4/projects/{project}/pipelines/{pipeline}/retry", s.projectMember(store.AccessDeveloper, s.handleRetryPipeline))
	mux.HandleFunc("DELETE /api/v4/projects/{project}/pipelines/{pipeline}", s.projectMember(store.AccessOwner, s.handleDeletePipeline))
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs", s.projectMember(store.AccessReporter, s.handleProjectJobs))
	mux.HandleFunc("POST /api/v4/projects/{project}/jobs/{id}/retry", s.projectMember(store.AccessDeveloper, s.handleRetryJob))
	mux.HandleFunc("POST /api/v4/projects/{project}/jobs/{id}/play", s.projectMember(store.AccessDeveloper, s.handlePlayJob))
	mux.HandleFunc("GET /api/v4/projects/{project}/variables", s.projectMember(store.AccessMaintainer, s.handleListVariables))
	mux.HandleFunc("POST /api/v4/projects/{project}/variables", s.projectMember(store.AccessMaintainer, s.handleCreateVariable))
	mux.HandleFunc("GET /api/v4/projects/{project}/variables/{key}", s.projectMember(store.AccessMaintainer, s.handleGetVariable))
	mux.HandleFunc("PUT /api/v4/projects/{project}/variables/{key}", s.projectMember(store.AccessMaintainer, s.handleUpdateVariable))
	mux.HandleFunc("DELETE /api/v4/projects/{project}/variables/{key}", s.projectMember(store.AccessMaintainer, s.handleDeleteVariable))
	mux.HandleFunc("GET /api/v4/berth/pipelines/{pipeline}", s.authed(s.handleBerthPipeline))
	mux.HandleFunc("GET /api/v4/berth/jobs/{id}", s.authed(s.handleBerthJob))
}

// apiError answers an error of the pipeline API with GitLab's status and
// body shapes.
func (s *API) apiError(w http.ResponseWriter, what string, err error) {
	var pe *pipelines.PipelineError
	var ve *pipelines.ValidationError
	switch {
	case errors.As(err, &pe):
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]any{"message": map[string][]string{"base": pe.Errors}})
	case errors.As(err, &ve):
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]any{"message": ve.Fields})
	case errors.Is(err, pipelines.ErrNotFound):
		httpapi.WriteError(w, http.StatusNotFound, "404 "+notFoundWhat(err)+" Not Found")
	case errors.Is(err, pipelines.ErrInvalid), errors.Is(err, pipelines.ErrExists):
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
	case errors.Is(err, pipelines.ErrNotAllowed):
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - "+err.Error())
	case errors.Is(err, pipelines.ErrGitDisabled):
		httpapi.WriteError(w, http.StatusServiceUnavailable, "503 Service Unavailable - "+err.Error())
	default:
		httpapi.InternalError(s.log, w, what, err)
	}
}

func notFoundWhat(err error) string {
	msg := err.Error()
	for _, w := range []string{"pipeline", "job", "project", "variable"} {
		if strings.HasPrefix(msg, w+" ") {
			return strings.ToUpper(w[:1]) + w[1:]
		}
	}
	return "Resource"
}

func (s *API) projectJSON(p *store.Project) restapi.ProjectJSON {
	ns, name := "", p.Path
	if i := strings.LastIndex(p.Path, "/"); i >= 0 {
		ns, name = p.Path[:i], p.Path[i+1:]
	}
	out := restapi.ProjectJSON{ID: p.ID, Name: p.Name, Path: name, PathWithNamespace: p.Path, NameWithNamespace: p.Name,
		Description: p.Description, DefaultBranch: p.DefaultBranch, Visibility: p.Visibility,
		HTTPURLToRepo: s.baseURL + "/" + p.Path + ".git", WebURL: s.baseURL + "/" + p.Path, CreatedAt: httpapi.RFC3339OrNil(p.CreatedAt),
		MinIsolation: p.MinIsolation}
	if out.MinIsolation == "" {
		out.MinIsolation = string(executor.IsolationNone)
	}
	if ns != "" {
		out.NameWithNamespace = ns + " / " + p.Name
		out.Namespace.Name, out.Namespace.Path, out.Namespace.FullPath, out.Namespace.Kind = ns[strings.LastIndex(ns, "/")+1:], ns[strings.LastIndex(ns, "/")+1:], ns, "group"
	}
	return out
}

func (s *API) handleCreateProject(w http.ResponseWriter, r *http.Request) {
	var req restapi.CreateProjectRequest
	if !decodeParams(w, r, &req) {
		return
	}
	p := req.Path
	if p == "" {
		p = req.Name
	}
	if req.NamespacePath != "" {
		p = strings.Trim(req.NamespacePath, "/") + "/" + p
	}
	proj, err := s.pipelines.CreateProject(r.Context(), pipelines.ProjectSpec{Path: p, Name: req.Name, Description: req.Description,
		DefaultBranch: req.DefaultBranch, Visibility: req.Visibility, MinIsolation: req.MinIsolation})
	if err != nil {
		s.apiError(w, "creating project", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, s.projectJSON(proj))
}

// handleListProjects: GET /projects — every project to an instance
// admin, the projects a user is a member of to the user (GitLab's
// membership=true).
func (s *API) handleListProjects(w http.ResponseWriter, r *http.Request) {
	ps, err := s.store.ListProjects(r.Context())
	if err != nil {
		httpapi.InternalError(s.log, w, "listing projects", err)
		return
	}
	if who := principalOf(r); who != nil && !who.Admin() {
		ms, err := s.store.MembershipsOfUser(r.Context(), who.User.ID)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing a user's projects", err)
			return
		}
		member := map[int64]bool{}
		for _, m := range ms {
			member[m.ProjectID] = true
		}
		ps = slices.DeleteFunc(ps, func(p *store.Project) bool { return !member[p.ID] })
	}
	page, ok := httpapi.Paginate(w, r, len(ps))
	if !ok {
		return
	}
	out := []restapi.ProjectJSON{}
	for _, p := range ps[page.From:page.To] {
		out = append(out, s.projectJSON(p))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// project loads the project of the {project} path value (id or
// URL-encoded full path), answering 404 itself.
func (s *API) project(w http.ResponseWriter, r *http.Request) *store.Project {
	p, err := s.pipelines.Project(r.Context(), r.PathValue("project"))
	if err != nil {
		s.apiError(w, "loading project", err)
		return nil
	}
	return p
}

func (s *API) handleGetProject(w http.ResponseWriter, r *http.Request) {
	if p := s.project(w, r); p != nil {
		httpapi.WriteJSON(w, http.StatusOK, s.projectJSON(p))
	}
}

func (s *API) handleUpdateProject(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	var req restapi.UpdateProjectRequest
	if !decodeParams(w, r, &req) {
		return
	}
	np, err := s.pipelines.UpdateProject(r.Context(), p.ID, pipelines.ProjectUpdate{Name: req.Name, Description: req.Description,
		Visibility: req.Visibility, MinIsolation: req.MinIsolation})
	if err != nil {
		s.apiError(w, "updating project", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.projectJSON(np))
}

func (s *API) pipelineJSON(p *store.Pipeline) restapi.PipelineJSON {
	out := restapi.PipelineJSON{ID: p.ID, IID: p.IID, ProjectID: p.ProjectID, Sha: p.Sha, BeforeSha: p.BeforeSha, Ref: p.Ref,
		Tag: p.Tag, Status: string(p.Status), Source: p.Source, CreatedAt: httpapi.RFC3339OrNil(p.CreatedAt),
		UpdatedAt: httpapi.RFC3339OrNil(p.UpdatedAt), StartedAt: httpapi.RFC3339OrNil(p.StartedAt), FinishedAt: httpapi.RFC3339OrNil(p.FinishedAt),
		WebURL:             fmt.Sprintf("%s/api/v4/projects/%d/pipelines/%d", s.baseURL, p.ProjectID, p.ID),
		UpstreamPipelineID: p.UpstreamPipelineID, SourceJobID: p.SourceJobID}
	if p.YAMLErrors != "" {
		e := p.YAMLErrors
		out.YAMLErrors = &e
	}
	if !p.StartedAt.IsZero() {
		q := p.StartedAt.Sub(p.CreatedAt).Seconds()
		out.QueuedDuration = &q
		if !p.FinishedAt.IsZero() {
			d := p.FinishedAt.Sub(p.StartedAt).Seconds()
			out.Duration = &d
		}
	}
	return out
}

func (s *API) handleCreatePipeline(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	// ref and variables from the query, JSON or a form (curl --form
	// ref=main --form "variables[][key]=A" --form "variables[][value]=1":
	// Rack's list of hashes, in the fields' order).
	var req restapi.CreatePipelineRequest
	if !decodeParams(w, r, &req) {
		return
	}
	if req.Ref == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - ref is missing")
		return
	}
	if !s.mayAccess(w, r, p.ID, p.RunAccess(req.Ref)) {
		return
	}
	for _, v := range req.Variables {
		if v.VariableType != "" && v.VariableType != "env_var" && v.VariableType != "file" {
			httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - variables[%s].variable_type must be env_var or file", v.Key))
			return
		}
	}
	pl, err := s.pipelines.CreatePipeline(r.Context(), pipelines.PipelineRequest{ProjectID: p.ID, Ref: req.Ref, Source: pipelines.SourceAPI, Variables: pipelineVariables(req.Variables), Inputs: req.Inputs})
	if err != nil {
		s.apiError(w, "creating pipeline", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, s.pipelineJSON(pl))
}

func (s *API) handleListPipelines(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	q := r.URL.Query()
	f := store.PipelineFilter{ProjectID: p.ID, Ref: q.Get("ref"), Sha: q.Get("sha"), Source: q.Get("source"), Newest: q.Get("sort") != "asc"}
	if st := q.Get("status"); st != "" {
		if !store.Status(st).Valid() {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - status does not have a valid value")
			return
		}
		f.Statuses = []store.Status{store.Status(st)}
	}
	ps, err := s.store.ListPipelines(r.Context(), f)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing pipelines", err)
		return
	}
	pg, ok := httpapi.Paginate(w, r, len(ps))
	if !ok {
		return
	}
	out := []restapi.PipelineJSON{}
	for _, pl := range ps[pg.From:pg.To] {
		out = append(out, s.pipelineJSON(pl))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// pipeline loads the {pipeline} of the {project}, answering 404 itself.
func (s *API) pipeline(w http.ResponseWriter, r *http.Request) *store.Pipeline {
	p := s.project(w, r)
	if p == nil {
		return nil
	}
	id, ok := httpapi.PathID(w, r, "pipeline")
	if !ok {
		return nil
	}
	pl, err := s.store.GetPipeline(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && pl.ProjectID != p.ID) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading pipeline", err)
		return nil
	}
	return pl
}

func (s *API) handleGetPipeline(w http.ResponseWriter, r *http.Request) {
	if pl := s.pipeline(w, r); pl != nil {
		httpapi.WriteJSON(w, http.StatusOK, s.pipelineJSON(pl))
	}
}

// handleLatestPipeline: GET /projects/:id/pipelines/latest[?ref=] is
// the newest pipeline of the ref's head commit (default branch: the
// project's). GitLab answers 403 when there is none; Berth 404.
func (s *API) handleLatestPipeline(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	pl, err := s.pipelines.LatestPipeline(r.Context(), p.ID, r.URL.Query().Get("ref"))
	var pe *pipelines.PipelineError
	switch {
	case errors.As(err, &pe):
		httpapi.WriteError(w, http.StatusNotFound, "404 Reference Not Found")
	case err != nil:
		httpapi.InternalError(s.log, w, "finding the latest pipeline", err)
	case pl == nil:
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Not Found - the ref's head commit has no pipeline")
	default:
		httpapi.WriteJSON(w, http.StatusOK, s.pipelineJSON(pl))
	}
}

// handlePipelineVariables: GET /projects/:id/pipelines/:pipeline_id/variables
// (maintainers, GitLab's read_pipeline_variable) lists the variables the
// pipeline was created with.
func (s *API) handlePipelineVariables(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	out := make([]restapi.PipelineVariableJSON, 0, len(pl.Variables))
	for _, v := range pl.Variables {
		vt := "env_var"
		if v.File {
			vt = "file"
		}
		out = append(out, restapi.PipelineVariableJSON{VariableType: vt, Key: v.Key, Value: v.Value, Raw: v.Raw})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handleBerthPipeline(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "pipeline")
	if !ok {
		return
	}
	pl, err := s.store.GetPipeline(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading pipeline", err)
		return
	}
	if !s.mayAccess(w, r, pl.ProjectID, store.AccessReporter) {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.pipelineJSON(pl))
}

func (s *API) handleBerthJob(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	j, err := s.store.GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Job Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return
	}
	if !s.mayAccess(w, r, j.ProjectID, store.AccessReporter) {
		return
	}
	s.writeJob(w, r, http.StatusOK, j)
}

// jobScopes reads GitLab's scope / scope[] filter of job lists.
func jobScopes(w http.ResponseWriter, r *http.Request) ([]store.Status, bool) {
	q := r.URL.Query()
	var out []store.Status
	for _, v := range append(q["scope[]"], q["scope"]...) {
		if !store.Status(v).Valid() {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - scope does not have a valid value")
			return nil, false
		}
		out = append(out, store.Status(v))
	}
	return out, true
}

// writeJobs answers a paginated job list.
func (s *API) writeJobs(w http.ResponseWriter, r *http.Request, jobs []*store.Job) {
	pg, ok := httpapi.Paginate(w, r, len(jobs))
	if !ok {
		return
	}
	out := []restapi.JobJSON{}
	for _, j := range jobs[pg.From:pg.To] {
		arts, err := s.store.ListArtifacts(r.Context(), j.ID)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing artifacts", err)
			return
		}
		out = append(out, s.jobJSON(j, arts))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handlePipelineJobs(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	scopes, ok := jobScopes(w, r)
	if !ok {
		return
	}
	jobs, err := s.store.ListJobs(r.Context(), store.JobFilter{PipelineID: pl.ID, Statuses: scopes})
	if err != nil {
		httpapi.InternalError(s.log, w, "listing jobs", err)
		return
	}
	if r.URL.Query().Get("include_retried") != "true" {
		jobs = slices.DeleteFunc(jobs, func(j *store.Job) bool { return j.Retried })
	}
	// Trigger jobs are listed by /bridges, as in GitLab.
	jobs = slices.DeleteFunc(jobs, graph.IsBridge)
	s.writeJobs(w, r, jobs)
}

func (s *API) handleProjectJobs(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	scopes, ok := jobScopes(w, r)
	if !ok {
		return
	}
	jobs, err := s.store.ListJobs(r.Context(), store.JobFilter{ProjectID: p.ID, Statuses: scopes})
	if err != nil {
		httpapi.InternalError(s.log, w, "listing jobs", err)
		return
	}
	slices.Reverse(jobs) // newest first, as GitLab
	s.writeJobs(w, r, slices.DeleteFunc(jobs, graph.IsBridge))
}

func (s *API) handleCancelPipeline(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil || !s.mayAccess(w, r, pl.ProjectID, store.ActAccess(pl.Protected)) {
		return
	}
	out, err := s.pipelines.CancelPipeline(r.Context(), pl.ID)
	if err != nil {
		s.apiError(w, "canceling pipeline", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.pipelineJSON(out))
}

// handleDeletePipeline: DELETE /projects/:project/pipelines/:pipeline
// (the project's owners and instance admins, as GitLab) deletes the
// pipeline, its jobs and everything they stored: 204.
func (s *API) handleDeletePipeline(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	if err := s.pipelines.DeletePipeline(r.Context(), pl.ID); err != nil {
		s.apiError(w, "deleting pipeline", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *API) handleRetryPipeline(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil || !s.mayAccess(w, r, pl.ProjectID, store.ActAccess(pl.Protected)) {
		return
	}
	out, err := s.pipelines.RetryPipeline(r.Context(), pl.ID)
	if err != nil {
		s.apiError(w, "retrying pipeline", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, s.pipelineJSON(out))
}

func (s *API) handleRetryJob(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil || !s.mayAccess(w, r, j.ProjectID, store.ActAccess(j.Protected)) {
		return
	}
	nj, err := s.pipelines.RetryJob(r.Context(), j.ID)
	if err != nil {
		s.apiError(w, "retrying job", err)
		return
	}
	s.writeJob(w, r, http.StatusCreated, nj)
}

func (s *API) handlePlayJob(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil || !s.mayAccess(w, r, j.ProjectID, store.ActAccess(j.Protected)) {
		return
	}
	nj, err := s.pipelines.PlayJob(r.Context(), j.ID)
	if errors.Is(err, pipelines.ErrNotAllowed) {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - Unplayable Job")
		return
	}
	if err != nil {
		s.apiError(w, "playing job", err)
		return
	}
	s.writeJob(w, r, http.StatusOK, nj)
}

func variableJSON(v *store.Variable) restapi.VariableJSON {
	t := "env_var"
	if v.File {
		t = "file"
	}
	return restapi.VariableJSON{Key: v.Key, Value: v.Value, VariableType: t, Protected: v.Protected, Masked: v.Masked,
		Raw: v.Raw, EnvironmentScope: "*", Description: v.Description}
}

// variableRequest is the body of a variable create or update: pointers
// tell "not given" (keep, or the default) from false.
type variableRequest struct {
	Key              *string `json:"key"`
	Value            *string `json:"value"`
	VariableType     *string `json:"variable_type"`
	Protected        *bool   `json:"protected"`
	Masked           *bool   `json:"masked"`
	Raw              *bool   `json:"raw"`
	EnvironmentScope *string `json:"environment_scope"`
	Description      *string `json:"description"`
}

// decodeVariable reads a variable's parameters (decodeParams).
func decodeVariable(w http.ResponseWriter, r *http.Request) (*variableRequest, bool) {
	var req variableRequest
	return &req, decodeParams(w, r, &req)
}

// apply sets the given fields of req on v and validates the result.
func (req *variableRequest) apply(v *store.Variable) error {
	if req.Value != nil {
		v.Value = *req.Value
	}
	if req.VariableType != nil {
		switch *req.VariableType {
		case "env_var":
			v.File = false
		case "file":
			v.File = true
		default:
			return fmt.Errorf("variable_type must be env_var or file: %w", pipelines.ErrInvalid)
		}
	}
	if req.EnvironmentScope != nil && *req.EnvironmentScope != "*" && *req.EnvironmentScope != "" {
		return fmt.Errorf("environment_scope: Berth has no environments; only * is accepted: %w", pipelines.ErrInvalid)
	}
	for _, f := range []struct {
		p   *bool
		dst *bool
	}{{req.Protected, &v.Protected}, {req.Masked, &v.Masked}, {req.Raw, &v.Raw}} {
		if f.p != nil {
			*f.dst = *f.p
		}
	}
	if req.Description != nil {
		v.Description = *req.Description
	}
	if !pipelines.ValidVariableKey(v.Key) {
		return fmt.Errorf("key %q: only letters, digits and _ are allowed (at most 255): %w", v.Key, pipelines.ErrInvalid)
	}
	if len(v.Value) > 10000 {
		return fmt.Errorf("value is longer than 10000 characters: %w", pipelines.ErrInvalid)
	}
	if v.Masked && (len(v.Value) < 8 || strings.ContainsAny(v.Value, " \t\r\n")) {
		return fmt.Errorf("value: masked variables need at least 8 characters on one line, without spaces: %w", pipelines.ErrInvalid)
	}
	return nil
}

func (s *API) handleListVariables(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	vs, err := s.store.ListVariables(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing variables", err)
		return
	}
	out := []restapi.VariableJSON{}
	for _, v := range vs {
		out = append(out, variableJSON(v))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handleCreateVariable(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	req, ok := decodeVariable(w, r)
	if !ok {
		return
	}
	v := &store.Variable{ProjectID: p.ID}
	if req.Key != nil {
		v.Key = *req.Key
	}
	if err := req.apply(v); err != nil {
		s.apiError(w, "creating variable", err)
		return
	}
	err := s.store.CreateVariable(r.Context(), v)
	if errors.Is(err, store.ErrExists) {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]any{"message": map[string][]string{"key": {"(" + v.Key + ") has already been taken"}}})
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "creating variable", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, variableJSON(v))
}

// variable loads the {key} variable of the {project}, answering 404.
func (s *API) variable(w http.ResponseWriter, r *http.Request) *store.Variable {
	p := s.project(w, r)
	if p == nil {
		return nil
	}
	v, err := s.store.GetVariable(r.Context(), p.ID, r.PathValue("key"))
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Variable Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading variable", err)
		return nil
	}
	return v
}

func (s *API) handleGetVariable(w http.ResponseWriter, r *http.Request) {
	if v := s.variable(w, r); v != nil {
		httpapi.WriteJSON(w, http.StatusOK, variableJSON(v))
	}
}

func (s *API) handleUpdateVariable(w http.ResponseWriter, r *http.Request) {
	v := s.variable(w, r)
	if v == nil {
		return
	}
	req, ok := decodeVariable(w, r)
	if !ok {
		return
	}
	if err := req.apply(v); err != nil {
		s.apiError(w, "updating variable", err)
		return
	}
	if err := s.store.UpdateVariable(r.Context(), v); err != nil {
		s.apiError(w, "updating variable", mapStoreNotFound(err, "variable"))
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, variableJSON(v))
}

func (s *API) handleDeleteVariable(w http.ResponseWriter, r *http.Request) {
	v := s.variable(w, r)
	if v == nil {
		return
	}
	if err := s.store.DeleteVariable(r.Context(), v.ProjectID, v.Key); err != nil {
		s.apiError(w, "deleting variable", mapStoreNotFound(err, "variable"))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func mapStoreNotFound(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%s: %w", what, pipelines.ErrNotFound)
	}
	return err
}

// pipelineVariables converts the API's variables for the engine.
func pipelineVariables(vs []restapi.PipelineVariable) []pipelines.PipelineVariable {
	out := make([]pipelines.PipelineVariable, len(vs))
	for i, v := range vs {
		out[i] = pipelines.PipelineVariable{Key: v.Key, Value: v.Value, VariableType: v.VariableType}
	}
	return out
}
