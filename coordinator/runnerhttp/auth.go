package runnerhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// authRunner authenticates a runner token (from the body, else the
// RUNNER-TOKEN header). Expired tokens are refused.
func (s *API) authRunner(ctx context.Context, r *http.Request, bodyToken string) (*store.Runner, error) {
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

// authJob loads job id and checks that tok is a token of its current
// hand-out with every one of scopes, and that the job is handed out and not finished
// (its tokens are revoked when it ends). It answers itself (404 unknown
// job; 403 wrong, expired or out-of-scope token; 403 with Job-Status
// when the job is not running) and returns nil on failure.
func (s *API) authJob(w http.ResponseWriter, r *http.Request, id int64, tok string, scopes ...jobtoken.Scope) *store.Job {
	ctx := r.Context()
	if _, err := s.dispatch.Job(ctx, id); errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return nil
	} else if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return nil
	}
	j, c, err := s.dispatch.Authenticate(ctx, tok)
	switch {
	case errors.Is(err, jobtoken.ErrExpired):
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - job token expired")
		return nil
	case errors.Is(err, dispatch.ErrBadToken):
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil
	case errors.Is(err, dispatch.ErrJobNotRunning) && c.JobID == id:
		s.jobStatusHeaders(w, j.Status)
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return nil
	case err != nil && !errors.Is(err, dispatch.ErrJobNotRunning):
		httpapi.InternalError(s.log, w, "authenticating job token", err)
		return nil
	case err != nil || c.JobID != id:
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil
	}
	for _, scope := range scopes {
		if !c.Allows(scope) {
			httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - the job token does not allow "+string(scope))
			return nil
		}
	}
	return j
}
