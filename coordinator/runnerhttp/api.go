// Package runnerhttp serves GitLab's Runner API v4 over HTTP: runner
// registration and verification, the jobs/request long poll and the job
// push channel beside it (push.go, docs/push.md), job updates
// (two-phase ack, keep-alives, final state), traces, artifacts, and the
// OIDC discovery of the jobs' ID tokens. Both the real gitlab-runner and
// Berth's runner speak it (reference: gitlab-protocol.md §1–§4). It acts
// through the coordinator's parts — dispatch for every job transition,
// runners for tokens and managers, joblog for traces — and maps their
// outcomes to GitLab's status codes and headers here, at the edge.
package runnerhttp

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/idtoken"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/tracing"
	"github.com/berthci/berth/jobpush"
)

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Config is what the Runner API needs of the coordinator's
// configuration (coordinator.Config documents each field).
type Config struct {
	ExternalURL         string
	LongPollTimeout     time.Duration
	TraceUpdateInterval time.Duration
	FinalTraceWait      time.Duration
	MaxArtifactSize     int64
	MaxSnapshotSize     int64
	// MaxSnapshotAge bounds a VM snapshot's expiry (0: as its expire_in says).
	MaxSnapshotAge       time.Duration
	MaxTraceSize         int64
	RegistrationDisabled bool
	// Replicated: other replicas share the store, so a runner's
	// last_update may come from another replica's queue.
	Replicated bool
}

// Options are the API's collaborators.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	Dispatch  *dispatch.Dispatcher
	Runners   *runners.Registry
	Pipelines *pipelines.Engine
	Pages     *pages.Sites
	Logs      *joblog.Logs
	Git       *githost.Host
	IDKeys    *idtoken.Keys
	// Snapshots stores VM snapshots (failed jobs', snapshot points)
	// encrypted (nil: they are refused).
	Snapshots *snapshots.Vault
	Clock     Clock
	Logger    *slog.Logger // nil: discard
	// Registerer receives the trace metrics (nil: none).
	Registerer prometheus.Registerer
	// Tracer gives each job handed out its features.tracing (nil: none).
	Tracer *tracing.Tracer
}

// API is the Runner API. Register its routes on a mux.
type API struct {
	cfg       Config
	baseURL   string
	store     store.Store
	artifacts artifacts.Storage
	dispatch  *dispatch.Dispatcher
	queue     *queue.Queue
	runners   *runners.Registry
	pipelines *pipelines.Engine
	pages     *pages.Sites
	logs      *joblog.Logs
	git       *githost.Host
	idKeys    *idtoken.Keys
	snapshots *snapshots.Vault
	clock     Clock
	log       *slog.Logger
	metrics   metrics
	tracer    *tracing.Tracer
	// push serves the job push channel (push.go).
	push *jobpush.Server

	mu sync.Mutex
	// finalWait: first final update of a job answered 202 (trace not yet
	// complete), for the FinalTraceWait bound.
	finalWait map[int64]time.Time
	// traceReset: jobs told 412 whose next PATCH from offset 0 resets the
	// trace, with the number of resets asked.
	traceReset map[int64]int
}

type metrics struct {
	trace prometheus.Counter
	// traceRejected counts trace PATCHes refused past MaxTraceSize.
	traceRejected prometheus.Counter
}

// New returns the Runner API over opts.
func New(cfg Config, opts Options) *API {
	s := &API{cfg: cfg, baseURL: strings.TrimSuffix(cfg.ExternalURL, "/"), store: opts.Store, artifacts: opts.Artifacts,
		dispatch: opts.Dispatch, queue: opts.Dispatch.Queue(), runners: opts.Runners, pipelines: opts.Pipelines,
		pages: opts.Pages, logs: opts.Logs, git: opts.Git, idKeys: opts.IDKeys, snapshots: opts.Snapshots,
		clock: opts.Clock, log: opts.Logger, tracer: opts.Tracer, finalWait: map[int64]time.Time{}, traceReset: map[int64]int{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.metrics = metrics{
		trace: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_trace_bytes_total",
			Help: "Job log bytes appended."}),
		traceRejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_trace_patches_rejected_total",
			Help: "Job log appends refused because the log would exceed the size limit (the job fails with trace_size_exceeded)."}),
	}
	if reg := opts.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{s.metrics.trace, s.metrics.traceRejected} {
			_ = reg.Register(c) // a second coordinator on one registry keeps the first's
		}
	}
	s.push = jobpush.NewServer(pushSource{s}, jobpush.ServerOptions{Logger: s.log, Registerer: opts.Registerer})
	return s
}

// Close ends the push channel's streams (the jobs pushed and not answered
// go back to the queue). Call it before the queue closes.
func (s *API) Close() { s.push.Close() }

// Register adds the API's routes to mux.
func (s *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v4/runners", s.handleRegister)
	mux.HandleFunc("DELETE /api/v4/runners", s.handleUnregister)
	mux.HandleFunc("POST /api/v4/runners/verify", s.handleVerify)
	mux.HandleFunc("DELETE /api/v4/runners/managers", s.handleDeleteManager)
	mux.HandleFunc("POST /api/v4/runners/reset_authentication_token", s.handleResetRunnerToken)
	mux.HandleFunc("POST /api/v4/jobs/request", s.handleJobRequest)
	mux.HandleFunc("GET /api/v4/runners/router/discovery", s.handleRouterDiscovery)
	mux.HandleFunc("GET "+jobpush.Path, s.handleJobRouter)
	mux.HandleFunc("PUT /api/v4/jobs/{id}", s.handleUpdateJob)
	mux.HandleFunc("PATCH /api/v4/jobs/{id}/trace", s.handleAppendTrace)
	mux.HandleFunc("POST /api/v4/jobs/{id}/artifacts", s.handleUploadArtifact)
	mux.HandleFunc("GET /api/v4/jobs/{id}/artifacts", s.handleDownloadArtifact)
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs/artifacts/{ref}/download", s.handleDownloadRefArtifacts)
	// Berth's snapshot points, for a later job of the pipeline to resume.
	mux.HandleFunc("GET /api/v4/jobs/{id}/berth_snapshots/{point}", s.handleGetSnapshotPoint)
	// OIDC discovery for the jobs' ID tokens, unauthenticated as GitLab's.
	mux.HandleFunc("GET /.well-known/openid-configuration", s.handleOpenIDConfiguration)
	mux.HandleFunc("GET /oauth/discovery/keys", s.handleJWKS)
	mux.HandleFunc("GET /-/jwks", s.handleJWKS)
}

// JobFinished drops what the API remembers of a job's final update (the
// dispatcher tells, through the coordinator, when a job finishes however
// it does).
func (s *API) JobFinished(id int64) {
	s.mu.Lock()
	delete(s.finalWait, id)
	delete(s.traceReset, id)
	s.mu.Unlock()
}
