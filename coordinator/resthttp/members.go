package resthttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
)

// memberRoutes registers GitLab's project members API. A project's admins
// (maintainers, owners) and instance admins read and manage its members,
// as GitLab: a maintainer gives at most the maintainer level and leaves
// owners alone, an owner manages everyone; any member may leave; the last
// owner stays (an instance admin may still remove them). A member's
// access level decides what a user may do in the project: maintainers
// and owners are its admins (snapshots, erase).
func (s *API) memberRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v4/projects/{project}/members", s.projectAdmin(s.handleListMembers))
	mux.HandleFunc("GET /api/v4/projects/{project}/members/all", s.projectAdmin(s.handleListMembers))
	mux.HandleFunc("GET /api/v4/projects/{project}/members/{user}", s.projectAdmin(s.handleGetMember))
	mux.HandleFunc("POST /api/v4/projects/{project}/members", s.projectAdmin(s.handleAddMember))
	mux.HandleFunc("PUT /api/v4/projects/{project}/members/{user}", s.projectAdmin(s.handleUpdateMember))
	// Any member: leaving is removing oneself.
	mux.HandleFunc("DELETE /api/v4/projects/{project}/members/{user}", s.projectMember(store.AccessGuest, s.handleRemoveMember))
	mux.HandleFunc("GET /api/v4/user", s.authed(s.handleCurrentUser))
}

// mayManage answers 403 itself unless the request's principal may change
// user target from level from (0: not a member yet) to level to (0:
// removed). Instance admins may do anything; a member only at their own
// level in the project (projectMember found it): maintainers up to the
// maintainer level and not an owner, owners anything; anyone may remove
// themselves (leave). That the project keeps an owner is the store's to
// decide, in the change itself (changeMember).
func (s *API) mayManage(w http.ResponseWriter, r *http.Request, target int64, from, to store.MemberAccess) bool {
	a, ok := r.Context().Value(accessKey{}).(*access)
	if !ok || a.who.Admin() {
		return true
	}
	self := a.who.User != nil && a.who.User.ID == target
	switch {
	case self && to == 0 && from < store.AccessOwner:
		return true // leaving
	case a.level < store.AccessMaintainer:
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - only the project's maintainers and owners manage its members")
		return false
	case a.level < store.AccessOwner && (from >= store.AccessOwner || to >= store.AccessOwner):
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - a maintainer gives at most the maintainer level and cannot change or remove an owner")
		return false
	}
	return true
}

// handleCurrentUser: GET /user, GitLab's "the user of this token" that
// API clients call to check a token: the user, or "admin" (id 0) for
// the admin token.
func (s *API) handleCurrentUser(w http.ResponseWriter, r *http.Request) {
	who := principalOf(r)
	out := restapi.CurrentUserJSON{Username: "admin", Name: "Administrator", State: "active", IsAdmin: true}
	if who.User != nil {
		u := who.User
		out = restapi.CurrentUserJSON{ID: u.ID, Username: u.Name, Name: u.Name, State: "active", IsAdmin: u.Role == store.RoleAdmin,
			CreatedAt: httpapi.RFC3339OrNil(u.CreatedAt)}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// projectAdmin wraps a handler of /projects/:project/… for the project's
// admins: instance admins and the project's maintainers and owners.
func (s *API) projectAdmin(h http.HandlerFunc) http.HandlerFunc {
	return s.projectMember(store.AccessMaintainer, h)
}

// projectMember wraps a handler of /projects/:project/… for instance
// admins and the project's members at level or above. 401 without a
// token, 403 for anyone else; 404 for a project that does not exist, to
// anyone but an instance admin (whose handler decides). The handler finds
// the principal and its level in the request's context (mayAccess).
func (s *API) projectMember(level store.MemberAccess, h http.HandlerFunc) http.HandlerFunc {
	return s.authed(func(w http.ResponseWriter, r *http.Request) {
		a := r.Context().Value(accessKey{}).(*access)
		if !a.who.Admin() {
			p := s.project(w, r)
			if p == nil {
				return
			}
			var err error
			if a.level, err = a.who.Access(r.Context(), s.store, p.ID); err != nil {
				httpapi.InternalError(s.log, w, "checking a user's membership", err)
				return
			}
			a.project = p.ID
			if a.level < level {
				httpapi.NotAllowed(w, a.who, level, "project "+p.Path)
				return
			}
		}
		h(w, r)
	})
}

// authed wraps a handler for any known token (the handler checks what
// it reads, with principalOf and mayAccess).
func (s *API) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, ok := httpapi.Authenticate(w, r, s.store, s.log)
		if !ok {
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), accessKey{}, &access{who: who})))
	}
}

