package resthttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Pipeline triggers: GitLab's trigger tokens API (maintainers manage a
// project's tokens) and POST /projects/:id/trigger/pipeline, which takes
// a trigger token or a running job's CI_JOB_TOKEN instead of a user's.

func (s *API) triggerRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v4/projects/{project}/trigger/pipeline", s.handleTriggerPipeline)
	mux.HandleFunc("POST /api/v4/projects/{project}/ref/{ref}/trigger/pipeline", s.handleTriggerPipeline)
	base := "/api/v4/projects/{project}/triggers"
	mux.HandleFunc("GET "+base, s.projectMember(store.AccessMaintainer, s.handleListTriggers))
	mux.HandleFunc("POST "+base, s.projectMember(store.AccessMaintainer, s.handleCreateTrigger))
	mux.HandleFunc("GET "+base+"/{trigger}", s.projectMember(store.AccessMaintainer, s.handleGetTrigger))
	mux.HandleFunc("PUT "+base+"/{trigger}", s.projectMember(store.AccessMaintainer, s.handleUpdateTrigger))
	mux.HandleFunc("DELETE "+base+"/{trigger}", s.projectMember(store.AccessMaintainer, s.handleDeleteTrigger))
}

// triggerParams are the trigger API's parameters, from a JSON body or a
// form (variables[KEY]=VALUE, inputs[NAME]=VALUE) and the query.
type triggerParams struct {
	Token     string            `json:"token"`
	Ref       string            `json:"ref"`
	Variables map[string]string `json:"-"`
	Inputs    map[string]any    `json:"inputs"`
}

// decodeTriggerParams reads the parameters (decodeParams: a form's
// variables[KEY]=VALUE is the hash JSON's variables is); it answers 400
// or 413 itself.
func decodeTriggerParams(w http.ResponseWriter, r *http.Request) (*triggerParams, bool) {
	var in struct {
		Token     string         `json:"token"`
		Ref       string         `json:"ref"`
		Variables map[string]any `json:"variables"`
		Inputs    map[string]any `json:"inputs"`
	}
	if !decodeParams(w, r, &in) {
		return nil, false
	}
	p := &triggerParams{Token: in.Token, Ref: in.Ref, Inputs: in.Inputs, Variables: map[string]string{}}
	for k, v := range in.Variables {
		sv, ok := v.(string)
		if !ok {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - variables needs to be a map of key-valued strings")
			return nil, false
		}
		p.Variables[k] = sv
	}
	if ref := r.PathValue("ref"); ref != "" {
		p.Ref = ref // …/ref/:ref/trigger/pipeline
	}
	var missing []string
	if p.Ref == "" {
		missing = append(missing, "ref is missing")
	}
	if p.Token == "" {
		missing = append(missing, "token is missing")
	}
	if missing != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": strings.Join(missing, ", ")})
		return nil, false
	}
	return p, true
}

// payload is TRIGGER_PAYLOAD: the parameters but the token.
func (p *triggerParams) payload(project string) string {
	m := map[string]any{"ref": p.Ref, "id": project, "variables": p.Variables}
	if p.Inputs != nil {
		m["inputs"] = p.Inputs
	}
	b, _ := json.Marshal(m) // maps of strings and JSON values: cannot fail
	return string(b)
}

func (p *triggerParams) request(projectID int64, project string) pipelines.TriggerRequest {
	req := pipelines.TriggerRequest{ProjectID: projectID, Ref: p.Ref, Inputs: p.Inputs, Payload: p.payload(project)}
	keys := make([]string, 0, len(p.Variables))
	for k := range p.Variables {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		req.Variables = append(req.Variables, pipelines.PipelineVariable{Key: k, Value: p.Variables[k]})
	}
	return req
}

