// Package runner is the runner manager: it asks coordinators (Berth's or a
// real GitLab) for jobs and runs each one through an executor, streaming
// the trace back and reporting the result, as gitlab-runner does
// (gitlab-protocol.md §1–§5).
//
// A Manager is built from a loaded config.Config and runs until its
// context ends:
//
//	m, _ := runner.New(cfg, runner.Options{Logger: log, NewProvider: …})
//	go m.Run(ctx)   // ctx done: abort running jobs (runner_system_failure)
//	m.Stop()        // or: finish running jobs, then Run returns
//
// Workers: each [[runners]] entry polls with request_concurrency parallel
// jobs/request calls; a call is only made when a job could start (global
// concurrent and the entry's limit both have room), so a runner never takes
// a job it cannot run. After a job is received the worker asks again at
// once; after "no job" it waits check_interval. A request holds its room
// while the coordinator holds it (long polling); when the room left could
// not hold a request of every entry (a manager serving several cells or
// coordinators with concurrent below their number), requests are sent so
// that they are answered at once instead, and the room goes round the
// entries rather than staying with the one whose request is held. Consecutive failures
// (network errors, 403) up to unhealthy_requests_limit make the entry
// unhealthy: it then probes the coordinator with one request at a time,
// check_interval after the failure and twice as long after each failed
// probe, capped at unhealthy_interval, and is healthy again at the first
// answer. (GitLab's runner pauses for the whole unhealthy_interval, an
// hour by default, so a 12 s coordinator restart idled it for an hour.)
//
// An entry with FF_USE_JOB_ROUTER takes its jobs over the coordinator's
// push channel instead whenever the coordinator serves it, and long-polls
// as above when it does not (push.go, docs/push.md).
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runner/cache"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// Options are the collaborators and tunables of a Manager. Zero values
// take the defaults.
type Options struct {
	Logger *slog.Logger
	// HTTPClient carries every API call (nil: a default client).
	HTTPClient *http.Client
	// NewProvider returns the executor provider of a [[runners]] entry
	// (wiring lives in cmd/berth). Required.
	NewProvider func(rc *config.Runner) (executor.Provider, error)
	// ConfigPath is where token rotations are written back ("": kept in
	// memory only, for an embedded runner).
	ConfigPath string
	// SystemID identifies this machine ("": read or created beside
	// ConfigPath, or generated when there is none).
	SystemID string
	// Version is reported in the User-Agent, info and the job log.
	Version string
	// Registerer receives the metrics (nil: a private registry, served by
	// MetricsHandler).
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// PollInterval overrides check_interval (embedding and tests).
	PollInterval time.Duration
	// MaxJobs stops asking for jobs after this many (0: no limit); Run
	// returns when they are done (run-single --max-builds).
	MaxJobs int
	// User overrides config.toml's user (`berth runner run --user`, as
	// gitlab-runner run's): the shell executor runs jobs as this user.
	User string
	// TraceInterval is the trace update interval until the coordinator
	// sends one (default 3 s); ForceSendInterval the keep-alive period
	// (default 30 s).
	TraceInterval     time.Duration
	ForceSendInterval time.Duration
	// RequestBackoff governs automatic retries of API calls (default
	// 100 ms → 60 s); FinalUpdateBackoff the retries of a failed final
	// update (default 1 s → 60 min).
	RequestBackoff     network.Backoff
	FinalUpdateBackoff network.Backoff
	// Now is the clock of token rotation (nil: time.Now).
	Now func() time.Time
	// OnJobTiming, if set, receives where each job's time went once its
	// final update is done (or the job was dropped). It is called on the
	// job's goroutine: it must not block.
	OnJobTiming func(JobTiming)
	// JobRouter tunes the push channel of entries with FF_USE_JOB_ROUTER
	// (push.go).
	JobRouter JobRouterOptions
}

