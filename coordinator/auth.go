package coordinator

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// SettingAdminTokenDigest is the store setting holding the admin token's
// digest.
const SettingAdminTokenDigest = "admin_token_digest"

// (a variable for tests)

// authRunner authenticates a runner token (from the body, else the
// RUNNER-TOKEN header). Expired tokens are refused.
func (s *Server) authRunner(ctx context.Context, r *http.Request, bodyToken string) (*store.Runner, error) {
	tok := bodyToken
	if tok == "" {
		tok = r.Header.Get(runnerapi.HeaderRunnerToken)
	}
	return s.runners.Authenticate(ctx, tok)
}

// jobTokenFrom returns the job token of a request: JOB-TOKEN header, else
// the given body token, else the job_token/token query parameter.
func jobTokenFrom(r *http.Request, bodyToken string) string {
	if t := r.Header.Get(runnerapi.HeaderJobToken); t != "" {
		return t
	}
	if bodyToken != "" {
		return bodyToken
	}
	if t := r.URL.Query().Get("job_token"); t != "" {
		return t
	}
	return r.URL.Query().Get("token")
}

// authJob loads job id and checks that tok is its token and that the job
// is handed out and not finished (its token is active). It answers itself
// (404 unknown job; 403 wrong token; 403 with Job-Status when the job is
// not running) and returns nil on failure.
func (s *Server) authJob(w http.ResponseWriter, r *http.Request, id int64, tok string) *store.Job {
	j, err := s.dispatch.Job(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return nil
	}
	if tok == "" || j.TokenDigest == "" || !token.Equal(j.TokenDigest, token.Digest(tok)) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil
	}
	if !dispatch.TokenActive(j) {
		s.jobStatusHeaders(w, j.Status)
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return nil
	}
	return j
}

// adminToken extracts an admin token: PRIVATE-TOKEN header or a bearer
// Authorization header.
func adminToken(r *http.Request) string {
	if t := r.Header.Get(runnerapi.HeaderPrivateToken); t != "" {
		return t
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ")
	}
	return ""
}

// isAdmin checks the request's admin token against the stored digest.
func (s *Server) isAdmin(r *http.Request) bool {
	tok := adminToken(r)
	if tok == "" {
		return false
	}
	want, err := s.store.GetSetting(r.Context(), SettingAdminTokenDigest)
	if err != nil {
		return false
	}
	return token.Equal(want, token.Digest(tok))
}

// admin wraps a handler that needs the admin token: 401 without a token,
// 403 with a wrong one.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if adminToken(r) == "" {
			httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
			return
		}
		if !s.isAdmin(r) {
			httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
			return
		}
		h(w, r)
	}
}

// EnsureAdminToken makes tok the admin token if given; otherwise it keeps
// the stored one, or mints and stores a new one, which it returns (the
// only time it is ever shown). It returns "" when an admin token already
// existed and none was given.
func (s *Server) EnsureAdminToken(ctx context.Context, tok string) (string, error) {
	if tok != "" {
		return "", s.store.PutSetting(ctx, SettingAdminTokenDigest, token.Digest(tok))
	}
	if _, err := s.store.GetSetting(ctx, SettingAdminTokenDigest); err == nil {
		return "", nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	tok = token.NewPersonal()
	if err := s.store.PutSetting(ctx, SettingAdminTokenDigest, token.Digest(tok)); err != nil {
		return "", err
	}
	return tok, nil
}
