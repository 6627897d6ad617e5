package resthttp

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// handleCreateRunner: POST /user/runners (admin) creates a runner and
// returns its glrt- token, shown only this once.
func (s *API) handleCreateRunner(w http.ResponseWriter, r *http.Request) {
	var req restapi.CreateRunnerRequest
	if !decodeParams(w, r, &req) {
		return
	}
	rn := &store.Runner{
		Type:            store.RunnerType(req.RunnerType),
		Description:     req.Description,
		MaintenanceNote: req.MaintenanceNote,
		Paused:          req.Paused,
		Locked:          req.Locked,
		Tags:            queue.NormalizeTags(req.TagList),
		MaximumTimeout:  req.MaximumTimeout,
	}
	switch rn.Type {
	case store.InstanceType:
	case store.GroupType:
		if req.GroupID <= 0 {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - group_id is missing for a group_type runner")
			return
		}
		rn.GroupID = req.GroupID
	case store.ProjectType:
		if req.ProjectID <= 0 {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - project_id is missing for a project_type runner")
			return
		}
		rn.ProjectIDs = []int64{req.ProjectID}
	default:
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - runner_type does not have a valid value (instance_type, group_type, project_type)")
		return
	}
	level, ok := runners.ParseAccessLevel(req.AccessLevel)
	if !ok {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - access_level does not have a valid value")
		return
	}
	rn.AccessLevel = level
	// A runner without tags that may not run untagged jobs could run
	// nothing: default run_untagged to "no tags given".
	rn.RunUntagged = httpapi.BoolOr(req.RunUntagged, len(rn.Tags) == 0)
	now := s.clock.Now().UTC().Truncate(time.Second)
	rn.CreatedAt, rn.TokenObtainedAt, rn.TokenExpiresAt = now, now, s.runners.TokenExpiry(now)
	tok, err := s.runners.MintToken(rn)
	if err != nil {
		httpapi.InternalError(s.log, w, "minting a runner token", err)
		return
	}
	rn.TokenDigest = token.Digest(tok)
	if err := s.store.CreateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "creating runner", err)
		return
	}
	s.log.Info("runner created", "runner_id", rn.ID, "type", rn.Type, "token", token.Short(tok))
	httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{ID: rn.ID, Token: tok, TokenExpiresAt: httpapi.RFC3339OrNil(rn.TokenExpiresAt)})
}

func (s *API) handleListRunners(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListRunners(r.Context())
	if err != nil {
		httpapi.InternalError(s.log, w, "listing runners", err)
		return
	}
	out := make([]restapi.RunnerJSON, 0, len(list))
	for _, rn := range list {
		out = append(out, s.runnerJSON(r.Context(), rn))
	}
	pg, ok := httpapi.Paginate(w, r, len(out))
	if !ok {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out[pg.From:pg.To])
}

// runnerJSON is a runner as the API shows it, with its status from its
// managers' contacts.
func (s *API) runnerJSON(ctx context.Context, rn *store.Runner) restapi.RunnerJSON {
	ms, _ := s.store.ListRunnerManagers(ctx, rn.ID)
	st := runners.StatusOf(rn, ms, s.clock.Now())
	var maxTimeout *int
	if rn.MaximumTimeout > 0 {
		v := rn.MaximumTimeout
		maxTimeout = &v
	}
	return restapi.RunnerJSON{
		ID: rn.ID, Description: rn.Description, RunnerType: string(rn.Type), IsShared: rn.Type == store.InstanceType,
		Paused: rn.Paused, Active: !rn.Paused, Locked: rn.Locked, RunUntagged: rn.RunUntagged, TagList: rn.Tags,
		AccessLevel: string(rn.AccessLevel), MaximumTimeout: maxTimeout, Online: st.Online, Status: st.Status,
		ContactedAt: httpapi.RFC3339OrNil(st.ContactedAt), GroupID: rn.GroupID, ProjectIDs: rn.ProjectIDs,
	}
}

// runner is the runner of the path's {id}, answering 400, 404 or 500
// itself when there is none.
func (s *API) runner(w http.ResponseWriter, r *http.Request) (*store.Runner, bool) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return nil, false
	}
	rn, err := s.store.GetRunner(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Not Found")
		return nil, false
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading runner", err)
		return nil, false
	}
	return rn, true
}

// handleGetRunner: GET /runners/:id (admin).
func (s *API) handleGetRunner(w http.ResponseWriter, r *http.Request) {
	if rn, ok := s.runner(w, r); ok {
		httpapi.WriteJSON(w, http.StatusOK, s.runnerJSON(r.Context(), rn))
	}
}

// handleRunnerJobs: GET /runners/:id/jobs (admin) lists the jobs handed
// out to a runner, newest first (sort=asc: oldest), status= one job
// status, paginated.
func (s *API) handleRunnerJobs(w http.ResponseWriter, r *http.Request) {
	rn, ok := s.runner(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := store.JobFilter{RunnerID: rn.ID}
	if st := q.Get("status"); st != "" {
		if !store.Status(st).Valid() {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - status does not have a valid value")
			return
		}
		f.Statuses = []store.Status{store.Status(st)}
	}
	if ob := q.Get("order_by"); ob != "" && ob != "id" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - order_by does not have a valid value (id)")
		return
	}
	sort := q.Get("sort")
	if sort != "" && sort != "asc" && sort != "desc" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - sort does not have a valid value (asc, desc)")
		return
	}
	jobs, err := s.store.ListJobs(r.Context(), f)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing jobs", err)
		return
	}
	if sort != "asc" {
		slices.Reverse(jobs)
	}
	s.writeJobs(w, r, jobs)
}

