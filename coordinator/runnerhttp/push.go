package runnerhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runnerapi"
)

// The job push channel (docs/push.md): discovery, the tunnel's upgrade,
// and the coordinator's side of each stream — the same authentication,
// manager record, isolation offer, hand-out and payload as jobs/request,
// through checkIn and handOut.

// pausedRecheck is how often a stream of a paused runner looks whether it
// was resumed.
const pausedRecheck = 5 * time.Second

// handleRouterDiscovery: GET /runners/router/discovery (GitLab's Job
// Router discovery) names the push channel, from the external URL.
func (s *API) handleRouterDiscovery(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.runnerOrFail(w, r, ""); !ok {
		return
	}
	u, err := jobpush.ServerURL(s.baseURL)
	if err != nil {
		httpapi.InternalError(s.log, w, "building the push channel's URL", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, jobpush.DiscoveryResponse{ServerURL: u})
}

// handleJobRouter: GET /api/v4/berth/job-router, the WebSocket upgrade to
// the push channel. The runner token (Authorization: Bearer, as GitLab's
// runner sends it, or RUNNER-TOKEN) must authenticate before anything is
// upgraded; the stream authenticates its own metadata again.
func (s *API) handleJobRouter(w http.ResponseWriter, r *http.Request) {
	tok := jobpush.BearerToken(r.Header.Get("Authorization"))
	if tok == "" {
		tok = r.Header.Get(runnerapi.HeaderRunnerToken)
	}
	if _, err := s.runners.Authenticate(r.Context(), tok); errors.Is(err, runners.ErrForbidden) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return
	} else if err != nil {
		httpapi.InternalError(s.log, w, "authenticating runner", err)
		return
	}
	s.push.Upgrade(w, r)
}

// pushSource is the coordinator as the push channel's Source.
type pushSource struct{ api *API }

// Open authenticates a stream's token and checks its manager in, as
// jobs/request does.
func (p pushSource) Open(ctx context.Context, tok string, hello jobpush.Hello) (jobpush.Session, error) {
	rn, err := p.api.pushRunner(ctx, tok)
	if err != nil {
		return nil, err
	}
	if _, _, err := p.api.checkIn(ctx, rn, hello.SystemID, hello.Info); err != nil {
		return nil, p.api.pushError(err)
	}
	return &pushSession{api: p.api, token: tok, systemID: hello.SystemID, info: hello.Info, handOuts: map[int64]*dispatch.HandOut{}}, nil
}

// RequestJob answers GitLab's Job Router GetJob: the body of a
// jobs/request, for the runner of the call's token. A job lost to another
// runner is "no job", as the runner would ask again after a 409.
func (p pushSource) RequestJob(ctx context.Context, tok string, body []byte) ([]byte, string, error) {
	rn, err := p.api.pushRunner(ctx, tok)
	if err != nil {
		return nil, "", err
	}
	var req runnerapi.JobRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, "", fmt.Errorf("%w: decoding the job request: %w", jobpush.ErrBadRequest, err)
	}
	a, err := p.api.requestJob(ctx, rn, &req)
	switch {
	case errors.Is(err, dispatch.ErrLostRaces):
		return nil, a.lastUpdate, nil
	case err != nil:
		return nil, "", p.api.pushError(err)
	case a.payload == nil:
		return nil, a.lastUpdate, nil
	}
	job, err := json.Marshal(a.payload)
	if err != nil {
		return nil, "", fmt.Errorf("encoding job %d: %w", a.payload.ID, err)
	}
	return job, a.lastUpdate, nil
}

// pushRunner authenticates a stream's runner token.
func (s *API) pushRunner(ctx context.Context, tok string) (*store.Runner, error) {
	rn, err := s.runners.Authenticate(ctx, tok)
	if err != nil {
		return nil, s.pushError(err)
	}
	return rn, nil
}

// pushError maps the Runner API's outcomes to the push channel's.
func (s *API) pushError(err error) error {
	switch {
	case errors.Is(err, runners.ErrForbidden):
		return fmt.Errorf("%w: %w", jobpush.ErrUnauthenticated, err)
	case errors.Is(err, errOrphaned):
		return fmt.Errorf("%w: %w", jobpush.ErrOrphaned, err)
	}
	return err
}

// pushSession is one stream: the runner manager that opened it and the
// jobs handed out on it that the runner has not answered.
type pushSession struct {
	api      *API
	token    string
	systemID string
	info     *runnerapi.Info

	mu       sync.Mutex
	handOuts map[int64]*dispatch.HandOut
}