// Manager runs the workers of every [[runners]] entry of one config.
type Manager struct {
	cfg      *config.Config
	opts     Options
	log      *slog.Logger
	client   *network.Client
	systemID string
	metrics  *metrics
	gatherer prometheus.Gatherer
	// room bounds the jobs at once (concurrent).
	room *room

	// cfgMu guards cfg (a reload replaces it), the token fields of its
	// Runners, and Save.
	cfgMu sync.Mutex

	jobsCtx   context.Context
	abortJobs context.CancelCauseFunc
	netCtx    context.Context
	stopNet   context.CancelFunc

	mu       sync.Mutex
	stopReq  context.CancelFunc
	stopped  bool
	received int
	jobs     sync.WaitGroup
	// workers are the entries asking for jobs: a slice never changed,
	// replaced whole (under mu) by a reload, read without a lock on the
	// job path. loops counts every worker's asking goroutines, retired
	// ones too. runCtx is Run's context for asking while Run asks (nil
	// before and after; under mu).
	workers atomic.Pointer[[]*worker]
	loops   sync.WaitGroup
	runCtx  context.Context
	// retiring counts retired workers whose provider is not shut down
	// yet.
	retiring sync.WaitGroup

	// branches are the matrix prefixes its jobs share.
	branches branchRegistry
}

// worker is one [[runners]] entry.
type worker struct {
	m        *Manager
	rc       *config.Runner
	short    string
	provider executor.Provider
	limit    chan struct{}
	info     runnerapi.Info
	// slots numbers the jobs of the entry's runner; a worker that
	// replaces another (a reload) shares its table.
	slots *slotTable
	// ctx ends when the worker stops asking (retired, or the manager
	// stops); loops are its asking goroutines, jobs its running jobs.
	ctx    context.Context
	retire context.CancelFunc
	loops  sync.WaitGroup
	jobs   sync.WaitGroup
	// retired: a reload stopped it (it may stand in the list of workers
	// until its successor is made, with the settings successor holds;
	// under m.mu).
	retired   atomic.Bool
	successor *config.Runner
	shutOnce  sync.Once
	shutErr   error
	// asking counts this entry's job requests in flight.
	asking atomic.Int32
	// cache is the distributed cache of [runners.cache] (nil: local).
	cache *cache.S3
	// push is the entry's push channel (nil: FF_USE_JOB_ROUTER is off).
	push *pushState

	mu       sync.Mutex
	failures int
	// reservations numbers the reservation keys of Reserver providers.
	reservations uint64
	// While unhealthy, nextProbe is when the next request may go out and
	// probeDelay the wait after a failed probe.
	unhealthy  bool
	nextProbe  time.Time
	probeDelay time.Duration
}

// New builds a Manager. cfg must have been validated; it is not copied:
// token rotations update it (and ConfigPath).
func New(cfg *config.Config, opts Options) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("runner config: %w", err)
	}
	if opts.NewProvider == nil {
		return nil, errors.New("runner: Options.NewProvider is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.TraceInterval <= 0 {
		opts.TraceInterval = 3 * time.Second
	}
	if opts.ForceSendInterval <= 0 {
		opts.ForceSendInterval = 30 * time.Second
	}
	if opts.FinalUpdateBackoff.Min <= 0 {
		opts.FinalUpdateBackoff = network.Backoff{Min: time.Second, Max: time.Hour, Factor: 2}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Manager{cfg: cfg, opts: opts, log: opts.Logger}
	m.client = network.New(network.Options{HTTPClient: opts.HTTPClient, Logger: opts.Logger, Version: opts.Version, Backoff: opts.RequestBackoff,
		ConnectionMaxAge: cfg.EffectiveConnectionMaxAge()})
	switch {
	case opts.SystemID != "":
		m.systemID = opts.SystemID
	case opts.ConfigPath != "":
		id, err := config.LoadOrCreateSystemID(opts.ConfigPath)
		if err != nil {
			return nil, err
		}
		m.systemID = id
	default:
		m.systemID = config.NewSystemID("")
	}
	reg := opts.Registerer
	m.gatherer = opts.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, m.gatherer = r, r
	}
	m.metrics = newMetrics(reg)
	m.room = newRoom(cfg.Concurrent)
	var workers []*worker
	for _, rc := range cfg.Runners {
		if !config.Supported(rc.Executor) {
			m.log.Warn("runner skipped: its executor is not supported by Berth yet", "name", rc.Name, "runner", token.Short(rc.Token), "executor", rc.Executor)
			continue
		}
		w, err := m.newWorker(rc, nil)
		if err != nil {
			return nil, err
		}
		workers = append(workers, w)
	}
	m.workers.Store(&workers)
	if len(workers) == 0 && len(cfg.Runners) > 0 {
		return nil, fmt.Errorf("no [[runners]] entry has a supported executor (%s)", strings.Join(config.SupportedExecutors, ", "))
	}
	m.jobsCtx, m.abortJobs = context.WithCancelCause(context.Background())
	m.netCtx, m.stopNet = context.WithCancel(context.Background())
	return m, nil
}