// access is whom a request speaks for and, once projectMember looked, its
// level in the project of the path.
type access struct {
	who     *httpapi.Principal
	project int64
	level   store.MemberAccess
}

type accessKey struct{}

// principalOf is whom the request speaks for (authed, projectMember); nil
// for a handler behind admin, whose token is the admin token.
func principalOf(r *http.Request) *httpapi.Principal {
	if a, ok := r.Context().Value(accessKey{}).(*access); ok {
		return a.who
	}
	return nil
}

// mayAccess answers 403 itself unless the request's principal has level
// in project projectID (the level projectMember found for it, else asked
// of the store).
func (s *API) mayAccess(w http.ResponseWriter, r *http.Request, projectID int64, level store.MemberAccess) bool {
	a, ok := r.Context().Value(accessKey{}).(*access)
	if !ok || a.who.Admin() {
		return true
	}
	l := a.level
	if a.project != projectID || projectID == 0 {
		var err error
		if l, err = a.who.Access(r.Context(), s.store, projectID); err != nil {
			httpapi.InternalError(s.log, w, "checking a user's membership", err)
			return false
		}
	}
	if l < level {
		httpapi.NotAllowed(w, a.who, level, fmt.Sprintf("project %d", projectID))
		return false
	}
	return true
}

func memberJSON(m *store.ProjectMember) restapi.MemberJSON {
	return restapi.MemberJSON{ID: m.UserID, Username: m.UserName, Name: m.UserName, State: "active", AccessLevel: int(m.AccessLevel),
		CreatedAt: httpapi.RFC3339OrNil(m.CreatedAt)}
}

func (s *API) handleListMembers(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	ms, err := s.store.ListProjectMembers(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing members", err)
		return
	}
	out := make([]restapi.MemberJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, memberJSON(m))
	}
	page, ok := httpapi.Paginate(w, r, len(out))
	if !ok {
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out[page.From:page.To])
}

// member loads the project and the member of the path's :user (an id).
func (s *API) member(w http.ResponseWriter, r *http.Request) (*store.Project, *store.ProjectMember) {
	p := s.project(w, r)
	if p == nil {
		return nil, nil
	}
	uid, ok := httpapi.PathID(w, r, "user")
	if !ok {
		return nil, nil
	}
	m, err := s.store.GetProjectMember(r.Context(), p.ID, uid)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Member Not Found")
		return nil, nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading member", err)
		return nil, nil
	}
	return p, m
}

func (s *API) handleGetMember(w http.ResponseWriter, r *http.Request) {
	if _, m := s.member(w, r); m != nil {
		httpapi.WriteJSON(w, http.StatusOK, memberJSON(m))
	}
}

// handleAddMember: POST /projects/:project/members (mayManage) with user_id
// or username and access_level; 201 + member, 409 when already one (as
// GitLab: change a member's level with PUT).
func (s *API) handleAddMember(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	req, ok := decodeMember(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	var (
		u   *store.User
		err error
	)
	switch {
	case req.UserID != "":
		id, perr := strconv.ParseInt(string(req.UserID), 10, 64)
		if perr != nil || id <= 0 {
			httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - user_id %q is not a user's id", req.UserID))
			return
		}
		u, err = s.store.GetUser(ctx, id)
	case req.Username != "":
		u, err = s.userByName(ctx, req.Username)
	default:
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - user_id or username is missing")
		return
	}
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 User Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading user", err)
		return
	}
	if !validAccess(w, req.AccessLevel) {
		return
	}
	if !s.mayManage(w, r, u.ID, 0, store.MemberAccess(req.AccessLevel)) {
		return
	}
	m := &store.ProjectMember{ProjectID: p.ID, UserID: u.ID, AccessLevel: store.MemberAccess(req.AccessLevel),
		CreatedAt: s.clock.Now().UTC().Truncate(time.Second), UserName: u.Name}
	if !s.changeMember(w, r, p, m, 0) {
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, memberJSON(m))
}

