package coordinator

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

func validAccessLevel(a string) (store.AccessLevel, bool) {
	switch a {
	case "", string(store.NotProtected):
		return store.NotProtected, true
	case string(store.RefProtected):
		return store.RefProtected, true
	}
	return "", false
}

// handleRegister: POST /runners with a registration token (legacy flow).
func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.RegisterRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	if s.cfg.RegistrationDisabled {
		httpapi.WriteError(w, http.StatusGone, "410 Gone - runner registration with registration tokens is disabled")
		return
	}
	if req.Token == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - token is missing")
		return
	}
	rt, err := s.store.RegistrationTokenByDigest(r.Context(), token.Digest(req.Token))
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading registration token", err)
		return
	}
	level, ok := validAccessLevel(req.AccessLevel)
	if !ok {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - access_level does not have a valid value")
		return
	}
	if req.MaximumTimeout != 0 && req.MaximumTimeout < 600 {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - maximum_timeout needs to be at least 10 minutes")
		return
	}
	now := s.clock.Now().UTC().Truncate(time.Second)
	tags := queue.NormalizeTags(req.TagList)
	rn := &store.Runner{
		Type:            rt.Scope,
		Description:     req.Description,
		MaintenanceNote: req.MaintenanceNote,
		Tags:            tags,
		RunUntagged:     boolOr(req.RunUntagged, true),
		Locked:          boolOr(req.Locked, true),
		Paused:          boolOr(req.Paused, false),
		AccessLevel:     level,
		MaximumTimeout:  req.MaximumTimeout,
		Legacy:          true,
		TokenObtainedAt: now,
		TokenExpiresAt:  s.runners.TokenExpiry(now),
		CreatedAt:       now,
	}
	switch rt.Scope {
	case store.GroupType:
		rn.GroupID = rt.ScopeID
	case store.ProjectType:
		rn.ProjectIDs = []int64{rt.ScopeID}
	}
	tok := runners.MintToken(rn)
	rn.TokenDigest = token.Digest(tok)
	if err := s.store.CreateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "creating runner", err)
		return
	}
	if req.Info != nil {
		s.runners.NoteOffer(rn, "", req.Info)
	}
	s.log.Info("runner registered", "runner_id", rn.ID, "type", rn.Type, "token", token.Short(tok))
	httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{ID: rn.ID, Token: tok, TokenExpiresAt: httpapi.RFC3339OrNil(rn.TokenExpiresAt)})
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// handleVerify: POST /runners/verify.
func (s *Server) handleVerify(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.VerifyRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	if req.SystemID != "" {
		if _, err := s.runners.TouchManager(r.Context(), rn, req.SystemID, req.Info); err != nil {
			httpapi.InternalError(s.log, w, "recording runner manager", err)
			return
		}
	}
	if req.Info != nil {
		s.runners.NoteOffer(rn, req.SystemID, req.Info)
	}
	httpapi.WriteJSON(w, http.StatusOK, runnerapi.RunnerTokenResponse{ID: rn.ID, Token: req.Token, TokenExpiresAt: httpapi.RFC3339OrNil(rn.TokenExpiresAt)})
}

// runnerOrFail authenticates a runner token, answering 403 (or 500)
// itself on failure.
func (s *Server) runnerOrFail(w http.ResponseWriter, r *http.Request, bodyToken string) (*store.Runner, bool) {
	rn, err := s.authRunner(r.Context(), r, bodyToken)
	if errors.Is(err, runners.ErrForbidden) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil, false
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "authenticating runner", err)
		return nil, false
	}
	return rn, true
}

// handleUnregister: DELETE /runners removes the whole runner.
func (s *Server) handleUnregister(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	if err := s.store.DeleteRunner(r.Context(), rn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		httpapi.InternalError(s.log, w, "deleting runner", err)
		return
	}
	s.runners.Deleted(rn)
	s.log.Info("runner unregistered", "runner_id", rn.ID)
	w.WriteHeader(http.StatusNoContent)
}