// newWorker makes the worker of entry rc with a new executor provider;
// slots, when not nil, is the slot table of the worker it replaces.
func (m *Manager) newWorker(rc *config.Runner, slots *slotTable) (*worker, error) {
	p, err := m.opts.NewProvider(rc)
	if err != nil {
		return nil, fmt.Errorf("runner %q: %w", rc.Name, err)
	}
	if slots == nil {
		slots = &slotTable{}
	}
	w := &worker{m: m, rc: rc, short: token.Short(rc.Token), provider: p, slots: slots}
	if err := m.client.SetTLS(rc.URL, rc.TLSFiles()); err != nil {
		return nil, fmt.Errorf("runner %q: %w", rc.Name, err)
	}
	if rc.FeatureFlag(jobpush.FeatureFlag) {
		w.push = newPushState()
	}
	if rc.Cache.RemoteType() == config.CacheTypeS3 {
		if w.cache, err = cache.NewS3(rc.Cache); err != nil {
			return nil, fmt.Errorf("runner %q: %w", rc.Name, err)
		}
	}
	if rc.Limit > 0 {
		w.limit = make(chan struct{}, rc.Limit)
	}
	w.info = runnerapi.Info{
		Name: "berth", Version: m.opts.Version, Platform: runtime.GOOS, Architecture: runtime.GOARCH,
		Executor: rc.Executor, Shell: rc.EffectiveShell(), Labels: rc.ComputedLabels(),
	}
	if d, ok := p.(executor.Describer); ok {
		d.Describe(&w.info)
	}
	w.info.IsolationLevels = []string{string(executor.IsolationNone)}
	if iso, ok := p.(executor.Isolator); ok {
		w.info.IsolationLevels = w.info.IsolationLevels[:0]
		for _, l := range iso.IsolationLevels() {
			w.info.IsolationLevels = append(w.info.IsolationLevels, string(l))
		}
	}
	SetClientFeatures(&w.info.Features)
	return w, nil
}

// startWorker starts w's asking loops under Run's context; nothing when
// Run does not ask (before: it starts them; after: nobody does). Called
// with m.mu held.
func (m *Manager) startWorker(w *worker) {
	if m.runCtx == nil || m.runCtx.Err() != nil || w.ctx != nil {
		return
	}
	w.ctx, w.retire = context.WithCancel(m.runCtx)
	ctx := w.ctx
	loop := func(f func(ctx context.Context, w *worker)) {
		w.loops.Add(1)
		m.loops.Add(1)
		go func() {
			defer m.loops.Done()
			defer w.loops.Done()
			f(ctx, w)
		}()
	}
	if sink, ok := w.provider.(executor.DemandSink); ok {
		loop(func(ctx context.Context, w *worker) { m.reportDemand(ctx, w, sink) })
	}
	if fr, ok := w.provider.(executor.FleetReporter); ok {
		loop(func(ctx context.Context, w *worker) { m.reportFleet(ctx, w, fr) })
	}
	m.log.Info("runner started", "runner", w.short, "name", w.rc.Name, "url", w.rc.URL, "executor", w.rc.Executor, "system_id", m.systemID)
	loop(m.rotateTokens)
	if w.push != nil {
		loop(m.pushLoop)
	}
	for range w.rc.EffectiveRequestConcurrency() {
		loop(m.requestLoop)
	}
}

