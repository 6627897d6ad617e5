package resthttp

import (
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// userRoutes registers Berth's web UI users (admin token) and the runner
// managers' fleet reports (runner token).
func (s *API) userRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v4/berth/users", s.admin(s.handleCreateUser))
	mux.HandleFunc("GET /api/v4/berth/users", s.admin(s.handleListUsers))
	mux.HandleFunc("DELETE /api/v4/berth/users/{id}", s.admin(s.handleDeleteUser))
	mux.HandleFunc("PUT /api/v4/berth/runners/fleet", s.handleFleetReport)
}

func userJSON(u *store.User) restapi.UserJSON {
	return restapi.UserJSON{ID: u.ID, Name: u.Name, Role: string(u.Role), CreatedAt: httpapi.RFC3339OrNil(u.CreatedAt)}
}

// ValidUserName reports whether name can name a user: 1 to 64 letters,
// digits, '.', '_' or '-'.
func ValidUserName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("._-", r)) {
			return false
		}
	}
	return true
}

// handleCreateUser: POST /berth/users (admin) creates a web UI user and
// answers its token, shown only this once.
func (s *API) handleCreateUser(w http.ResponseWriter, r *http.Request) {
	var req restapi.CreateUserRequest
	if !decodeParams(w, r, &req) {
		return
	}
	if !ValidUserName(req.Name) {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - name: 1 to 64 letters, digits, '.', '_' or '-'")
		return
	}
	role := store.Role(req.Role)
	if req.Role == "" {
		role = store.RoleReadOnly
	}
	if !role.Valid() {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - role must be admin or read-only")
		return
	}
	tok, err := s.runners.MintPersonalToken()
	if err != nil {
		httpapi.InternalError(s.log, w, "minting a token", err)
		return
	}
	u := &store.User{Name: req.Name, Role: role, TokenDigest: token.Digest(tok), CreatedAt: s.clock.Now().UTC().Truncate(time.Second)}
	err = s.store.CreateUser(r.Context(), u)
	if errors.Is(err, store.ErrExists) {
		httpapi.WriteError(w, http.StatusConflict, "409 Conflict - a user named "+req.Name+" exists")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "creating user", err)
		return
	}
	s.log.Info("user created", "user_id", u.ID, "name", u.Name, "role", u.Role, "token", token.Short(tok))
	out := userJSON(u)
	out.Token = tok
	httpapi.WriteJSON(w, http.StatusCreated, out)
}

func (s *API) handleListUsers(w http.ResponseWriter, r *http.Request) {
	us, err := s.store.ListUsers(r.Context())
	if err != nil {
		httpapi.InternalError(s.log, w, "listing users", err)
		return
	}
	out := []restapi.UserJSON{}
	for _, u := range us {
		out = append(out, userJSON(u))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handleDeleteUser: DELETE /berth/users/:id (admin); the user's sessions
// end with it.
func (s *API) handleDeleteUser(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	err := s.store.DeleteUser(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 User Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "deleting user", err)
		return
	}
	s.log.Info("user deleted", "user_id", id)
	w.WriteHeader(http.StatusNoContent)
}

// handleFleetReport: PUT /berth/runners/fleet (RUNNER-TOKEN) records a
// runner manager's fleet (runnerapi.Fleet) for the web UI. 204 whether
// it was written or dropped as too soon after the last.
func (s *API) handleFleetReport(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(runnerapi.HeaderRunnerToken) == "" {
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	}
	rn, ok := s.runnerOrFail(w, r)
	if !ok {
		return
	}
	var f runnerapi.Fleet
	if !httpapi.DecodeJSON(w, r, &f) {
		return
	}
	_, err := s.runners.ReportFleet(r.Context(), rn, &f)
	if errors.Is(err, runners.ErrBadFleet) {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	if errors.Is(err, store.ErrNotFound) {
		// The runner went between authentication and the write.
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "recording a fleet report", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
