package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// SettingAdminTokenDigest is the store setting holding the admin token's
// digest.
const SettingAdminTokenDigest = "admin_token_digest"

// runnerCacheTTL bounds how long a cached runner may be stale with respect
// to changes made outside this process.
var runnerCacheTTL = 10 * time.Second // (a variable for tests)

// runnerCache keeps runners by token digest so the hot path
// (jobs/request) does not read the store for authentication. Writes made
// by this process invalidate it at once.
type runnerCache struct {
	st store.Store
	mu sync.Mutex
	m  map[string]cachedRunner
}

type cachedRunner struct {
	r      *store.Runner
	q      []*queue.Runner // matching views of r by isolation rank, built once
	loaded time.Time
}

func (c *runnerCache) init(st store.Store) {
	c.st = st
	c.m = map[string]cachedRunner{}
}

func (c *runnerCache) get(ctx context.Context, digest string) (*store.Runner, error) {
	c.mu.Lock()
	e, ok := c.m[digest]
	c.mu.Unlock()
	if ok && time.Since(e.loaded) < runnerCacheTTL {
		return e.r, nil
	}
	r, err := c.st.RunnerByTokenDigest(ctx, digest)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.m[digest] = cachedRunner{r: r, q: queueViews(r), loaded: time.Now()}
	c.mu.Unlock()
	return r, nil
}

// queueView returns the queue's matching view of a runner returned by get,
// as seen by a manager whose strongest offered isolation level is offered.
func (c *runnerCache) queueView(r *store.Runner, offered executor.Isolation) *queue.Runner {
	rank := max(offered.Rank(), 0)
	c.mu.Lock()
	e, ok := c.m[r.TokenDigest]
	c.mu.Unlock()
	if ok && e.r == r {
		return e.q[rank]
	}
	return queueViews(r)[rank]
}

func (c *runnerCache) invalidate(digest string) {
	c.mu.Lock()
	delete(c.m, digest)
	c.mu.Unlock()
}

// invalidateID forgets a runner by ID (another replica changed it).
func (c *runnerCache) invalidateID(id int64) {
	c.mu.Lock()
	for d, e := range c.m {
		if e.r.ID == id {
			delete(c.m, d)
		}
	}
	c.mu.Unlock()
}

// clear forgets every runner.
func (c *runnerCache) clear() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}

// managerCache remembers when each runner manager record was last written,
// so contacted_at is refreshed at most once per managerWriteInterval
// instead of on every poll.
type managerCache struct {
	mu sync.Mutex
	m  map[managerRef]managerEntry
}

type managerRef struct {
	runnerID int64
	systemID string
}

type managerEntry struct {
	id      int64
	written time.Time
	info    []byte
}

const managerWriteInterval = time.Minute

func (c *managerCache) init() { c.m = map[managerRef]managerEntry{} }

// legacyManager is the system_id GitLab records for runners that send none.
const legacyManager = "<legacy>"

// touchManager returns the manager id for (runner, system_id), creating
// or refreshing the record when due.
func (s *Server) touchManager(ctx context.Context, r *store.Runner, systemID string, info *runnerapi.Info) (int64, error) {
	if systemID == "" {
		systemID = legacyManager
	}
	var infoJSON []byte
	if info != nil {
		infoJSON, _ = json.Marshal(info)
	}
	ref := managerRef{r.ID, systemID}
	now := s.clock.Now()
	s.managers.mu.Lock()
	e, ok := s.managers.m[ref]
	s.managers.mu.Unlock()
	if ok && now.Sub(e.written) < managerWriteInterval && (infoJSON == nil || bytes.Equal(infoJSON, e.info)) {
		return e.id, nil
	}
	m := &store.RunnerManager{RunnerID: r.ID, SystemID: systemID, Info: infoJSON, ContactedAt: now}
	if infoJSON == nil && ok {
		m.Info = e.info
	}
	if err := s.store.UpsertRunnerManager(ctx, m); err != nil {
		return 0, err
	}
	s.managers.mu.Lock()
	s.managers.m[ref] = managerEntry{id: m.ID, written: now, info: m.Info}
	s.managers.mu.Unlock()
	return m.ID, nil
}

func (s *Server) forgetManagers(runnerID int64, systemID string) {
	s.managers.mu.Lock()
	defer s.managers.mu.Unlock()
	for ref := range s.managers.m {
		if ref.runnerID == runnerID && (systemID == "" || ref.systemID == systemID) {
			delete(s.managers.m, ref)
		}
	}
}

// errForbidden is the answer to any failed authentication.
var errForbidden = errors.New("403 Forbidden")

// authRunner authenticates a runner token (from the body, else the
// RUNNER-TOKEN header). Expired tokens are refused.
func (s *Server) authRunner(ctx context.Context, r *http.Request, bodyToken string) (*store.Runner, error) {
	tok := bodyToken
	if tok == "" {
		tok = r.Header.Get(runnerapi.HeaderRunnerToken)
	}
	if tok == "" {
		return nil, errForbidden
	}
	digest := token.Digest(tok)
	rn, err := s.runners.get(ctx, digest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errForbidden
	}
	if err != nil {
		return nil, err
	}
	if !token.Equal(rn.TokenDigest, digest) {
		return nil, errForbidden
	}
	if !rn.TokenExpiresAt.IsZero() && !s.clock.Now().Before(rn.TokenExpiresAt) {
		return nil, errForbidden
	}
	return rn, nil
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

// tokenActive reports whether a job's token is valid: from hand-out until
// the job finishes.
func tokenActive(j *store.Job) bool {
	switch j.Status {
	case store.StatusRunning, store.StatusCanceling:
		return true
	case store.StatusPending:
		return j.RunnerManagerID != 0
	}
	return false
}

// authJob loads job id and checks that tok is its token and that the job
// is handed out and not finished (its token is active). It answers itself
// (404 unknown job; 403 wrong token; 403 with Job-Status when the job is
// not running) and returns nil on failure.
func (s *Server) authJob(w http.ResponseWriter, r *http.Request, id int64, tok string) *store.Job {
	j := s.activeJob(id)
	if j == nil {
		var err error
		j, err = s.store.GetJob(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) {
			httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
			return nil
		}
		if err != nil {
			httpapi.InternalError(s.log, w, "loading job", err)
			return nil
		}
	}
	if tok == "" || j.TokenDigest == "" || !token.Equal(j.TokenDigest, token.Digest(tok)) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil
	}
	if !tokenActive(j) {
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