// config is the configuration in force (a reload replaces it).
func (m *Manager) config() *config.Config {
	m.cfgMu.Lock()
	defer m.cfgMu.Unlock()
	return m.cfg
}

// currentWorkers are the entries asking for jobs now.
func (m *Manager) currentWorkers() []*worker { return *m.workers.Load() }

// setWorkers replaces the entries asking for jobs. Called with m.mu held.
func (m *Manager) setWorkers(ws []*worker) { m.workers.Store(&ws) }

// Close releases what the executor providers hold beyond single jobs
// (plugin processes, connections, clients) through their Shutdowner, each
// bounded by ctx. Call it once, after Run has returned; a caller that
// manages its providers itself (berth run) need not.
func (m *Manager) Close(ctx context.Context) error {
	// Workers a reload retired shut their providers down themselves.
	retired := make(chan struct{})
	go func() {
		m.retiring.Wait()
		close(retired)
	}()
	select {
	case <-retired:
	case <-ctx.Done():
	}
	var errs []error
	for _, w := range m.currentWorkers() {
		if err := w.shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// shutdown releases what w's provider holds beyond single jobs, once.
func (w *worker) shutdown(ctx context.Context) error {
	w.shutOnce.Do(func() {
		if s, ok := w.provider.(executor.Shutdowner); ok {
			if err := s.Shutdown(ctx); err != nil {
				w.shutErr = fmt.Errorf("runner %s: shutting down its executor: %w", w.short, err)
			}
		}
	})
	return w.shutErr
}

// SetClientFeatures sets the features the network client always
// advertises. job_inputs is left out: Berth does not interpolate inputs.
// vault_secrets is the runner's (not a shell's): it reads secrets itself,
// before the job's environment exists.
func SetClientFeatures(f *runnerapi.Features) {
	f.TraceReset = true
	f.TraceChecksum = true
	f.TraceSize = true
	f.Cancelable = true
	f.CancelGracefully = true
	f.TwoPhaseJobCommit = true
	f.VaultSecrets = true // resolve_secrets, runner/secrets.go
}

// SystemID is the system_id this manager reports.
func (m *Manager) SystemID() string { return m.systemID }

// Client is the API client the manager uses.
func (m *Manager) Client() *network.Client { return m.client }

// MetricsHandler serves the manager's metrics (when it owns its registry).
func (m *Manager) MetricsHandler() http.Handler {
	if m.gatherer == nil {
		return promhttp.Handler()
	}
	return promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{})
}

// Stop asks the manager to finish gracefully (SIGQUIT): no new jobs are
// requested; Run returns once running jobs have finished. Safe to call
// more than once and before Run.
func (m *Manager) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	if m.stopReq != nil {
		m.stopReq()
	}
}

