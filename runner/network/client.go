// Package network is the runner's client of GitLab's Runner API v4, usable
// against Berth's coordinator and against a real GitLab: register, verify,
// unregister, token reset, jobs/request with last_update, job updates,
// trace PATCHes and artifacts.
//
// Every call follows gitlab-protocol.md §1: User-Agent and X-Request-Id on
// every request, Accept: application/json where JSON comes back (a success
// answer that is not JSON is an error), automatic retries of 408, 429, 500,
// 502, 503, 504 and ≥ 512 (at most 5 attempts; the wait is
// RateLimit-ResetTime, else Retry-After, else an exponential backoff from
// 100 ms to 60 s with jitter), and X-GitLab-Last-Update remembered per
// (url, token) and echoed as last_update in the next jobs/request.
//
// A Client is safe for concurrent use.
package network

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"mime"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runnerapi"
)

// Sentinel errors; a *StatusError matches the one of its status code with
// errors.Is.
var (
	ErrBadRequest      = errors.New("bad request")         // 400
	ErrForbidden       = errors.New("forbidden")           // 403
	ErrNotFound        = errors.New("not found")           // 404
	ErrConflict        = errors.New("conflict")            // 409
	ErrGone            = errors.New("gone")                // 410
	ErrTooLarge        = errors.New("request too large")   // 413
	ErrOrphaned        = errors.New("runner is orphaned")  // 422
	ErrTooManyRequests = errors.New("too many requests")   // 429
	ErrServer          = errors.New("server error")        // 5xx
	ErrNotJSON         = errors.New("answer is not JSON")  // success without application/json
	ErrUnexpected      = errors.New("unexpected response") // anything else
)

// StatusError is a non-success HTTP answer.
type StatusError struct {
	Op        string // "POST jobs/request"
	Code      int
	Message   string // GitLab's {"message": …}, or the body's start
	JobStatus string // Job-Status header, when sent
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("%s: %d %s: %s", e.Op, e.Code, http.StatusText(e.Code), e.Message)
	}
	return fmt.Sprintf("%s: %d %s", e.Op, e.Code, http.StatusText(e.Code))
}

// Is matches the sentinel of the status code.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Code == 400
	case ErrForbidden:
		return e.Code == 403
	case ErrNotFound:
		return e.Code == 404
	case ErrConflict:
		return e.Code == 409
	case ErrGone:
		return e.Code == 410
	case ErrTooLarge:
		return e.Code == 413
	case ErrOrphaned:
		return e.Code == 422
	case ErrTooManyRequests:
		return e.Code == 429
	case ErrServer:
		return e.Code >= 500
	case ErrUnexpected:
		return true
	}
	return false
}

// Backoff is an exponential backoff with full jitter in [d/2, d].
type Backoff struct {
	Min, Max time.Duration
	Factor   float64
}

// Delay is the wait before retry number attempt (0-based).
func (b Backoff) Delay(attempt int) time.Duration {
	d := float64(b.Min)
	for i := 0; i < attempt; i++ {
		d *= b.Factor
		if d >= float64(b.Max) {
			d = float64(b.Max)
			break
		}
	}
	if d <= 0 {
		return 0
	}
	half := int64(d / 2)
	if half <= 0 {
		return time.Duration(d)
	}
	n, err := rand.Int(rand.Reader, big.NewInt(half+1))
	if err != nil {
		return time.Duration(d)
	}
	return time.Duration(half + n.Int64())
}

// DefaultBackoff is the request retry backoff: 100 ms → 60 s, ×2.
var DefaultBackoff = Backoff{Min: 100 * time.Millisecond, Max: 60 * time.Second, Factor: 2}

// DefaultMaxAttempts bounds automatic retries of one call.
const DefaultMaxAttempts = 5

// Options configure a Client. Zero values take the defaults.
type Options struct {
	// HTTPClient is used for every request (nil: a client without a
	// global timeout; long polls are bounded by their context).
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Version goes into the User-Agent.
	Version string
	// Backoff and MaxAttempts govern automatic retries.
	Backoff     Backoff
	MaxAttempts int
	// Now is the clock for RateLimit-ResetTime and ConnectionMaxAge
	// (nil: time.Now).
	Now func() time.Time
	// ConnectionMaxAge: idle connections are closed once they may be
	// that old (0: never; SetConnectionMaxAge changes it).
	ConnectionMaxAge time.Duration
}

