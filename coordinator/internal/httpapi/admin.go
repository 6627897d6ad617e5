package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// AdminTokenSetting is the store setting holding the admin token's
// digest.
const AdminTokenSetting = "admin_token_digest"

// AdminToken extracts an admin token: PRIVATE-TOKEN header or a bearer
// Authorization header.
func AdminToken(r *http.Request) string {
	if t := r.Header.Get(runnerapi.HeaderPrivateToken); t != "" {
		return t
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	return ""
}

// IsAdmin checks the request's admin token against the stored digest, in
// constant time.
func IsAdmin(r *http.Request, st store.Store) bool {
	tok := AdminToken(r)
	if tok == "" {
		return false
	}
	want, err := st.GetSetting(r.Context(), AdminTokenSetting)
	if err != nil {
		return false
	}
	return token.Equal(want, token.Digest(tok))
}

// RequireAdmin wraps a handler that needs the admin token: 401 without a
// token, 403 with a wrong one.
func RequireAdmin(st store.Store, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if AdminToken(r) == "" {
			WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
			return
		}
		if !IsAdmin(r, st) {
			WriteError(w, http.StatusForbidden, "403 Forbidden")
			return
		}
		h(w, r)
	}
}

// EnsureAdminToken makes tok the admin token if given; otherwise it keeps
// the stored one, or mints and stores a new one, which it returns (the
// only time it is ever shown): routable to cell when cell is not 0. It
// returns "" when an admin token already existed and none was given.
func EnsureAdminToken(ctx context.Context, st store.Store, tok string, cell int64) (string, error) {
	if tok != "" {
		return "", st.PutSetting(ctx, AdminTokenSetting, token.Digest(tok))
	}
	if _, err := st.GetSetting(ctx, AdminTokenSetting); err == nil {
		return "", nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	tok = token.NewPersonal()
	if cell != 0 {
		var err error
		if tok, err = token.NewRoutable(token.PrefixPersonal, token.Routing{Cell: cell, Organization: 1}); err != nil {
			return "", err
		}
	}
	if err := st.PutSetting(ctx, AdminTokenSetting, token.Digest(tok)); err != nil {
		return "", err
	}
	return tok, nil
}

// AuthRunner authenticates a runner token (bodyToken, else the
// RUNNER-TOKEN header), answering 403 (or 500) itself on failure.
func AuthRunner(w http.ResponseWriter, r *http.Request, reg *runners.Registry, log *slog.Logger, bodyToken string) (*store.Runner, bool) {
	tok := bodyToken
	if tok == "" {
		tok = r.Header.Get(runnerapi.HeaderRunnerToken)
	}
	rn, err := reg.Authenticate(r.Context(), tok)
	if errors.Is(err, runners.ErrForbidden) {
		WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil, false
	}
	if err != nil {
		InternalError(log, w, "authenticating runner", err)
		return nil, false
	}
	return rn, true
}