// Run polls for jobs and runs them until ctx ends or Stop is called. When
// ctx ends, running jobs are aborted and reported as
// runner_system_failure, waiting at most shutdown_timeout for them; after
// Stop, running jobs finish first. It returns nil on an orderly stop.
func (m *Manager) Run(ctx context.Context) error {
	reqCtx, stopReq := context.WithCancel(ctx)
	m.mu.Lock()
	m.stopReq = stopReq
	if m.stopped {
		stopReq()
	}
	m.mu.Unlock()
	defer stopReq()

	var srv *http.Server
	if addr := m.config().MetricsAddress(); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.MetricsHandler())
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		m.log.Info("metrics server listening", "address", ln.Addr().String())
		defer srv.Close()
	}

	// What jobs of a crashed predecessor left behind goes before this
	// manager asks for jobs of its own.
	ws := m.currentWorkers()
	for _, w := range ws {
		if sw, ok := w.provider.(executor.Sweeper); ok {
			if err := sw.Sweep(ctx, executor.SweepOptions{SystemID: m.systemID, ShortToken: w.short}); err != nil {
				m.log.Warn("sweeping leftovers of a previous runner manager failed", "runner", w.short, "err", err)
			}
		}
	}
	m.mu.Lock()
	m.runCtx = reqCtx
	for _, w := range m.currentWorkers() {
		m.startWorker(w)
	}
	m.mu.Unlock()
	<-reqCtx.Done()
	// No worker starts from now on (startWorker, under mu, sees no
	// runCtx): wait for every worker's loops, retired ones too.
	m.mu.Lock()
	m.runCtx = nil
	m.mu.Unlock()
	m.loops.Wait()

	jobsDone := make(chan struct{})
	go func() {
		m.jobs.Wait()
		close(jobsDone)
	}()
	select {
	case <-jobsDone:
		return nil
	case <-ctx.Done():
	}
	timeout := m.config().ShutdownTimeoutDuration()
	m.log.Warn("aborting running jobs", "shutdown_timeout", timeout)
	m.abortJobs(ErrShutdown)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-jobsDone:
		return nil
	case <-t.C:
	}
	m.stopNet()
	select {
	case <-jobsDone:
	case <-time.After(5 * time.Second):
	}
	return errors.New("shutdown timeout: some jobs did not report their final state")
}

func (w *worker) creds() network.RunnerCredentials {
	w.m.cfgMu.Lock()
	defer w.m.cfgMu.Unlock()
	return network.RunnerCredentials{URL: w.rc.URL, Token: w.rc.Token}
}

func (w *worker) infoCopy() *runnerapi.Info {
	i := w.info
	return &i
}

// demandInterval is how often the queue insight is asked for.
const demandInterval = 2 * time.Second