// Client talks to one or more coordinators.
type Client struct {
	http        *http.Client
	noRedirect  *http.Client
	log         *slog.Logger
	userAgent   string
	backoff     Backoff
	maxAttempts int
	now         func() time.Time

	mu         sync.Mutex
	lastUpdate map[string]string
	// tls holds the clients of coordinators (by API base) whose entries
	// have TLS files (SetTLS).
	tls map[string]tlsClients
	// chains are the certificate chains coordinators (by API base)
	// presented in their last TLS answer (PresentedChain).
	chains map[string]presentedChain
	// maxAge and refreshed: connection_max_age (see closeAgedIdle).
	maxAge    time.Duration
	refreshed time.Time
}

// New returns a Client.
func New(opts Options) *Client {
	c := &Client{
		http:        opts.HTTPClient,
		log:         opts.Logger,
		backoff:     opts.Backoff,
		maxAttempts: opts.MaxAttempts,
		now:         opts.Now,
		lastUpdate:  map[string]string{},
		tls:         map[string]tlsClients{},
		chains:      map[string]presentedChain{},
		maxAge:      opts.ConnectionMaxAge,
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	nr := *c.http
	nr.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.noRedirect = &nr
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.backoff.Min <= 0 || c.backoff.Max <= 0 || c.backoff.Factor < 1 {
		c.backoff = DefaultBackoff
	}
	if c.maxAttempts <= 0 {
		c.maxAttempts = DefaultMaxAttempts
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.refreshed = c.now()
	v := opts.Version
	if v == "" {
		v = "dev"
	}
	c.userAgent = UserAgent(v)
	return c
}

// SetConnectionMaxAge changes how long idle connections are reused (0:
// forever), from now on.
func (c *Client) SetConnectionMaxAge(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxAge = d
}

// closeAgedIdle closes every idle connection once maxAge has passed since
// it last did, as gitlab-runner does before each request: connections
// busy in a long poll are left alone, and the next requests open new
// ones, which a load balancer spreads over the coordinator's replicas and
// which see the coordinator's current certificate. (Go's transport has no
// maximum age per connection.)
func (c *Client) closeAgedIdle() {
	c.mu.Lock()
	now := c.now()
	if c.maxAge <= 0 || now.Sub(c.refreshed) <= c.maxAge {
		c.mu.Unlock()
		return
	}
	c.refreshed = now
	clients := []*http.Client{c.http, c.noRedirect}
	for _, t := range c.tls {
		clients = append(clients, t.follow, t.noRedirect)
	}
	c.mu.Unlock()
	c.log.Debug("closing idle connections", "max_age", c.maxAge)
	for _, hc := range clients {
		hc.CloseIdleConnections()
	}
}

// UserAgent is gitlab-runner's User-Agent form with Berth as the branch:
// "gitlab-runner <version> (berth; <go version>; <os>/<arch>)".
func UserAgent(version string) string {
	return fmt.Sprintf("gitlab-runner %s (berth; %s; %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// BaseURL turns a configured url into the API base: trailing "/" and a
// legacy "/ci" suffix stripped, "/api/v4/" appended.
func BaseURL(u string) string {
	u = strings.TrimRight(u, "/")
	u = strings.TrimSuffix(u, "/ci")
	return strings.TrimRight(u, "/") + "/api/v4/"
}

// RunnerCredentials identify a runner to the runner endpoints.
type RunnerCredentials struct {
	URL   string
	Token string
}

// JobCredentials identify a job to the job endpoints.
type JobCredentials struct {
	URL   string
	ID    int64
	Token string
}

func (jc JobCredentials) path(suffix string) string {
	return fmt.Sprintf("jobs/%d%s", jc.ID, suffix)
}

// request describes one API call.
type request struct {
	method   string
	base     string // configured url
	path     string // relative to /api/v4/
	query    string
	json     any    // body encoded as JSON
	raw      []byte // body as is
	ctype    string // Content-Type of raw
	header   map[string]string
	wantJSON bool
	luKey    string // lastUpdate key to record X-GitLab-Last-Update under
}

// response is what a call got.
type response struct {
	code   int
	header http.Header
	body   []byte
}

func (r *response) jobStatus() string { return r.header.Get(runnerapi.HeaderJobStatus) }

func newRequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// retryable reports whether a status code is retried automatically.
func retryable(code int) bool {
	switch code {
	case 408, 429, 500, 502, 503, 504:
		return true
	}
	return code >= 512
}

// do sends a request with automatic retries and reads the whole answer.
func (c *Client) do(ctx context.Context, rq request) (*response, error) {
	var body []byte
	if rq.json != nil {
		b, err := json.Marshal(rq.json)
		if err != nil {
			return nil, fmt.Errorf("encoding %s %s: %w", rq.method, rq.path, err)
		}
		body = b
	} else {
		body = rq.raw
	}
	op := rq.method + " " + rq.path
	for attempt := 0; ; attempt++ {
		resp, err := c.once(ctx, rq, body)
		var wait time.Duration
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, fmt.Errorf("%s: %w", op, ctx.Err())
		case err != nil:
			wait = c.backoff.Delay(attempt)
		case retryable(resp.code):
			wait = c.retryWait(resp.header, attempt)
		default:
			return resp, nil
		}
		if attempt+1 >= c.maxAttempts {
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			return resp, nil
		}
		c.log.Debug("retrying request", "op", op, "attempt", attempt+1, "wait", wait, "err", err, "status", codeOf(resp))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%s: %w", op, ctx.Err())
		case <-t.C:
		}
	}
}

func codeOf(r *response) int {
	if r == nil {
		return 0
	}
	return r.code
}

// retryWait picks the wait before the next attempt: RateLimit-ResetTime,
// else Retry-After, else the backoff.
func (c *Client) retryWait(h http.Header, attempt int) time.Duration {
	now := c.now()
	if d, ok := ParseRateLimitReset(h.Get("RateLimit-ResetTime"), now); ok {
		return d
	}
	if d, ok := ParseRetryAfter(h.Get("Retry-After"), now); ok {
		return d
	}
	return c.backoff.Delay(attempt)
}

func (c *Client) once(ctx context.Context, rq request, body []byte) (*response, error) {
	c.closeAgedIdle()
	u := BaseURL(rq.base) + rq.path
	if rq.query != "" {
		u += "?" + rq.query
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set(runnerapi.HeaderRequestID, newRequestID())
	if rq.json != nil {
		req.Header.Set("Content-Type", "application/json")
	} else if rq.ctype != "" {
		req.Header.Set("Content-Type", rq.ctype)
	}
	if rq.wantJSON {
		req.Header.Set("Accept", "application/json")
	}
	for k, v := range rq.header {
		req.Header.Set(k, v)
	}
	resp, err := c.clientFor(rq.base, true).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.TLS != nil {
		c.notePresentedChain(rq.base, resp.TLS)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	out := &response{code: resp.StatusCode, header: resp.Header, body: b}
	// Like GitLab's runner, the queue version is taken from any answer
	// that carries it: a 204 "no job" has no body and so, from Berth's
	// coordinator and GitLab's Workhorse, no Content-Type, and it is the
	// answer that must arm the next long poll.
	if rq.luKey != "" {
		c.setLastUpdate(rq.luKey, resp.Header.Get(runnerapi.HeaderLastUpdate))
	}
	return out, nil
}

func isJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// statusError builds the error of a non-success answer.
func statusError(op string, r *response) error {
	e := &StatusError{Op: op, Code: r.code, JobStatus: r.jobStatus()}
	var er runnerapi.ErrorResponse
	if isJSON(r.header) && json.Unmarshal(r.body, &er) == nil && er.Message != nil {
		if s, ok := er.Message.(string); ok {
			e.Message = s
		} else {
			b, _ := json.Marshal(er.Message)
			e.Message = string(b)
		}
	} else if len(r.body) > 0 {
		m := string(r.body)
		if len(m) > 200 {
			m = m[:200]
		}
		e.Message = strings.TrimSpace(m)
	}
	return e
}

// decode reads a JSON success answer into v.
func decode(op string, r *response, v any) error {
	if !isJSON(r.header) {
		return fmt.Errorf("%s: %w (Content-Type %q)", op, ErrNotJSON, r.header.Get("Content-Type"))
	}
	if err := json.Unmarshal(r.body, v); err != nil {
		return fmt.Errorf("%s: decoding answer: %w", op, err)
	}
	return nil
}

func luKey(url, token string) string { return url + "\x00" + token }

// setLastUpdate records a queue version seen for the runner of key (""
// changes nothing).
func (c *Client) setLastUpdate(key, lu string) {
	if lu == "" {
		return
	}
	c.mu.Lock()
	c.lastUpdate[key] = lu
	c.mu.Unlock()
}

// LastUpdate is the X-GitLab-Last-Update last seen for a runner.
func (c *Client) LastUpdate(rc RunnerCredentials) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastUpdate[luKey(rc.URL, rc.Token)]
}

func (c *Client) runnerRequest(method, path string, rc RunnerCredentials, body any, wantJSON bool) request {
	return request{
		method: method, base: rc.URL, path: path, json: body, wantJSON: wantJSON,
		header: map[string]string{runnerapi.HeaderRunnerToken: rc.Token},
		luKey:  luKey(rc.URL, rc.Token),
	}
}

// Register registers a runner with a registration token (POST /runners).
func (c *Client) Register(ctx context.Context, url string, req runnerapi.RegisterRequest) (*runnerapi.RunnerTokenResponse, error) {
	const op = "POST runners"
	r, err := c.do(ctx, c.runnerRequest("POST", "runners", RunnerCredentials{URL: url, Token: req.Token}, req, true))
	if err != nil {
		return nil, err
	}
	if r.code != http.StatusCreated {
		return nil, statusError(op, r)
	}
	var out runnerapi.RunnerTokenResponse
	if err := decode(op, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Verify checks a runner token (POST /runners/verify). Old GitLab answers
// 200 with a plain-text body; that is accepted and the result is then
// empty.
func (c *Client) Verify(ctx context.Context, rc RunnerCredentials, systemID string, info *runnerapi.Info) (*runnerapi.RunnerTokenResponse, error) {
	const op = "POST runners/verify"
	r, err := c.do(ctx, c.runnerRequest("POST", "runners/verify", rc, runnerapi.VerifyRequest{Token: rc.Token, SystemID: systemID, Info: info}, true))
	if err != nil {
		return nil, err
	}
	if r.code != http.StatusOK {
		return nil, statusError(op, r)
	}
	var out runnerapi.RunnerTokenResponse
	if !isJSON(r.header) {
		return &out, nil
	}
	if err := decode(op, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Unregister deletes the runner (DELETE /runners).
func (c *Client) Unregister(ctx context.Context, rc RunnerCredentials) error {
	const op = "DELETE runners"
	r, err := c.do(ctx, c.runnerRequest("DELETE", "runners", rc, runnerapi.TokenRequest{Token: rc.Token}, false))
	if err != nil {
		return err
	}
	if r.code != http.StatusNoContent {
		return statusError(op, r)
	}
	return nil
}

// UnregisterManager deletes this machine's manager of the runner (DELETE
// /runners/managers).
func (c *Client) UnregisterManager(ctx context.Context, rc RunnerCredentials, systemID string) error {
	const op = "DELETE runners/managers"
	r, err := c.do(ctx, c.runnerRequest("DELETE", "runners/managers", rc, runnerapi.ManagerRequest{Token: rc.Token, SystemID: systemID}, false))
	if err != nil {
		return err
	}
	if r.code != http.StatusNoContent {
		return statusError(op, r)
	}
	return nil
}

// ResetToken rotates the runner's authentication token (POST
// /runners/reset_authentication_token).
func (c *Client) ResetToken(ctx context.Context, rc RunnerCredentials) (*runnerapi.RunnerTokenResponse, error) {
	const op = "POST runners/reset_authentication_token"
	r, err := c.do(ctx, c.runnerRequest("POST", "runners/reset_authentication_token", rc, runnerapi.TokenRequest{Token: rc.Token}, true))
	if err != nil {
		return nil, err
	}
	if r.code != http.StatusCreated {
		return nil, statusError(op, r)
	}
	var out runnerapi.RunnerTokenResponse
	if err := decode(op, r, &out); err != nil {
		return nil, err
	}
	if out.Token == "" {
		return nil, fmt.Errorf("%s: %w: no token in answer", op, ErrUnexpected)
	}
	return &out, nil
}

// RequestJob asks for a job (POST /jobs/request), echoing the last
// X-GitLab-Last-Update seen for this runner. It returns nil, nil when there
// is no job (204). 403, 409, 422 and 429 come back as *StatusError
// (errors.Is with ErrForbidden, ErrConflict, ErrOrphaned,
// ErrTooManyRequests).
func (c *Client) RequestJob(ctx context.Context, rc RunnerCredentials, systemID string, info *runnerapi.Info) (*runnerapi.JobResponse, error) {
	return c.requestJob(ctx, rc, systemID, info, c.LastUpdate(rc))
}

// RequestJobAtOnce is RequestJob without the last X-GitLab-Last-Update,
// so that the coordinator answers at once rather than holding the request
// until a job comes (long polling). The answer's X-GitLab-Last-Update is
// still recorded.
func (c *Client) RequestJobAtOnce(ctx context.Context, rc RunnerCredentials, systemID string, info *runnerapi.Info) (*runnerapi.JobResponse, error) {
	return c.requestJob(ctx, rc, systemID, info, "")
}

func (c *Client) requestJob(ctx context.Context, rc RunnerCredentials, systemID string, info *runnerapi.Info, lastUpdate string) (*runnerapi.JobResponse, error) {
	const op = "POST jobs/request"
	req := runnerapi.JobRequest{Token: rc.Token, SystemID: systemID, LastUpdate: lastUpdate, Info: info}
	r, err := c.do(ctx, c.runnerRequest("POST", "jobs/request", rc, req, true))
	if err != nil {
		return nil, err
	}
	switch r.code {
	case http.StatusNoContent:
		return nil, nil
	case http.StatusCreated:
		var job runnerapi.JobResponse
		if err := decode(op, r, &job); err != nil {
			return nil, err
		}
		return &job, nil
	}
	return nil, statusError(op, r)
}

// JobRouter is GitLab's Job Router as a runner calls it
// (jobpush.RouterClient): one jobs/request body per call, the job's JSON
// or nil, and the router's X-GitLab-Last-Update.
type JobRouter interface {
	GetJob(ctx context.Context, request []byte, requestID string) (job []byte, lastUpdate string, err error)
}

// RequestJobRouted is RequestJob through a Job Router's GetJob (GitLab's
// runner with FF_USE_JOB_ROUTER): the same JSON body, echoing the last
// X-GitLab-Last-Update (none with atOnce), which the router's answer
// updates. Refusals come back as the *StatusError the same refusal on
// REST would be (403 for a token the router refuses, 422 for an orphaned
// runner, 400 for a body it refuses); a router that is disabled matches
// jobpush.ErrNotServed; transport failures are the router's gRPC status.
func (c *Client) RequestJobRouted(ctx context.Context, r JobRouter, rc RunnerCredentials, systemID string, info *runnerapi.Info, atOnce bool) (*runnerapi.JobResponse, error) {
	const op = "JobRouter/GetJob"
	lastUpdate := ""
	if !atOnce {
		lastUpdate = c.LastUpdate(rc)
	}
	body, err := json.Marshal(runnerapi.JobRequest{Token: rc.Token, SystemID: systemID, LastUpdate: lastUpdate, Info: info})
	if err != nil {
		return nil, fmt.Errorf("%s: encoding the request: %w", op, err)
	}
	job, lu, err := r.GetJob(ctx, body, newRequestID())
	if err != nil {
		st, _ := status.FromError(err)
		switch {
		case errors.Is(err, jobpush.ErrUnauthenticated):
			return nil, &StatusError{Op: op, Code: http.StatusForbidden, Message: st.Message()}
		case errors.Is(err, jobpush.ErrNotServed):
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		switch st.Code() {
		case codes.FailedPrecondition:
			return nil, &StatusError{Op: op, Code: http.StatusUnprocessableEntity, Message: st.Message()}
		case codes.InvalidArgument:
			return nil, &StatusError{Op: op, Code: http.StatusBadRequest, Message: st.Message()}
		case codes.ResourceExhausted:
			return nil, &StatusError{Op: op, Code: http.StatusTooManyRequests, Message: st.Message()}
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	c.setLastUpdate(luKey(rc.URL, rc.Token), lu)
	if job == nil {
		return nil, nil
	}
	if len(job) > jobpush.MaxPayload {
		return nil, fmt.Errorf("%s: %w: a job of %d bytes", op, ErrUnexpected, len(job))
	}
	var out runnerapi.JobResponse
	if err := json.Unmarshal(job, &out); err != nil {
		return nil, fmt.Errorf("%s: %w: the job is not JSON: %v", op, ErrUnexpected, err)
	}
	return &out, nil
}

// ErrNoQueueInsight: the coordinator does not answer GET
// /api/v4/berth/queue (a GitLab instance, or an older Berth).
var ErrNoQueueInsight = errors.New("the coordinator has no queue insight")

// QueuedJobs asks Berth's coordinator how many jobs wait that this runner
// may run (GET /api/v4/berth/queue with the runner token, a Berth
// extension the autoscaled executors scale on). It fails with
// ErrNoQueueInsight where the endpoint does not exist.
//
// levels are the isolation levels the runner offers: the coordinator
// counts only jobs they satisfy.
func (c *Client) QueuedJobs(ctx context.Context, rc RunnerCredentials, levels []string) (int, error) {
	const op = "GET berth/queue"
	rq := c.runnerRequest("GET", "berth/queue", rc, nil, true)
	rq.luKey = ""
	if len(levels) > 0 {
		rq.query = "isolation_levels=" + url.QueryEscape(strings.Join(levels, ","))
	}
	r, err := c.do(ctx, rq)
	if err != nil {
		return 0, err
	}
	switch r.code {
	case http.StatusOK:
		var out struct {
			Queued int `json:"queued"`
		}
		if err := decode(op, r, &out); err != nil {
			return 0, err
		}
		return max(0, out.Queued), nil
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return 0, fmt.Errorf("%s: %w", op, ErrNoQueueInsight)
	}
	return 0, statusError(op, r)
}

// DiscoverJobRouter asks where the push channel or Job Router is (GET
// /api/v4/runners/router/discovery with the runner token, GitLab's Job
// Router discovery). It fails with an error matching jobpush.ErrNoServer
// when the coordinator names none it can use (404, 405 or 501 — a
// coordinator without the channel — an empty server_url, or a scheme
// other than ws, wss, grpc and grpcs), and a *StatusError for other
// answers.
func (c *Client) DiscoverJobRouter(ctx context.Context, rc RunnerCredentials) (*url.URL, error) {
	const op = "GET " + jobpush.DiscoveryPath
	rq := c.runnerRequest("GET", jobpush.DiscoveryPath, rc, nil, true)
	rq.luKey = ""
	r, err := c.do(ctx, rq)
	if err != nil {
		return nil, err
	}
	switch r.code {
	case http.StatusOK:
		if !isJSON(r.header) {
			return nil, fmt.Errorf("%s: %w (Content-Type %q)", op, ErrNotJSON, r.header.Get("Content-Type"))
		}
		u, err := jobpush.ParseDiscovery(r.body)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return u, nil
	case http.StatusNoContent, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return nil, fmt.Errorf("%s: %d: %w", op, r.code, jobpush.ErrNoServer)
	}
	return nil, statusError(op, r)
}

// JobState is what an update or trace answer means for the job.
type JobState int

// What a job update or trace PATCH answer tells the runner.
const (
	// StateOK: carry on.
	StateOK JobState = iota
	// StateCancel: Job-Status canceling — stop the script, run
	// after_script, report failed/job_canceled.
	StateCancel
	// StateAbort: 403, 404 or Job-Status canceled/failed — kill
	// everything, send no final update.
	StateAbort
)

// jobStateOf applies the Job-Status rules of gitlab-protocol.md §1.5/§3.
// JobStateOf is what an answer about a job — its HTTP code and Job-Status
// — tells the runner to do with it.
func JobStateOf(code int, jobStatus string) JobState {
	if code == http.StatusForbidden || code == http.StatusNotFound {
		return StateAbort
	}
	switch jobStatus {
	case "canceled", "failed":
		return StateAbort
	case "canceling":
		return StateCancel
	}
	return StateOK
}

// UpdateResult is the answer to PUT /jobs/:id.
type UpdateResult struct {
	Code int
	// Accepted: 202, the trace is not finalized yet — flush and repeat
	// after TraceUpdateInterval.
	Accepted bool
	// TraceReset: 412 — send the whole trace again from offset 0.
	TraceReset bool
	State      JobState
	JobStatus  string
	// TraceUpdateInterval is X-GitLab-Trace-Update-Interval (0: not sent).
	TraceUpdateInterval time.Duration
}

// UpdateJob sends PUT /jobs/:id. Answers 200, 202, 403, 404 and 412 are
// results; other non-success answers (after automatic retries) are errors.
func (c *Client) UpdateJob(ctx context.Context, jc JobCredentials, req runnerapi.UpdateJobRequest) (UpdateResult, error) {
	op := "PUT " + jc.path("")
	req.Token = jc.Token
	r, err := c.do(ctx, request{
		method: "PUT", base: jc.URL, path: jc.path(""), json: req,
		header: map[string]string{runnerapi.HeaderJobToken: jc.Token},
	})
	if err != nil {
		return UpdateResult{}, err
	}
	res := UpdateResult{Code: r.code, JobStatus: r.jobStatus(), State: JobStateOf(r.code, r.jobStatus())}
	res.TraceUpdateInterval, _ = ParseTraceUpdateInterval(r.header.Get(runnerapi.HeaderTraceUpdateInterval))
	switch r.code {
	case http.StatusOK, http.StatusForbidden, http.StatusNotFound:
		return res, nil
	case http.StatusAccepted:
		res.Accepted = true
		return res, nil
	case http.StatusPreconditionFailed:
		res.TraceReset = true
		return res, nil
	}
	return res, statusError(op, r)
}

// PatchResult is the answer to PATCH /jobs/:id/trace.
type PatchResult struct {
	Code int
	// Offset is the remote trace size from the Range header (valid when
	// RangeOK).
	Offset  int64
	RangeOK bool
	// RangeMismatch: 416 — resume from Offset.
	RangeMismatch bool
	// Gone: 404 — stop sending the trace.
	Gone                bool
	State               JobState
	JobStatus           string
	TraceUpdateInterval time.Duration
}

// PatchTrace appends data at offset (PATCH /jobs/:id/trace with
// Content-Range start-end, end inclusive). data must not be empty.
func (c *Client) PatchTrace(ctx context.Context, jc JobCredentials, offset int64, data []byte, debugTrace bool) (PatchResult, error) {
	op := "PATCH " + jc.path("/trace")
	if len(data) == 0 {
		return PatchResult{}, fmt.Errorf("%s: empty patch", op)
	}
	r, err := c.do(ctx, request{
		method: "PATCH", base: jc.URL, path: jc.path("/trace"), query: fmt.Sprintf("debug_trace=%t", debugTrace),
		raw: data, ctype: "text/plain",
		header: map[string]string{
			runnerapi.HeaderJobToken:     jc.Token,
			runnerapi.HeaderContentRange: fmt.Sprintf("%d-%d", offset, offset+int64(len(data))-1),
		},
	})
	if err != nil {
		return PatchResult{}, err
	}
	res := PatchResult{Code: r.code, JobStatus: r.jobStatus(), State: JobStateOf(r.code, r.jobStatus())}
	res.TraceUpdateInterval, _ = ParseTraceUpdateInterval(r.header.Get(runnerapi.HeaderTraceUpdateInterval))
	if n, err := ParseRange(r.header.Get(runnerapi.HeaderRange)); err == nil {
		res.Offset, res.RangeOK = n, true
	}
	switch r.code {
	case http.StatusAccepted, http.StatusOK, http.StatusForbidden:
		return res, nil
	case http.StatusNotFound:
		res.Gone = true
		return res, nil
	case http.StatusRequestedRangeNotSatisfiable:
		if !res.RangeOK {
			return res, fmt.Errorf("%s: 416 without a valid Range header: %w", op, ErrUnexpected)
		}
		res.RangeMismatch = true
		return res, nil
	}
	return res, statusError(op, r)
}
