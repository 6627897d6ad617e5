package runnerhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// (a variable for tests)

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

// authJob loads job id and checks that tok is its token and that the job
// is handed out and not finished (its token is active). It answers itself
// (404 unknown job; 403 wrong token; 403 with Job-Status when the job is
// not running) and returns nil on failure.
func (s *API) authJob(w http.ResponseWriter, r *http.Request, id int64, tok string) *store.Job {
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