// Next checks the runner in anew (a runner deleted or paused while its
// stream is open gets nothing more: the registry forgets a changed
// runner at once) and hands out the next job, waiting up to the long poll
// timeout for one. A job that came while the runner was paused or
// deleted goes back.
func (p *pushSession) Next(ctx context.Context) (*jobpush.Job, error) {
	s := p.api
	rn, err := s.pushRunner(ctx, p.token)
	if err != nil {
		return nil, p.ended(ctx, err)
	}
	managerID, view, err := s.checkIn(ctx, rn, p.systemID, p.info)
	if err != nil {
		return nil, p.ended(ctx, s.pushError(err))
	}
	if rn.Paused {
		t := time.NewTimer(pausedRecheck)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		return nil, nil
	}
	h, payload, err := s.handOut(ctx, rn, view, managerID, s.cfg.LongPollTimeout)
	if errors.Is(err, dispatch.ErrLostRaces) {
		return nil, nil // other replicas took the jobs: wait again
	}
	if err != nil || h == nil {
		return nil, p.ended(ctx, err)
	}
	bg := context.WithoutCancel(ctx)
	if again, err := s.pushRunner(bg, p.token); err != nil || again.Paused {
		if rerr := s.dispatch.Release(bg, h); rerr != nil {
			s.log.Error("releasing a job handed out as its runner was paused or deleted", "job_id", h.Job.ID, "err", rerr)
		}
		return nil, p.ended(ctx, err)
	}
	// The bytes jobs/request would write (httpapi.WriteJSON).
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(payload); err != nil {
		if rerr := s.dispatch.Release(bg, h); rerr != nil {
			s.log.Error("releasing a job whose payload failed", "job_id", h.Job.ID, "err", rerr)
		}
		return nil, p.ended(ctx, fmt.Errorf("encoding the payload of job %d: %w", h.Job.ID, err))
	}
	p.mu.Lock()
	p.handOuts[h.Job.ID] = h
	p.mu.Unlock()
	return &jobpush.Job{ID: h.Job.ID, Payload: b.Bytes()}, nil
}

// pushRetry is how long a stream waits after a hand-out failed for
// another reason than the runner (the store, a payload): the stream stays,
// as a long-polling runner would ask again.
const pushRetry = time.Second

// ended is Next's error: none when ctx ended (the stream ended, or the
// runner's room went while it waited); the runner's own (its token, its
// projects) ends the stream; anything else is logged and waited out.
func (p *pushSession) ended(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, jobpush.ErrUnauthenticated) || errors.Is(err, jobpush.ErrOrphaned) {
		return err
	}
	p.api.log.Error("handing out a job to a push stream", "system_id", p.systemID, "err", err)
	t := time.NewTimer(pushRetry)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// Admitted forgets a job the runner took: it is the runner's now, and its
// acknowledgement (PUT /jobs/:id) follows on REST.
func (p *pushSession) Admitted(id int64) {
	p.mu.Lock()
	delete(p.handOuts, id)
	p.mu.Unlock()
}

// Acknowledge records the runner's admit of a pushed job as its
// acknowledgement, as PUT /jobs/:id state=running does for the job token
// of this hand-out: the job must still be this hand-out's.
func (p *pushSession) Acknowledge(ctx context.Context, id int64) jobpush.Ack {
	s := p.api
	p.mu.Lock()
	h := p.handOuts[id]
	delete(p.handOuts, id)
	p.mu.Unlock()
	if h == nil {
		return jobpush.Ack{Code: codes.FailedPrecondition, Message: "job was not handed out on this stream"}
	}
	j, err := s.acknowledge(ctx, h.Job, s.clock.Now().UTC())
	switch {
	case errors.Is(err, errNotWaiting):
		a := jobpush.Ack{Code: codes.FailedPrecondition, Message: "job is no longer waiting for this runner"}
		if j != nil {
			a.JobStatus = string(j.Status)
		}
		return a
	case err != nil:
		s.log.Error("acknowledging a pushed job", "job_id", id, "err", err)
		return jobpush.Ack{Code: codes.Unavailable, Message: "recording the acknowledgement failed"}
	}
	return jobpush.Ack{Code: codes.OK, JobStatus: string(j.Status), TraceUpdateInterval: s.cfg.TraceUpdateInterval}
}

// Release puts a rejected or unanswered job back into the queue. A job the
// runner acknowledged meanwhile (no longer pending) stays with it.
func (p *pushSession) Release(ctx context.Context, id int64) error {
	p.mu.Lock()
	h := p.handOuts[id]
	delete(p.handOuts, id)
	p.mu.Unlock()
	if h == nil {
		return nil
	}
	err := p.api.dispatch.Release(ctx, h)
	if errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}

// Close ends the session.
func (p *pushSession) Close() {}
