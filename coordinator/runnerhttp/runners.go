package runnerhttp

import (
	"errors"
	"net/http"
	"time"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// handleRegister: POST /runners with a registration token (legacy flow).
func (s *API) handleRegister(w http.ResponseWriter, r *http.Request) {
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
	level, ok := runners.ParseAccessLevel(req.AccessLevel)
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
		RunUntagged:     httpapi.BoolOr(req.RunUntagged, true),
		Locked:          httpapi.BoolOr(req.Locked, true),
		Paused:          httpapi.BoolOr(req.Paused, false),
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
	if req.Info != nil {
		s.runners.NoteOffer(rn, "", req.Info)
	}
	s.log.Info("runner registered", "runner_id", rn.ID, "type", rn.Type, "token", token.Short(tok))
	httpapi.WriteJSON(w, http.StatusCreated, runnerapi.RunnerTokenResponse{ID: rn.ID, Token: tok, TokenExpiresAt: httpapi.RFC3339OrNil(rn.TokenExpiresAt)})
}

// handleVerify: POST /runners/verify.
func (s *API) handleVerify(w http.ResponseWriter, r *http.Request) {
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
func (s *API) runnerOrFail(w http.ResponseWriter, r *http.Request, bodyToken string) (*store.Runner, bool) {
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
func (s *API) handleUnregister(w http.ResponseWriter, r *http.Request) {
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
func (s *API) handleDeleteManager(w http.ResponseWriter, r *http.Request) {
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
func (s *API) handleResetRunnerToken(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	now := s.clock.Now().UTC().Truncate(time.Second)
	tok, err := s.runners.MintToken(rn)
	if err != nil {
		httpapi.InternalError(s.log, w, "minting a runner token", err)
		return
	}
	exp := s.runners.TokenExpiry(now)
	err = s.store.RotateRunnerToken(r.Context(), rn.ID, rn.TokenDigest, token.Digest(tok), now, exp)
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