// handleTriggerPipeline: POST /projects/:id/trigger/pipeline (and
// …/ref/:ref/trigger/pipeline, the webhook form) with a trigger token
// or a running job's CI_JOB_TOKEN in token → 201 pipeline.
func (s *API) handleTriggerPipeline(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Gitlab-Event") == "Pipeline Hook" {
		// A pipeline webhook pointed at the trigger URL would trigger
		// itself forever (GitLab refuses it the same way).
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - a pipeline event cannot trigger a pipeline")
		return
	}
	params, ok := decodeTriggerParams(w, r)
	if !ok {
		return
	}
	// Without a valid token, a project that does not exist and one that
	// does are the same 404: the endpoint takes no user's token, and must
	// not tell anyone which private projects exist.
	ctx := r.Context()
	p, err := s.pipelines.Project(ctx, r.PathValue("project"))
	if errors.Is(err, pipelines.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	if err != nil {
		s.apiError(w, "loading project", err)
		return
	}
	req := params.request(p.ID, r.PathValue("project"))
	if t, err := s.store.PipelineTriggerByDigest(ctx, token.Digest(params.Token)); err == nil {
		if t.ProjectID != p.ID {
			httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
			return
		}
		if !t.ExpiresAt.IsZero() && !s.clock.Now().Before(t.ExpiresAt) {
			httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - the trigger token expired")
			return
		}
		pl, err := s.pipelines.TriggerWithToken(ctx, t, req)
		s.answerTriggered(w, pl, err)
		return
	} else if !errors.Is(err, store.ErrNotFound) {
		httpapi.InternalError(s.log, w, "finding a trigger token", err)
		return
	}
	j, _, err := s.dispatch.Authenticate(ctx, params.Token)
	switch {
	case errors.Is(err, dispatch.ErrBadToken):
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	case errors.Is(err, dispatch.ErrJobNotRunning), errors.Is(err, jobtoken.ErrExpired):
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized - the job token's job is not running")
		return
	case err != nil:
		httpapi.InternalError(s.log, w, "authenticating job token", err)
		return
	}
	pl, err := s.pipelines.TriggerFromJob(ctx, j, req)
	s.answerTriggered(w, pl, err)
}

