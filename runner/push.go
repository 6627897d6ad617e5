package runner

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// The push channel of an entry with FF_USE_JOB_ROUTER (docs/push.md): the
// entry holds one stream to its coordinator, announces the room it has,
// and admits the jobs pushed to it; its long poll loops wait meanwhile.
// When the coordinator names no channel, does not serve it, or the stream
// breaks, the entry long-polls, and tries the channel again later:
//
//	          ┌──────── discovery / dial fails ────────┐
//	          ▼                                        │
//	starting ───► (Ready) pushing ──(stream breaks)──► polling ──(retry due)──┘
//	   │                   ▲                              │
//	   └──(first try fails)┼──────────────────────────────┘
//	                       └──── (Ready) ◄── retry ◄─────
//
// Retries follow a circuit breaker like GitLab's: after a failure the
// next try comes after JobRouterOptions.Retry, doubling, and after
// BreakerFailures failures in a row only every BreakerOpen; a coordinator
// that names no channel or does not serve it (404 on the upgrade) is asked
// again after Rediscover.
//
// Where discovery names GitLab's own Job Router — a grpc:// or grpcs://
// URL, or a ws(s):// tunnel whose gRPC server has no push service — the
// entry pulls instead, as GitLab's runner does: its long poll loops send
// their jobs/request bodies to the router's GetJob (routing) rather than
// to POST /jobs/request. A router that answers Unimplemented is disabled:
// that request goes to REST and the entry long-polls until Rediscover.
// Transport failures (Unavailable, DeadlineExceeded, Canceled) count
// toward the router's breaker and cost only that poll; BreakerFailures of
// them in a row over at least BreakerGrace trip it: that request goes to
// REST, and the entry long-polls for BreakerOpen before one trial request
// goes to the router again (a trial that fails trips it at once).

// JobRouterOptions tune the push channel (zero values: the defaults).
type JobRouterOptions struct {
	// Retry is the wait after a first failure, doubled after each
	// further one (default 1 s).
	Retry time.Duration
	// BreakerOpen is the wait once BreakerFailures tries in a row failed
	// (default 30 s, GitLab's).
	BreakerOpen time.Duration
	// Rediscover is the wait after discovery named no channel or the
	// channel was not served (default 1 h, how long GitLab's runner keeps
	// a discovery answer).
	Rediscover time.Duration
	// DialTimeout bounds discovery and the stream's opening (default
	// 30 s).
	DialTimeout time.Duration
	// BreakerGrace is how long a Job Router's transport failures must
	// last before they trip its breaker (default 5 s, GitLab's): a burst
	// of failures as one connection drops does not.
	BreakerGrace time.Duration
}

// BreakerFailures is how many failed tries in a row open the breaker.
const BreakerFailures = 3

func (o JobRouterOptions) withDefaults() JobRouterOptions {
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	if o.BreakerOpen <= 0 {
		o.BreakerOpen = 30 * time.Second
	}
	if o.Rediscover <= 0 {
		o.Rediscover = time.Hour
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 30 * time.Second
	}
	if o.BreakerGrace <= 0 {
		o.BreakerGrace = 5 * time.Second
	}
	return o
}

// pushMode is where an entry with the push channel stands.
type pushMode int

const (
	pushStarting pushMode = iota // first try under way: no long poll yet
	pushPolling                  // long polling; the channel is tried again later
	pushActive                   // the stream is up: the long poll loops wait
	pushRouting                  // the long poll loops pull through GitLab's Job Router
)

// pushState is an entry's push channel.
type pushState struct {
	// room is signalled (non-blocking) whenever the manager's room may
	// have changed.
	room chan struct{}

	mu      sync.Mutex
	mode    pushMode
	changed chan struct{} // closed when mode changes
	// seen counts the jobs received on the current stream; it and the
	// room an admission takes change together, under mu.
	seen uint64

	// While routing: the router the long poll loops call, the end of
	// routing they report (the first reason wins), the calls under way
	// (the router is closed once they are done), and its breaker.
	router    *jobpush.RouterClient
	routerEnd chan routeEnd
	inflight  sync.WaitGroup
	breaker   routerBreaker
}

// routeEnd is why routing ended: a fallback reason and its error.
type routeEnd struct {
	reason string
	err    error
}

// routerBreaker counts a Job Router's transport failures in a row (GitLab
// runner's circuit breaker with its failure grace).
type routerBreaker struct {
	failures int
	first    time.Time
	// trial: the router is tried after the breaker tripped; one failure
	// trips it again.
	trial bool
}

func newPushState() *pushState {
	return &pushState{room: make(chan struct{}, 1), changed: make(chan struct{})}
}

