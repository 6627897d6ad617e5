package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Principal is whom a REST request speaks for: the admin token, or a
// user (berth users) by their own token.
type Principal struct {
	// User is the token's user; nil for the admin token.
	User *store.User
}

// Admin reports whether p is an instance admin: the admin token or a
// user whose role is admin.
func (p *Principal) Admin() bool { return p.User == nil || p.User.Role == store.RoleAdmin }

// String names p in messages and logs.
func (p *Principal) String() string {
	if p.User == nil {
		return "the admin token"
	}
	return "user " + p.User.Name
}

// Access is p's access level in project id (store.AccessOf; AccessOwner
// for the admin token).
func (p *Principal) Access(ctx context.Context, st store.Store, id int64) (store.MemberAccess, error) {
	if p.User == nil {
		return store.AccessOwner, nil
	}
	return store.AccessOf(ctx, st, p.User, id)
}

// AdminProjects returns the projects p is the admin of, for a p that is
// not an instance admin (who is the admin of every project).
func (p *Principal) AdminProjects(ctx context.Context, st store.Store) (map[int64]bool, error) {
	if p.User == nil {
		return nil, errors.New("the admin token is the admin of every project")
	}
	ms, err := st.MembershipsOfUser(ctx, p.User.ID)
	if err != nil {
		return nil, err
	}
	out := map[int64]bool{}
	for _, m := range ms {
		if m.AccessLevel.ProjectAdmin() {
			out[m.ProjectID] = true
		}
	}
	return out, nil
}

// NotAllowed answers 403 for p, whose access to the project named what is
// below level.
func NotAllowed(w http.ResponseWriter, p *Principal, level store.MemberAccess, what string) {
	role := "a maintainer"
	if level >= store.AccessOwner {
		role = "an owner"
	}
	WriteError(w, http.StatusForbidden, fmt.Sprintf("403 Forbidden - %s is neither an admin nor %s of %s", p, role, what))
}

// Authenticate finds whom the request's token (PRIVATE-TOKEN, or a
// bearer Authorization) belongs to: the admin token, compared in
// constant time with its stored digest, or a user's, looked up by
// digest. It answers 401 itself without a token, 403 for a token of
// nobody, 500 when the store fails.
func Authenticate(w http.ResponseWriter, r *http.Request, st store.Store, log *slog.Logger) (*Principal, bool) {
	tok := AdminToken(r)
	if tok == "" {
		WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return nil, false
	}
	if IsAdmin(r, st) {
		return &Principal{}, true
	}
	u, err := st.UserByTokenDigest(r.Context(), token.Digest(tok))
	switch {
	case errors.Is(err, store.ErrNotFound):
		WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil, false
	case err != nil:
		InternalError(log, w, "authenticating a user", err)
		return nil, false
	}
	return &Principal{User: u}, true
}