func (s *API) answerTriggered(w http.ResponseWriter, pl *store.Pipeline, err error) {
	if err != nil {
		s.apiError(w, "triggering a pipeline", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, s.pipelineJSON(pl))
}

func (s *API) triggerJSON(r *http.Request, t *store.PipelineTrigger, tok string, owners map[int64]restapi.UserBasicJSON) (restapi.PipelineTriggerJSON, error) {
	owner, err := s.userBasic(r, t.OwnerID, owners)
	if tok == "" {
		tok = t.TokenHint
	}
	return restapi.PipelineTriggerJSON{ID: t.ID, Token: tok, Description: t.Description, CreatedAt: httpapi.RFC3339OrNil(t.CreatedAt),
		UpdatedAt: httpapi.RFC3339OrNil(t.UpdatedAt), LastUsed: httpapi.RFC3339OrNil(t.LastUsed), ExpiresAt: httpapi.RFC3339OrNil(t.ExpiresAt),
		Owner: owner}, err
}

func (s *API) writeTrigger(w http.ResponseWriter, r *http.Request, code int, t *store.PipelineTrigger, tok string) {
	out, err := s.triggerJSON(r, t, tok, nil)
	if err != nil {
		httpapi.InternalError(s.log, w, "showing a trigger token", err)
		return
	}
	httpapi.WriteJSON(w, code, out)
}

func (s *API) handleListTriggers(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	ts, err := s.store.ListPipelineTriggers(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing trigger tokens", err)
		return
	}
	pg, ok := httpapi.Paginate(w, r, len(ts))
	if !ok {
		return
	}
	owners := map[int64]restapi.UserBasicJSON{}
	out := []restapi.PipelineTriggerJSON{}
	for _, t := range ts[pg.From:pg.To] {
		j, err := s.triggerJSON(r, t, "", owners)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing trigger tokens", err)
			return
		}
		out = append(out, j)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// trigger loads the {trigger} of the {project}, answering 404 itself.
func (s *API) trigger(w http.ResponseWriter, r *http.Request) *store.PipelineTrigger {
	p := s.project(w, r)
	if p == nil {
		return nil
	}
	id, ok := httpapi.PathID(w, r, "trigger")
	if !ok {
		return nil
	}
	t, err := s.store.GetPipelineTrigger(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || err == nil && t.ProjectID != p.ID {
		httpapi.WriteError(w, http.StatusNotFound, "404 Trigger Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading trigger token", err)
		return nil
	}
	return t
}

func (s *API) handleGetTrigger(w http.ResponseWriter, r *http.Request) {
	if t := s.trigger(w, r); t != nil {
		s.writeTrigger(w, r, http.StatusOK, t, "")
	}
}

// triggerRequest is the body of a trigger token's create or update.
type triggerRequest struct {
	Description *string `json:"description"`
	ExpiresAt   *string `json:"expires_at"`
}

func decodeTrigger(w http.ResponseWriter, r *http.Request) (*triggerRequest, bool) {
	var req triggerRequest
	return &req, decodeParams(w, r, &req)
}

// parseExpiry reads expires_at as GitLab's DateTime parameter does: a
// date (midnight UTC) or an RFC 3339 time.
func parseExpiry(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02", time.RFC3339, "2006-01-02T15:04:05", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("expires_at %q is not a date (2026-12-31) or a time (2026-12-31T18:00:00Z)", s)
}

func (s *API) handleCreateTrigger(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	req, ok := decodeTrigger(w, r)
	if !ok {
		return
	}
	if req.Description == nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "description is missing"})
		return
	}
	now := s.clock.Now().UTC()
	t := &store.PipelineTrigger{ProjectID: p.ID, Description: *req.Description, CreatedAt: now, UpdatedAt: now}
	if req.ExpiresAt != nil && *req.ExpiresAt != "" {
		at, err := parseExpiry(*req.ExpiresAt)
		if err == nil && !at.After(now) {
			err = fmt.Errorf("expires_at %s is not in the future", at.Format(time.RFC3339))
		}
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
			return
		}
		t.ExpiresAt = at
	}
	if who := principalOf(r); who.User != nil {
		t.OwnerID = who.User.ID
	}
	tok, err := s.runners.MintTriggerToken()
	if err != nil {
		httpapi.InternalError(s.log, w, "minting a trigger token", err)
		return
	}
	t.TokenDigest, t.TokenHint = token.Digest(tok), tok[:min(len(tok), len(token.PrefixTrigger)+4)]
	if err := s.store.CreatePipelineTrigger(r.Context(), t); err != nil {
		httpapi.InternalError(s.log, w, "creating a trigger token", err)
		return
	}
	s.log.Info("trigger token created", "project_id", p.ID, "trigger_id", t.ID, "token", token.Short(tok))
	s.writeTrigger(w, r, http.StatusCreated, t, tok)
}

func (s *API) handleUpdateTrigger(w http.ResponseWriter, r *http.Request) {
	t := s.trigger(w, r)
	if t == nil {
		return
	}
	req, ok := decodeTrigger(w, r)
	if !ok {
		return
	}
	if who := principalOf(r); !who.Admin() && (who.User == nil || who.User.ID != t.OwnerID) {
		forbidden(w, who, "change this trigger token (only its owner may)")
		return
	}
	if req.Description != nil {
		t.Description = *req.Description
	}
	t.UpdatedAt = s.clock.Now().UTC()
	if err := s.store.UpdatePipelineTrigger(r.Context(), t); errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Trigger Not Found")
		return
	} else if err != nil {
		httpapi.InternalError(s.log, w, "updating a trigger token", err)
		return
	}
	s.writeTrigger(w, r, http.StatusOK, t, "")
}

func (s *API) handleDeleteTrigger(w http.ResponseWriter, r *http.Request) {
	t := s.trigger(w, r)
	if t == nil {
		return
	}
	if err := s.store.DeletePipelineTrigger(r.Context(), t.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		httpapi.InternalError(s.log, w, "deleting a trigger token", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