// handleResetRegistrationToken mints the registration token of a scope
// (instance, a group or a project), replacing the previous one.
func (s *API) handleResetRegistrationToken(scope store.RunnerType) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var scopeID int64
		if scope != store.InstanceType {
			id, err := strconv.ParseInt(r.PathValue("scope"), 10, 64)
			if err != nil || id <= 0 {
				httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
				return
			}
			scopeID = id
		}
		tok, err := s.runners.MintRegistrationToken()
		if err != nil {
			httpapi.InternalError(s.log, w, "minting a registration token", err)
			return
		}
		err = s.store.PutRegistrationToken(r.Context(), store.RegistrationToken{
			Digest: token.Digest(tok), Scope: scope, ScopeID: scopeID, CreatedAt: s.clock.Now().UTC(),
		})
		if err != nil {
			httpapi.InternalError(s.log, w, "storing registration token", err)
			return
		}
		httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{Token: tok})
	}
}

// handleEnableProjectRunner: POST /projects/:project/runners {runner_id}
// lets a project runner also run the jobs of this project. GitLab refuses
// locked runners and runners of other scopes.
func (s *API) handleEnableProjectRunner(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	var req struct {
		RunnerID int64 `json:"runner_id"`
	}
	if !decodeParams(w, r, &req) {
		return
	}
	rn, err := s.store.GetRunner(r.Context(), req.RunnerID)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading runner", err)
		return
	}
	if rn.Type != store.ProjectType {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Runner is a "+string(rn.Type)+" runner; only project runners are assigned to projects")
		return
	}
	if slices.Contains(rn.ProjectIDs, p.ID) {
		httpapi.WriteError(w, http.StatusConflict, "409 Conflict - Runner was already enabled for this project")
		return
	}
	if rn.Locked {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Runner is locked")
		return
	}
	rn.ProjectIDs = append(rn.ProjectIDs, p.ID)
	if err := s.store.UpdateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "updating runner", err)
		return
	}
	s.runners.Changed(rn)
	httpapi.WriteJSON(w, http.StatusCreated, map[string]any{"id": rn.ID, "runner_type": rn.Type, "project_ids": rn.ProjectIDs})
}

// handleDisableProjectRunner: DELETE /projects/:project/runners/:runner.
// A runner's last project cannot be removed (delete the runner instead),
// as in GitLab.
func (s *API) handleDisableProjectRunner(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	id, ok := httpapi.PathID(w, r, "runner")
	if !ok {
		return
	}
	rn, err := s.store.GetRunner(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !slices.Contains(rn.ProjectIDs, p.ID)) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading runner", err)
		return
	}
	if len(rn.ProjectIDs) == 1 {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Only one project associated with the runner. Please remove the runner instead")
		return
	}
	rn.ProjectIDs = slices.DeleteFunc(rn.ProjectIDs, func(id int64) bool { return id == p.ID })
	if err := s.store.UpdateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "updating runner", err)
		return
	}
	s.runners.Changed(rn)
	w.WriteHeader(http.StatusNoContent)
}

// handleUpdateRunner: PUT /runners/:id (admin). A paused runner gets no
// more jobs from any replica: each forgets its copy of the runner.
func (s *API) handleUpdateRunner(w http.ResponseWriter, r *http.Request) {
	rn, ok := s.runner(w, r)
	if !ok {
		return
	}
	var req restapi.UpdateRunnerRequest
	if !decodeParams(w, r, &req) {
		return
	}
	if req.Description != nil {
		rn.Description = *req.Description
	}
	if req.MaintenanceNote != nil {
		rn.MaintenanceNote = *req.MaintenanceNote
	}
	if req.Active != nil {
		rn.Paused = !*req.Active
	}
	if req.Paused != nil {
		rn.Paused = *req.Paused
	}
	if req.TagList != nil {
		rn.Tags = queue.NormalizeTags(*req.TagList)
	}
	if req.RunUntagged != nil {
		rn.RunUntagged = *req.RunUntagged
	}
	if req.Locked != nil {
		rn.Locked = *req.Locked
	}
	if req.AccessLevel != nil {
		switch al := store.AccessLevel(*req.AccessLevel); al {
		case store.NotProtected, store.RefProtected:
			rn.AccessLevel = al
		default:
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - access_level does not have a valid value")
			return
		}
	}
	if req.MaximumTimeout != nil {
		if *req.MaximumTimeout != 0 && *req.MaximumTimeout < 600 {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - maximum_timeout must be at least 600 seconds (or 0: no limit)")
			return
		}
		rn.MaximumTimeout = *req.MaximumTimeout
	}
	if !rn.RunUntagged && len(rn.Tags) == 0 {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - a runner without tags must run untagged jobs")
		return
	}
	if err := s.store.UpdateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "updating runner", err)
		return
	}
	s.runners.Changed(rn)
	s.log.Info("runner updated", "runner_id", rn.ID, "paused", rn.Paused)
	httpapi.WriteJSON(w, http.StatusOK, s.runnerJSON(r.Context(), rn))
}

// handleDeleteRunner: DELETE /runners/:id (admin).
func (s *API) handleDeleteRunner(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	rn, err := s.store.GetRunner(r.Context(), id)
	if err == nil {
		err = s.store.DeleteRunner(r.Context(), id)
	}
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "deleting runner", err)
		return
	}
	s.runners.Deleted(rn)
	s.log.Info("runner deleted", "runner_id", rn.ID)
	w.WriteHeader(http.StatusNoContent)
}