// handleUpdateMember: PUT /projects/:project/members/:user (mayManage) with
// access_level.
func (s *API) handleUpdateMember(w http.ResponseWriter, r *http.Request) {
	p, m := s.member(w, r)
	if m == nil {
		return
	}
	req, ok := decodeMember(w, r)
	if !ok || !validAccess(w, req.AccessLevel) || !s.mayManage(w, r, m.UserID, m.AccessLevel, store.MemberAccess(req.AccessLevel)) {
		return
	}
	from := m.AccessLevel
	m.AccessLevel = store.MemberAccess(req.AccessLevel)
	if s.changeMember(w, r, p, m, from) {
		httpapi.WriteJSON(w, http.StatusOK, memberJSON(m))
	}
}

// changeMember changes m's membership from level from (0: not a member)
// to m.AccessLevel (0: removed), as decided for from: a membership changed
// meanwhile is a 409, and unless an instance admin asks, the project's last
// owner stays (403).
func (s *API) changeMember(w http.ResponseWriter, r *http.Request, p *store.Project, m *store.ProjectMember, from store.MemberAccess) bool {
	a, _ := r.Context().Value(accessKey{}).(*access)
	err := s.store.ChangeProjectMember(r.Context(), store.MemberChange{ProjectID: p.ID, UserID: m.UserID, From: from, To: m.AccessLevel,
		CreatedAt: m.CreatedAt, KeepOwner: a != nil && !a.who.Admin()})
	switch {
	case err == nil:
	case errors.Is(err, store.ErrLastOwner):
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - the project's last owner cannot be removed or demoted (make another member owner first)")
		return false
	case errors.Is(err, store.ErrConflict) && from == 0:
		httpapi.WriteError(w, http.StatusConflict, "409 Conflict - Member already exists")
		return false
	case errors.Is(err, store.ErrConflict):
		httpapi.WriteError(w, http.StatusConflict, "409 Conflict - the membership changed meanwhile: read it again")
		return false
	case errors.Is(err, store.ErrNotFound) && from != 0:
		httpapi.WriteError(w, http.StatusNotFound, "404 Member Not Found")
		return false
	case errors.Is(err, store.ErrNotFound):
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found - the project or the user was deleted meanwhile")
		return false
	default:
		httpapi.InternalError(s.log, w, "changing member", err)
		return false
	}
	if m.AccessLevel == 0 {
		s.log.Info("project member removed", "project", p.Path, "user", m.UserName)
	} else {
		s.log.Info("project member set", "project", p.Path, "user", m.UserName, "access_level", int(m.AccessLevel))
	}
	return true
}

// handleRemoveMember: DELETE /projects/:project/members/:user (mayManage).
func (s *API) handleRemoveMember(w http.ResponseWriter, r *http.Request) {
	p, m := s.member(w, r)
	if m == nil || !s.mayManage(w, r, m.UserID, m.AccessLevel, 0) {
		return
	}
	from := m.AccessLevel
	m.AccessLevel = 0
	if s.changeMember(w, r, p, m, from) {
		w.WriteHeader(http.StatusNoContent)
	}
}

func validAccess(w http.ResponseWriter, level int) bool {
	if !store.MemberAccess(level).Valid() {
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - access_level %d: want 10 (guest), 20 (reporter), 30 (developer), 40 (maintainer) or 50 (owner)", level))
		return false
	}
	return true
}

// userByName finds a user by name (users are few: the list is read).
func (s *API) userByName(ctx context.Context, name string) (*store.User, error) {
	us, err := s.store.ListUsers(ctx)
	if err != nil {
		return nil, err
	}
	for _, u := range us {
		if u.Name == name {
			return u, nil
		}
	}
	return nil, store.ErrNotFound
}

// decodeMember reads a membership's parameters (decodeParams).
func decodeMember(w http.ResponseWriter, r *http.Request) (*restapi.MemberRequest, bool) {
	var req restapi.MemberRequest
	return &req, decodeParams(w, r, &req)
}