// handleDeleteManager: DELETE /runners/managers removes one machine.
func (s *Server) handleDeleteManager(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.ManagerRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	if req.SystemID == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - system_id is missing")
		return
	}
	err := s.store.DeleteRunnerManager(r.Context(), rn.ID, req.SystemID)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Manager Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "deleting runner manager", err)
		return
	}
	s.runners.ForgetManager(rn.ID, req.SystemID)
	w.WriteHeader(http.StatusNoContent)
}

// handleResetRunnerToken: POST /runners/reset_authentication_token. The
// old token stops working at once.
func (s *Server) handleResetRunnerToken(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	now := s.clock.Now().UTC().Truncate(time.Second)
	tok := runners.MintToken(rn)
	exp := s.runners.TokenExpiry(now)
	err := s.store.RotateRunnerToken(r.Context(), rn.ID, rn.TokenDigest, token.Digest(tok), now, exp)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		s.runners.Changed(rn)
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "rotating runner token", err)
		return
	}
	s.runners.Changed(rn)
	s.log.Info("runner token rotated", "runner_id", rn.ID, "token", token.Short(tok))
	httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{Token: tok, TokenExpiresAt: httpapi.RFC3339OrNil(exp)})
}

// CreateRunnerRequest is the body of POST /api/v4/user/runners.
type CreateRunnerRequest struct {
	RunnerType      string            `json:"runner_type"`
	GroupID         int64             `json:"group_id,omitempty"`
	ProjectID       int64             `json:"project_id,omitempty"`
	Description     string            `json:"description,omitempty"`
	MaintenanceNote string            `json:"maintenance_note,omitempty"`
	Paused          bool              `json:"paused,omitempty"`
	Locked          bool              `json:"locked,omitempty"`
	RunUntagged     *bool             `json:"run_untagged,omitempty"`
	TagList         runnerapi.TagList `json:"tag_list,omitempty"`
	AccessLevel     string            `json:"access_level,omitempty"`
	MaximumTimeout  int               `json:"maximum_timeout,omitempty"`
}

// handleCreateRunner: POST /user/runners (admin) creates a runner and
// returns its glrt- token, shown only this once.
func (s *Server) handleCreateRunner(w http.ResponseWriter, r *http.Request) {
	var req CreateRunnerRequest
	if !httpapi.DecodeJSON(w, r, &req) {
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
	level, ok := validAccessLevel(req.AccessLevel)
	if !ok {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - access_level does not have a valid value")
		return
	}
	rn.AccessLevel = level
	// A runner without tags that may not run untagged jobs could run
	// nothing: default run_untagged to "no tags given".
	rn.RunUntagged = boolOr(req.RunUntagged, len(rn.Tags) == 0)
	now := s.clock.Now().UTC().Truncate(time.Second)
	rn.CreatedAt, rn.TokenObtainedAt, rn.TokenExpiresAt = now, now, s.runners.TokenExpiry(now)
	tok := runners.MintToken(rn)
	rn.TokenDigest = token.Digest(tok)
	if err := s.store.CreateRunner(r.Context(), rn); err != nil {
		httpapi.InternalError(s.log, w, "creating runner", err)
		return
	}
	s.log.Info("runner created", "runner_id", rn.ID, "type", rn.Type, "token", token.Short(tok))
	httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{ID: rn.ID, Token: tok, TokenExpiresAt: httpapi.RFC3339OrNil(rn.TokenExpiresAt)})
}

// RunnerJSON is a runner as GET /runners/all lists it.
type RunnerJSON struct {
	ID             int64    `json:"id"`
	Description    string   `json:"description"`
	RunnerType     string   `json:"runner_type"`
	IsShared       bool     `json:"is_shared"`
	Paused         bool     `json:"paused"`
	Active         bool     `json:"active"`
	Locked         bool     `json:"locked"`
	RunUntagged    bool     `json:"run_untagged"`
	TagList        []string `json:"tag_list"`
	AccessLevel    string   `json:"access_level"`
	MaximumTimeout *int     `json:"maximum_timeout"`
	Online         bool     `json:"online"`
	Status         string   `json:"status"`
	ContactedAt    *string  `json:"contacted_at"`
	GroupID        int64    `json:"group_id,omitempty"`
	ProjectIDs     []int64  `json:"project_ids,omitempty"`
}