// reportDemand tells w's provider how many jobs wait in the coordinator
// that w could take now: the coordinator's count for the runner, bounded
// by the jobs w may still start (limit and concurrent). It stops where the
// coordinator has no queue insight.
func (m *Manager) reportDemand(ctx context.Context, w *worker, sink executor.DemandSink) {
	t := time.NewTicker(demandInterval)
	defer t.Stop()
	for {
		n, err := m.client.QueuedJobs(ctx, w.creds(), w.info.IsolationLevels)
		switch {
		case errors.Is(err, network.ErrNoQueueInsight):
			m.log.Info("the coordinator has no queue insight: the autoscaler scales on reservations only", "runner", w.short)
			return
		case err != nil:
			if ctx.Err() == nil {
				m.log.Debug("asking the coordinator for its queue failed", "runner", w.short, "err", err)
			}
		default:
			sink.SetDemand(min(n, m.freeJobs(w)))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// freeJobs is how many more jobs w may start now.
func (m *Manager) freeJobs(w *worker) int {
	free := m.room.free()
	if w.limit != nil {
		free = min(free, cap(w.limit)-len(w.limit))
	}
	return max(0, free)
}

// roomIsShort reports, for a request of w that holds room, whether the
// room left could not hold a request of every other entry that has none
// in flight: the manager serves several entries (cells, coordinators)
// and a held request would keep them from asking.
func (m *Manager) roomIsShort(w *worker) bool {
	needy := 0
	for _, o := range m.currentWorkers() {
		// (An entry whose jobs are pushed needs no room to ask.)
		if o != w && !o.retired.Load() && o.asking.Load() == 0 && !o.pushing() {
			needy++
		}
	}
	return needy > m.room.free()
}

// acquire waits for room for one more job of w.
func (m *Manager) acquire(ctx context.Context, w *worker) bool {
	if w.limit != nil {
		select {
		case w.limit <- struct{}{}:
		case <-ctx.Done():
			return false
		}
	}
	if !m.room.take(ctx) {
		if w.limit != nil {
			<-w.limit
		}
		return false
	}
	m.roomChanged()
	return true
}

func (m *Manager) release(w *worker) {
	m.room.give()
	if w.limit != nil {
		<-w.limit
	}
	m.roomChanged()
}

// runUser is the user the shell executor runs jobs as ("": the runner's).
func (m *Manager) runUser() string {
	if m.opts.User != "" {
		return m.opts.User
	}
	return m.config().User
}

func (m *Manager) pollInterval() time.Duration {
	if m.opts.PollInterval > 0 {
		return m.opts.PollInterval
	}
	return m.config().CheckIntervalDuration()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// maxQuickRequests bounds the requests in a row sent without waiting
// check_interval (see requestLoop).
const maxQuickRequests = 3

// requestLoop is one of the request_concurrency pollers of w.
func (m *Manager) requestLoop(ctx context.Context, w *worker) {
	// quick counts the requests in a row asked again at once: a 204 that
	// brings a new X-GitLab-Last-Update means the coordinator will hold
	// the next request until a job comes (long polling), so waiting
	// check_interval first would only delay that job. A coordinator that
	// answers at once every time still gets check_interval.
	quick := 0
	for ctx.Err() == nil {
		// While the entry's jobs are pushed, it does not long-poll.
		if !w.waitPolling(ctx) {
			return
		}
		if wait := w.claimProbe(); wait > 0 {
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		if !m.acquire(ctx, w) {
			return
		}
		if !m.mayReceive() {
			m.release(w)
			m.Stop()
			return
		}
		// An autoscaled executor reserves capacity first: without it the
		// runner does not ask for a job.
		key, ok := m.reserve(ctx, w)
		if !ok {
			m.release(w)
			if !sleep(ctx, m.pollInterval()) {
				return
			}
			continue
		}
		sent := m.client.LastUpdate(w.creds())
		request := m.client.RequestJob
		// Other entries need this room too: ask without being held, so
		// that it goes round them.
		atOnce := m.roomIsShort(w)
		if atOnce {
			request = m.client.RequestJobAtOnce
		}
		w.asking.Add(1)
		var job *runnerapi.JobResponse
		var err error
		rest := true
		if rc, done := w.routerOf(); rc != nil {
			job, rest, err = m.routeRequest(ctx, w, rc, atOnce)
			done()
		}
		if rest {
			job, err = request(ctx, w.creds(), m.systemID, w.infoCopy())
		}
		w.asking.Add(-1)
		if err != nil || job == nil {
			m.release(w)
			w.unreserve(key)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			outcome := w.requestFailed(err)
			m.metrics.requests.WithLabelValues(w.short, outcome).Inc()
			if !sleep(ctx, m.pollInterval()) {
				return
			}
		case job == nil:
			w.requestSucceeded()
			m.metrics.requests.WithLabelValues(w.short, "no_job").Inc()
			if lu := m.client.LastUpdate(w.creds()); lu != "" && lu != sent && quick < maxQuickRequests {
				quick++
				continue
			}
			quick = 0
			if !sleep(ctx, m.pollInterval()) {
				return
			}
		default:
			quick = 0
			w.requestSucceeded()
			m.metrics.requests.WithLabelValues(w.short, "job").Inc()
			m.startJob(w, job, key, nil)
			// strict_check_interval: no quick request after a job either.
			if w.rc.StrictCheckInterval && !sleep(ctx, m.pollInterval()) {
				return
			}
		}
	}
}

// mayReceive counts a job request against MaxJobs.
func (m *Manager) mayReceive() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.opts.MaxJobs <= 0 || m.received < m.opts.MaxJobs
}

// reserve reserves capacity for one job of w when its executor needs it,
// and returns the reservation key ("" when it does not). ok is false when
// there is no capacity now (or reserving failed): no job is requested.
func (m *Manager) reserve(ctx context.Context, w *worker) (key string, ok bool) {
	res, isReserver := w.provider.(executor.Reserver)
	if !isReserver {
		return "", true
	}
	w.mu.Lock()
	w.reservations++
	key = fmt.Sprintf("%s-%d", w.short, w.reservations)
	w.mu.Unlock()
	if err := res.Reserve(ctx, key); err != nil {
		if errors.Is(err, executor.ErrNoCapacity) {
			m.metrics.requests.WithLabelValues(w.short, "no_capacity").Inc()
			m.log.Debug("no free capacity: not asking for a job", "runner", w.short, "why", err)
		} else if ctx.Err() == nil {
			m.metrics.requests.WithLabelValues(w.short, "reserve_failed").Inc()
			m.log.Warn("reserving capacity failed: not asking for a job", "runner", w.short, "err", err)
		}
		return "", false
	}
	return key, true
}

// claim tells a Claimer provider that the reservation key ("" is none)
// brought a job.
func (w *worker) claim(key string) {
	if key == "" {
		return
	}
	if c, ok := w.provider.(executor.Claimer); ok {
		c.Claim(key)
	}
}

// unreserve gives back the capacity reserved under key ("" is none).
func (w *worker) unreserve(key string) {
	if key == "" {
		return
	}
	if res, ok := w.provider.(executor.Reserver); ok {
		res.Unreserve(key)
	}
}

// ack, when not nil, is the job's acknowledgement under way on the push
// stream it came on (its admit); otherwise the job is acknowledged on
// REST.
func (m *Manager) startJob(w *worker, job *runnerapi.JobResponse, reservation string, ack jobpush.AckWait) {
	w.claim(reservation)
	m.mu.Lock()
	m.received++
	last := m.opts.MaxJobs > 0 && m.received >= m.opts.MaxJobs
	m.mu.Unlock()
	if last {
		m.Stop()
	}
	slot := w.takeSlot()
	m.jobs.Add(1)
	w.jobs.Add(1)
	m.log.Info("job received", "runner", w.short, "job", job.ID, "name", job.JobInfo.Name, "slot", slot)
	go func() {
		defer m.jobs.Done()
		defer w.jobs.Done()
		defer m.release(w)
		defer w.freeSlot(slot)
		defer w.unreserve(reservation)
		r := newJobRun(m, w, job, slot)
		r.reservation = reservation
		r.streamAck = ack
		r.run()
	}()
}

// slotTable numbers the running jobs of one runner from 0, the lowest
// free number first (its builds directory, CI_CONCURRENT_ID).
type slotTable struct {
	mu   sync.Mutex
	used []bool
}

func (w *worker) takeSlot() int {
	t := w.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, used := range t.used {
		if !used {
			t.used[i] = true
			return i
		}
	}
	t.used = append(t.used, true)
	return len(t.used) - 1
}

func (w *worker) freeSlot(i int) {
	t := w.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	t.used[i] = false
}

// isUnhealthy reports whether w only probes.
func (w *worker) isUnhealthy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unhealthy
}

// claimProbe returns how long a request loop of an unhealthy w must wait
// before asking again, or 0 when it may send a request now; an unhealthy
// w gives the probe to one loop and makes the others wait for its
// outcome.
func (w *worker) claimProbe() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.unhealthy {
		return 0
	}
	now := time.Now()
	if wait := w.nextProbe.Sub(now); wait > 0 {
		return wait
	}
	// Others wait at most one probe delay for this probe's outcome.
	w.nextProbe = now.Add(w.probeDelay)
	return 0
}

func (w *worker) requestSucceeded() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.unhealthy {
		w.m.log.Info("coordinator answers again; runner is healthy", "runner", w.short)
	}
	w.failures, w.unhealthy = 0, false
}

// requestFailed logs and classifies a failed jobs/request; network errors
// and 403 count towards unhealthy_requests_limit.
func (w *worker) requestFailed(err error) string {
	log := w.m.log.With("runner", w.short)
	var se *network.StatusError
	outcome, unhealthy := "error", true
	switch {
	case errors.Is(err, network.ErrForbidden):
		outcome = "forbidden"
		log.Error("job request forbidden: is the runner token valid?", "err", err)
	case errors.Is(err, network.ErrConflict):
		outcome, unhealthy = "conflict", false
		log.Debug("job assignment race lost; asking again", "err", err)
	case errors.Is(err, network.ErrOrphaned):
		outcome = "orphaned"
		log.Error("runner is orphaned (its project is gone)", "err", err)
	case errors.Is(err, network.ErrTooManyRequests):
		outcome, unhealthy = "rate_limited", false
		log.Warn("rate limited by the coordinator", "err", err)
	case errors.As(err, &se):
		unhealthy = false
		log.Warn("job request failed", "err", err)
	default:
		log.Warn("job request failed", "err", err)
	}
	if unhealthy {
		w.mu.Lock()
		w.failures++
		ceiling := w.rc.EffectiveUnhealthyInterval()
		switch {
		case w.unhealthy:
			w.probeDelay = min(2*w.probeDelay, ceiling)
			w.nextProbe = time.Now().Add(w.probeDelay)
		case w.failures >= w.rc.EffectiveUnhealthyRequestsLimit():
			w.unhealthy = true
			w.probeDelay = min(max(w.m.pollInterval(), time.Millisecond), ceiling)
			w.nextProbe = time.Now().Add(w.probeDelay)
			log.Warn("runner is unhealthy; probing the coordinator with backoff", "failures", w.failures, "max_wait", ceiling)
		}
		w.mu.Unlock()
	}
	return outcome
}

// rotateTokens resets w's token at 75 % of its life and writes it back.
func (m *Manager) rotateTokens(ctx context.Context, w *worker) {
	for {
		m.cfgMu.Lock()
		at, ok := w.rc.TokenRotationAt()
		disabled := w.rc.FeatureFlag("FF_DISABLE_AUTOMATIC_TOKEN_ROTATION")
		m.cfgMu.Unlock()
		if !ok {
			return
		}
		if disabled {
			m.log.Warn("automatic token rotation is disabled; the token will expire", "runner", w.short, "rotation_due", at)
			return
		}
		if d := at.Sub(m.opts.Now()); d > 0 && !sleep(ctx, d) {
			return
		}
		if ctx.Err() != nil {
			return
		}
		if err := m.RotateToken(ctx, w.rc); err != nil {
			m.log.Error("token rotation failed; retrying in a minute", "runner", w.short, "err", err)
			if !sleep(ctx, time.Minute) {
				return
			}
		}
	}
}

// RotateToken resets the token of rc now and writes it back to the config
// file (when the manager has one).
func (m *Manager) RotateToken(ctx context.Context, rc *config.Runner) error {
	m.cfgMu.Lock()
	creds := network.RunnerCredentials{URL: rc.URL, Token: rc.Token}
	m.cfgMu.Unlock()
	resp, err := m.client.ResetToken(ctx, creds)
	if err != nil {
		return err
	}
	expires, err := ParseExpiry(resp.TokenExpiresAt)
	if err != nil {
		return err
	}
	m.cfgMu.Lock()
	defer m.cfgMu.Unlock()
	rc.Token = resp.Token
	rc.TokenObtainedAt = m.opts.Now().UTC().Truncate(time.Second)
	rc.TokenExpiresAt = expires
	m.log.Info("runner token rotated", "runner", token.Short(creds.Token), "expires_at", expires)
	if m.opts.ConfigPath != "" {
		if err := config.Save(m.opts.ConfigPath, m.cfg); err != nil {
			return fmt.Errorf("writing the rotated token back: %w", err)
		}
	}
	return nil
}

// ParseExpiry reads token_expires_at (RFC 3339 or null; null and the zero
// time mean never).
func ParseExpiry(s *string) (time.Time, error) {
	if s == nil || *s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, *s)
	if err != nil {
		return time.Time{}, fmt.Errorf("token_expires_at %q: %w", *s, err)
	}
	if t.Year() <= 1 {
		return time.Time{}, nil
	}
	return t.UTC(), nil
}