func (p *pushState) setMode(m pushMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != m {
		p.mode = m
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// pushing reports whether w's stream is up.
func (w *worker) pushing() bool {
	if w.push == nil {
		return false
	}
	w.push.mu.Lock()
	defer w.push.mu.Unlock()
	return w.push.mode == pushActive
}

// waitPolling blocks a long poll loop of w while the push channel is up
// or being tried first; false when ctx ended. Polling goes on while the
// entry routes through a Job Router (the loops then call it).
func (w *worker) waitPolling(ctx context.Context) bool {
	if w.push == nil {
		return true
	}
	for {
		w.push.mu.Lock()
		mode, ch := w.push.mode, w.push.changed
		w.push.mu.Unlock()
		if mode == pushPolling || mode == pushRouting {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// roomChanged tells the entries holding a stream that the room may have
// changed.
func (m *Manager) roomChanged() {
	for _, w := range m.currentWorkers() {
		if w.push != nil {
			select {
			case w.push.room <- struct{}{}:
			default:
			}
		}
	}
}

// tryAcquire takes room for one job of w if there is some now.
func (m *Manager) tryAcquire(w *worker) bool {
	if w.limit != nil {
		select {
		case w.limit <- struct{}{}:
		default:
			return false
		}
	}
	if !m.room.tryTake() {
		if w.limit != nil {
			<-w.limit
		}
		return false
	}
	return true
}

// pushCapacity is the room w announces: the jobs it could start now, no
// more than an autoscaled executor could reserve capacity for. Called
// with w.push.mu held.
func (m *Manager) pushCapacity(w *worker) jobpush.Capacity {
	free := m.freeJobs(w)
	if h, ok := w.provider.(executor.HeadroomReporter); ok {
		if n := h.Headroom(); n >= 0 {
			free = min(free, n)
		}
	}
	m.mu.Lock()
	if m.opts.MaxJobs > 0 {
		free = min(free, max(0, m.opts.MaxJobs-m.received))
	}
	if m.stopped {
		free = 0
	}
	m.mu.Unlock()
	return jobpush.Capacity{Free: uint32(free), Seen: w.push.seen}
}

// pushLoop runs w's push channel until ctx ends.
func (m *Manager) pushLoop(ctx context.Context, w *worker) {
	o := m.opts.JobRouter.withDefaults()
	log := m.log.With("runner", w.short)
	failures := 0
	trial := false
	for ctx.Err() == nil {
		reason, err := m.pushOnce(ctx, w, log, trial)
		trial = false
		if ctx.Err() != nil {
			return
		}
		w.push.setMode(pushPolling)
		m.metrics.pushFallbacks.WithLabelValues(w.short, reason).Inc()
		var wait time.Duration
		switch reason {
		case "no_discovery", "router_disabled":
			failures = 0
			wait = o.Rediscover
			log.Info("no job push channel: long polling", "reason", reason, "err", err, "retry_in", wait)
		case "stream_ended":
			failures = 1
			wait = o.Retry
			log.Warn("job push stream ended: long polling until it is back", "err", err, "retry_in", wait)
		case "breaker_tripped":
			failures, trial = 0, true
			wait = o.BreakerOpen
			log.Warn("job router unreachable: long polling", "err", err, "retry_in", wait)
		default:
			failures++
			wait = o.Retry << min(failures-1, 10)
			if failures >= BreakerFailures || wait > o.BreakerOpen {
				wait = o.BreakerOpen
			}
			log.Warn("job push channel failed: long polling", "reason", reason, "failures", failures, "err", err, "retry_in", wait)
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// pushOnce discovers the channel, opens a stream and serves it until it
// ends, or routes through GitLab's Job Router until that ends; it returns
// why it ended (a fallback reason) and the error.
func (m *Manager) pushOnce(ctx context.Context, w *worker, log *slog.Logger, trial bool) (string, error) {
	o := m.opts.JobRouter.withDefaults()
	dctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	creds := w.creds()
	u, err := m.client.DiscoverJobRouter(dctx, creds)
	switch {
	case errors.Is(err, jobpush.ErrNoServer):
		return "no_discovery", err
	case err != nil:
		return "discovery_failed", err
	}
	if u.Scheme == "grpc" || u.Scheme == "grpcs" {
		return m.routeJobs(ctx, w, u.String(), log, trial)
	}
	w.push.mu.Lock()
	w.push.seen = 0
	hello := jobpush.Hello{SystemID: m.systemID, Info: w.infoCopy(), Capacity: m.pushCapacity(w), Acknowledge: true}
	w.push.mu.Unlock()
	s, err := jobpush.Dial(dctx, u.String(), creds.Token, jobpush.DialOptions{HTTPClient: m.entryHTTPClient(w),
		Header: http.Header{"User-Agent": {network.UserAgent(m.opts.Version)}}, Hello: hello})
	switch {
	case errors.Is(err, jobpush.ErrNotServed):
		// A tunnel without the push service may be GitLab's Job Router
		// over a WebSocket: its GetJob says (a 404 on the upgrade, or
		// Unimplemented, ends routing as router_disabled).
		return m.routeJobs(ctx, w, u.String(), log, trial)
	case errors.Is(err, jobpush.ErrUnauthenticated):
		return "unauthenticated", err
	case err != nil:
		return "dial_failed", err
	}
	defer s.Close()
	w.push.setMode(pushActive)
	log.Info("job push stream open", "url", u.String(), "free", hello.Capacity.Free)
	return "stream_ended", m.serveStream(ctx, w, s, hello.Capacity)
}

// serveStream admits or rejects the jobs pushed on s and announces w's
// room whenever it changes, until the stream or ctx ends.
func (m *Manager) serveStream(ctx context.Context, w *worker, s *jobpush.Stream, announced jobpush.Capacity) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sctx, func() { _ = s.Close() })
	defer stop()
	// A rejected job leaves the coordinator thinking the runner full: the
	// room is announced again after check_interval, not at once, so that
	// a runner that cannot take jobs does not bounce them back and forth.
	rejected := make(chan struct{}, 1)
	go m.announceRoom(sctx, w, s, announced, rejected)
	for {
		j, err := s.Recv()
		if err != nil {
			return err
		}
		m.admit(sctx, w, s, j, rejected)
	}
}

// announceRoom sends w's capacity whenever it differs from the last one
// announced, and after a reject once check_interval passed.
func (m *Manager) announceRoom(ctx context.Context, w *worker, s *jobpush.Stream, last jobpush.Capacity, rejected chan struct{}) {
	var hold <-chan time.Time
	// An autoscaled executor's headroom changes with its fleet (instances
	// become ready, are removed), which no job of this runner tells:
	// looked at every check_interval.
	var fleet <-chan time.Time
	if _, ok := w.provider.(executor.HeadroomReporter); ok {
		t := time.NewTicker(m.pollInterval())
		defer t.Stop()
		fleet = t.C
	}
	for {
		force := false
		select {
		case <-ctx.Done():
			return
		case <-w.push.room:
			if hold != nil {
				continue // announced when the hold ends
			}
		case <-fleet:
			if hold != nil {
				continue
			}
		case <-rejected:
			hold = time.After(m.pollInterval())
			continue
		case <-hold:
			hold, force = nil, true
		}
		w.push.mu.Lock()
		c := m.pushCapacity(w)
		w.push.mu.Unlock()
		if c == last && !force {
			continue
		}
		if err := s.Announce(c); err != nil {
			return // the stream is ending
		}
		last = c
	}
}

// admit takes room for a pushed job and starts it, or rejects it: full
// (ResourceExhausted) when there is no room or no capacity, or a payload
// it cannot read. On a stream that acknowledges, the admit is the job's
// acknowledgement and the job waits for the coordinator's answer on the
// stream; otherwise, or when the stream ends first, the acknowledgement
// on REST decides, as for any job: an admit that did not reach the
// coordinator before the stream broke finds the job given back (403)
// and drops it.
func (m *Manager) admit(ctx context.Context, w *worker, s *jobpush.Stream, j *jobpush.Job, rejected chan struct{}) {
	reject := func(code codes.Code, msg string) {
		m.metrics.pushJobs.WithLabelValues(w.short, "rejected").Inc()
		_ = s.Reject(j.ID, code, msg)
		select {
		case rejected <- struct{}{}:
		default:
		}
	}
	w.push.mu.Lock()
	w.push.seen++
	ok := m.tryAcquire(w)
	w.push.mu.Unlock()
	if !ok {
		reject(codes.ResourceExhausted, "no room for another job")
		return
	}
	if !m.mayReceive() {
		m.release(w)
		reject(codes.ResourceExhausted, "the runner takes no more jobs")
		return
	}
	key, ok := m.reserve(ctx, w)
	if !ok {
		m.release(w)
		reject(codes.ResourceExhausted, "no capacity for another job")
		return
	}
	var job runnerapi.JobResponse
	if err := json.Unmarshal(j.Payload, &job); err != nil {
		m.release(w)
		w.unreserve(key)
		m.log.Error("a pushed job's payload is not a job", "runner", w.short, "job", j.ID, "err", err)
		reject(codes.InvalidArgument, "payload: "+err.Error())
		return
	}
	ack, _ := s.Admit(j.ID) // a send that failed: the stream is ending, REST decides
	m.metrics.pushJobs.WithLabelValues(w.short, "admitted").Inc()
	m.startJob(w, &job, key, ack)
}

// routeJobs makes w's long poll loops pull through the Job Router at
// serverURL until one of them ends routing (routeRequest) or ctx ends;
// it returns the fallback reason.
func (m *Manager) routeJobs(ctx context.Context, w *worker, serverURL string, log *slog.Logger, trial bool) (string, error) {
	rc, err := jobpush.DialRouter(serverURL, w.creds().Token, jobpush.DialOptions{HTTPClient: m.entryHTTPClient(w),
		Header: http.Header{"User-Agent": {network.UserAgent(m.opts.Version)}}})
	if err != nil {
		return "dial_failed", err
	}
	end := make(chan routeEnd, 1)
	w.push.mu.Lock()
	w.push.router, w.push.routerEnd = rc, end
	w.push.breaker = routerBreaker{trial: trial}
	w.push.mu.Unlock()
	w.push.setMode(pushRouting)
	log.Info("pulling jobs through the job router", "url", serverURL)
	var e routeEnd
	select {
	case e = <-end:
	case <-ctx.Done():
		e = routeEnd{err: ctx.Err()}
	}
	w.push.mu.Lock()
	w.push.router, w.push.routerEnd = nil, nil
	w.push.mu.Unlock()
	// Calls under way may still bring a job: the router is closed after.
	w.push.inflight.Wait()
	_ = rc.Close()
	return e.reason, e.err
}

// routerOf returns the Job Router w's long poll loops call now (nil: none)
// and counts the caller as one of its calls until done is called.
func (w *worker) routerOf() (rc *jobpush.RouterClient, done func()) {
	if w.push == nil {
		return nil, nil
	}
	w.push.mu.Lock()
	defer w.push.mu.Unlock()
	if w.push.router == nil {
		return nil, nil
	}
	w.push.inflight.Add(1)
	return w.push.router, w.push.inflight.Done
}

// endRouting ends w's routing for reason (the first reason wins).
func (w *worker) endRouting(reason string, err error) {
	w.push.mu.Lock()
	defer w.push.mu.Unlock()
	if w.push.routerEnd != nil {
		select {
		case w.push.routerEnd <- routeEnd{reason, err}:
		default:
		}
	}
}

// isRouterFailure reports whether a GetJob error says the router cannot
// be reached (GitLab's runner counts these toward its breaker).
func isRouterFailure(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// routeRequest is one job request of w through the Job Router rc. A
// disabled router, or a transport failure that trips the breaker, ends
// routing, and rest says the request is to go to REST instead; a
// transport failure below that is "no job" for this poll.
func (m *Manager) routeRequest(ctx context.Context, w *worker, rc *jobpush.RouterClient, atOnce bool) (job *runnerapi.JobResponse, rest bool, err error) {
	job, err = m.client.RequestJobRouted(ctx, rc, w.creds(), m.systemID, w.infoCopy(), atOnce)
	switch {
	case err == nil || ctx.Err() != nil:
		w.routerAnswered()
		return job, false, err
	case errors.Is(err, jobpush.ErrNotServed):
		w.routerAnswered()
		w.endRouting("router_disabled", err)
		return nil, true, nil
	case isRouterFailure(err):
		if w.routerFailed(m.opts.JobRouter.withDefaults().BreakerGrace) {
			w.endRouting("breaker_tripped", err)
			return nil, true, nil
		}
		m.log.Warn("job router request failed", "runner", w.short, "err", err)
		return nil, false, nil
	}
	// The router answered: it is reachable, the request itself failed.
	w.routerAnswered()
	return nil, false, err
}

// routerAnswered resets the router's breaker.
func (w *worker) routerAnswered() {
	w.push.mu.Lock()
	defer w.push.mu.Unlock()
	w.push.breaker = routerBreaker{}
}

// routerFailed counts a transport failure and reports whether it trips
// the breaker.
func (w *worker) routerFailed(grace time.Duration) bool {
	w.push.mu.Lock()
	defer w.push.mu.Unlock()
	b := &w.push.breaker
	now := time.Now()
	if b.trial {
		return true
	}
	if b.failures == 0 {
		b.first = now
	}
	b.failures++
	return b.failures >= BreakerFailures && now.Sub(b.first) >= grace
}

// entryHTTPClient is the manager's HTTP client with w's coordinator's
// transport (its TLS files, if set), for the push channel and the Job
// Router.
func (m *Manager) entryHTTPClient(w *worker) *http.Client {
	hc := http.Client{}
	if m.opts.HTTPClient != nil {
		hc = *m.opts.HTTPClient
	}
	hc.Transport = m.client.TransportFor(w.creds().URL)
	return &hc
}