func (s *Server) handleListRunners(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListRunners(r.Context())
	if err != nil {
		httpapi.InternalError(s.log, w, "listing runners", err)
		return
	}
	now := s.clock.Now()
	out := make([]RunnerJSON, 0, len(list))
	for _, rn := range list {
		contacted := rn.ContactedAt
		if ms, err := s.store.ListRunnerManagers(r.Context(), rn.ID); err == nil {
			for _, m := range ms {
				if m.ContactedAt.After(contacted) {
					contacted = m.ContactedAt
				}
			}
		}
		online := !contacted.IsZero() && now.Sub(contacted) < runners.OnlineWindow
		status := "never_contacted"
		switch {
		case rn.Paused:
			status = "paused"
		case online:
			status = "online"
		case !contacted.IsZero():
			status = "offline"
		}
		var maxTimeout *int
		if rn.MaximumTimeout > 0 {
			v := rn.MaximumTimeout
			maxTimeout = &v
		}
		out = append(out, RunnerJSON{
			ID: rn.ID, Description: rn.Description, RunnerType: string(rn.Type), IsShared: rn.Type == store.InstanceType,
			Paused: rn.Paused, Active: !rn.Paused, Locked: rn.Locked, RunUntagged: rn.RunUntagged, TagList: rn.Tags,
			AccessLevel: string(rn.AccessLevel), MaximumTimeout: maxTimeout, Online: online, Status: status,
			ContactedAt: httpapi.RFC3339OrNil(contacted), GroupID: rn.GroupID, ProjectIDs: rn.ProjectIDs,
		})
	}
	pg, ok := httpapi.Paginate(w, r, len(out))
	if !ok {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out[pg.From:pg.To])
}

// handleResetRegistrationToken mints the registration token of a scope
// (instance, a group or a project), replacing the previous one.
func (s *Server) handleResetRegistrationToken(scope store.RunnerType) http.HandlerFunc {
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
		tok := token.NewRegistration()
		err := s.store.PutRegistrationToken(r.Context(), store.RegistrationToken{
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
func (s *Server) handleEnableProjectRunner(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	var req struct {
		RunnerID int64 `json:"runner_id"`
	}
	if !httpapi.DecodeJSON(w, r, &req) {
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
func (s *Server) handleDisableProjectRunner(w http.ResponseWriter, r *http.Request) {
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

// UpdateRunnerRequest is PUT /runners/:id, GitLab's "update a runner's
// details"; absent fields are left as they are. (GitLab's deprecated
// active is paused's opposite.)
type UpdateRunnerRequest struct {
	Description     *string   `json:"description,omitempty"`
	MaintenanceNote *string   `json:"maintenance_note,omitempty"`
	Paused          *bool     `json:"paused,omitempty"`
	Active          *bool     `json:"active,omitempty"`
	TagList         *[]string `json:"tag_list,omitempty"`
	RunUntagged     *bool     `json:"run_untagged,omitempty"`
	Locked          *bool     `json:"locked,omitempty"`
	AccessLevel     *string   `json:"access_level,omitempty"`
	MaximumTimeout  *int      `json:"maximum_timeout,omitempty"`
}

// handleUpdateRunner: PUT /runners/:id (admin). A paused runner gets no
// more jobs from any replica: each forgets its copy of the runner.
func (s *Server) handleUpdateRunner(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	var req UpdateRunnerRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, err := s.store.GetRunner(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Runner Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading runner", err)
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
	s.queue.Forget(rn.ID)
	s.log.Info("runner updated", "runner_id", rn.ID, "paused", rn.Paused)
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"id": rn.ID, "description": rn.Description, "paused": rn.Paused,
		"active": !rn.Paused, "tag_list": rn.Tags, "run_untagged": rn.RunUntagged, "locked": rn.Locked,
		"access_level": rn.AccessLevel, "maximum_timeout": rn.MaximumTimeout, "runner_type": rn.Type})
}

// handleDeleteRunner: DELETE /runners/:id (admin).
func (s *Server) handleDeleteRunner(w http.ResponseWriter, r *http.Request) {
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
