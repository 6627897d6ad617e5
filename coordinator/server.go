// Package coordinator is Berth's coordinator: GitLab's Runner API v4 (the
// real gitlab-runner and Berth's runner both use it), the job queue with
// long polling, runner and job tokens, traces and artifacts, and the
// server-side job lifecycle (timeouts, stuck jobs, cancel).
//
// Wire facts follow GitLab (reference: gitlab-protocol.md §1–§4). Where
// GitLab's behaviour is a known bug, the contract is kept and the behaviour
// fixed; docs/coordinator.md lists the decisions.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/idtoken"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Server is the coordinator. Create it with New, call Start, serve
// Handler, and Close it when done.
//
//	New ──► Start ──► (serving Handler) ──► Close
type Server struct {
	cfg       Config
	store     store.Store
	artifacts artifacts.Storage
	queue     *queue.Queue
	log       *slog.Logger
	metrics   *metrics
	clock     Clock

	cluster cluster.Cluster
	single  bool // the cluster is Local: this process has the store to itself
	runners *runners.Registry
	// dispatch is the job lifecycle: queue, hand-outs, transitions.
	dispatch *dispatch.Dispatcher

	mu sync.Mutex
	// finalWait: first final update of a job answered 202 (trace not yet
	// complete), for the FinalTraceWait bound.
	finalWait map[int64]time.Time
	// traceReset: jobs told 412 whose next PATCH from offset 0 resets the
	// trace, with the number of resets asked.
	traceReset map[int64]int

	// git hosts the projects' repositories (coordinator/githost).
	git *githost.Host
	// engine moves pipelines on (engine.go).
	engine engine
	// pages publishes and serves Pages sites (coordinator/pages).
	pages *pages.Sites
	// bg counts the bridges being prepared, which Close waits for.
	bg sync.WaitGroup
	// remote fetches and caches include:remote files (includes.go).
	remote *remoteFetcher
	// idKeys sign jobs' ID tokens (idtokens.go).
	idKeys *idtoken.Keys
	// logs keeps the jobs' logs (coordinator/joblog).
	logs *joblog.Logs

	stop       chan struct{}
	done       chan struct{}
	engineDone chan struct{}
	eventsDone chan struct{}
}

// Options are the collaborators of a Server.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	Logger    *slog.Logger // nil: discard
	Clock     Clock        // nil: real time
	// Registerer receives the coordinator's metrics and Gatherer serves
	// them on /-/metrics (nil: a private registry).
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// IDTokenKeys sign the jobs' OIDC ID tokens (nil: a key held in
	// memory, so tokens stop verifying when the process ends).
	IDTokenKeys *idtoken.Keys
	// Cluster connects the coordinator to the other replicas sharing its
	// store (nil: it has the store to itself, cluster.Local).
	Cluster cluster.Cluster
}

// New builds a coordinator. It does not start background work.
func New(cfg Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	if opts.Store == nil || opts.Artifacts == nil {
		return nil, errors.New("coordinator: store and artifact storage are required")
	}
	s := &Server{
		cfg:        cfg.withDefaults(),
		store:      opts.Store,
		artifacts:  opts.Artifacts,
		queue:      queue.New(),
		log:        opts.Logger,
		clock:      opts.Clock,
		finalWait:  map[int64]time.Time{},
		traceReset: map[int64]int{},
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		engineDone: make(chan struct{}),
		eventsDone: make(chan struct{}),
		cluster:    opts.Cluster,
	}
	if s.cluster == nil {
		s.cluster = cluster.Local{}
	}
	_, s.single = s.cluster.(cluster.Local)
	repoDir := s.cfg.RepoDir // "": no git hosting
	if d, ok := opts.Artifacts.(interface{ Root() string }); ok && repoDir == "" && !s.cfg.NoGitHosting {
		repoDir = filepath.Join(filepath.Dir(d.Root()), "repos")
	}
	if s.cfg.NoGitHosting {
		repoDir = ""
	}
	if repoDir != "" {
		// git http-backend runs as a child: it needs a path that means
		// the same wherever it runs.
		abs, err := filepath.Abs(repoDir)
		if err != nil {
			return nil, fmt.Errorf("repository directory %q: %w", repoDir, err)
		}
		repoDir = abs
	}
	pagesDir := s.cfg.PagesDir
	if d, ok := opts.Artifacts.(interface{ Root() string }); ok && pagesDir == "" {
		pagesDir = filepath.Join(filepath.Dir(d.Root()), "pages")
	}
	s.engine.init()
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.idKeys = opts.IDTokenKeys
	if s.idKeys == nil {
		s.idKeys = idtoken.NewEphemeral()
		s.log.Info("ID tokens are signed with a key held in memory only")
	}
	if s.clock == nil {
		s.clock = realClock{}
	}
	remote, err := newRemoteFetcher(s.cfg.Includes, s.clock)
	if err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	s.remote = remote
	s.git = githost.New(githost.Options{Dir: repoDir, Store: s.store, Logger: s.log,
		AdminTokenSetting: httpapi.AdminTokenSetting, TokenActive: dispatch.TokenActive, Pushed: s.pushPipeline})
	s.runners = runners.New(runners.Options{Store: s.store, Queue: s.queue, Cluster: s.cluster, Clock: s.clock,
		TokenExpiresIn: s.cfg.RunnerTokenExpiresIn})
	s.metrics = newMetrics(opts.Registerer, opts.Gatherer)
	s.logs = joblog.New(joblog.Options{Store: s.store, Artifacts: s.artifacts, Logger: s.log,
		ArchiveAfter: s.cfg.TraceArchiveAfter, Registerer: s.metrics.registerer})
	s.pages = pages.New(pages.Options{Store: s.store, Artifacts: s.artifacts, Dir: pagesDir, BaseURL: s.baseURL(),
		Clock: s.clock, Logger: s.log})
	s.dispatch = dispatch.New(dispatch.Options{Store: s.store, Queue: s.queue, Runners: s.runners, Cluster: s.cluster,
		Clock: s.clock, Logger: s.log, Registerer: s.metrics.registerer, DefaultJobTimeout: s.cfg.DefaultJobTimeout,
		Timeouts: dispatch.Timeouts{Ack: s.cfg.AckTimeout, Pending: s.cfg.PendingTimeout, Stuck: s.cfg.StuckTimeout,
			Canceling: s.cfg.CancelingTimeout, Grace: s.cfg.TimeoutGrace},
		JobChanged: s.jobChanged})
	return s, nil
}

// Start rebuilds the queue from the store (pending jobs, jobs in flight per
// manager; projects' isolation minimums and runner managers' last offers)
// and starts the reaper. Call it once before serving.
func (s *Server) Start(ctx context.Context) error {
	if err := s.dispatch.Load(ctx); err != nil {
		return err
	}
	var err error
	// Before the engine sees them: a pipeline a crash left without jobs
	// is failed with the reason, not processed as an empty one. (With
	// other replicas, one of them may be creating a pipeline's jobs right
	// now: the leader does this for pipelines old enough.)
	interrupted := map[int64]bool{}
	if s.single {
		if interrupted, err = s.failInterruptedPipelines(ctx, time.Time{}); err != nil {
			return err
		}
	}
	if err := s.resumePipelines(ctx); err != nil {
		return err
	}
	go s.leaderLoop()
	go s.engineLoop()
	go s.eventLoop()
	if err := s.replayPushes(ctx, interrupted); err != nil {
		s.Close()
		return err
	}
	return nil
}

// Close releases held long polls (they answer 204) and stops background
// work. It does not close the store.
func (s *Server) Close() {
	select {
	case <-s.stop:
		return
	default:
	}
	s.queue.Close()
	close(s.stop)
	<-s.done
	<-s.engineDone
	<-s.eventsDone
	s.bg.Wait()
	s.pages.Close()
}

// ReadTrace writes a job's log from offset on to w (joblog.Logs.Read).
func (s *Server) ReadTrace(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error) {
	return s.logs.Read(ctx, jobID, offset, w)
}

// Dispatch is the coordinator's job lifecycle (for in-process tools such
// as berth run, which asks why a job waits).
func (s *Server) Dispatch() *dispatch.Dispatcher { return s.dispatch }

// Queue exposes the dispatch queue (for in-process tools such as the
// dispatch benchmark).
func (s *Server) Queue() *queue.Queue { return s.queue }

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// Runner API v4.
	mux.HandleFunc("POST /api/v4/runners", s.handleRegister)
	mux.HandleFunc("DELETE /api/v4/runners", s.handleUnregister)
	mux.HandleFunc("POST /api/v4/runners/verify", s.handleVerify)
	mux.HandleFunc("DELETE /api/v4/runners/managers", s.handleDeleteManager)
	mux.HandleFunc("POST /api/v4/runners/reset_authentication_token", s.handleResetRunnerToken)
	mux.HandleFunc("POST /api/v4/jobs/request", s.handleJobRequest)
	mux.HandleFunc("PUT /api/v4/jobs/{id}", s.handleUpdateJob)
	mux.HandleFunc("PATCH /api/v4/jobs/{id}/trace", s.handleAppendTrace)
	mux.HandleFunc("POST /api/v4/jobs/{id}/artifacts", s.handleUploadArtifact)
	mux.HandleFunc("GET /api/v4/jobs/{id}/artifacts", s.handleDownloadArtifact)
	// Admin API, GitLab-shaped.
	mux.HandleFunc("POST /api/v4/user/runners", s.admin(s.handleCreateRunner))
	mux.HandleFunc("GET /api/v4/runners/all", s.admin(s.handleListRunners))
	mux.HandleFunc("PUT /api/v4/runners/{id}", s.admin(s.handleUpdateRunner))
	mux.HandleFunc("DELETE /api/v4/runners/{id}", s.admin(s.handleDeleteRunner))
	mux.HandleFunc("POST /api/v4/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.InstanceType)))
	mux.HandleFunc("POST /api/v4/groups/{scope}/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.GroupType)))
	mux.HandleFunc("POST /api/v4/projects/{scope}/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.ProjectType)))
	mux.HandleFunc("POST /api/v4/projects/{project}/runners", s.admin(s.handleEnableProjectRunner))
	mux.HandleFunc("DELETE /api/v4/projects/{project}/runners/{runner}", s.admin(s.handleDisableProjectRunner))
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs/{id}", s.admin(s.handleGetJob))
	mux.HandleFunc("POST /api/v4/projects/{project}/jobs/{id}/cancel", s.admin(s.handleCancelJob))
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs/{id}/trace", s.admin(s.handleGetTrace))
	// Berth-only API.
	mux.HandleFunc("POST /api/v4/berth/jobs", s.admin(s.handleEnqueue))
	mux.HandleFunc("GET /api/v4/berth/queue", s.handleQueueStats)
	mux.Handle("GET /-/metrics", s.metrics.handler())
	// OIDC discovery for the jobs' ID tokens, unauthenticated as GitLab's.
	mux.HandleFunc("GET /.well-known/openid-configuration", s.handleOpenIDConfiguration)
	mux.HandleFunc("GET /oauth/discovery/keys", s.handleJWKS)
	mux.HandleFunc("GET /-/jwks", s.handleJWKS)
	mux.HandleFunc("GET /-/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("GitLab OK"))
	})
	s.pipelineRoutes(mux)
	s.deployRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, ".git/") {
			s.git.ServeHTTP(w, r) // git smart HTTP: /<project path>.git/...
			return
		}
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
	})
	return s.logRequests(mux)
}

// statusRecorder captures the status code for the access log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// logRequests logs every request at debug level: method, path (never the
// query, which may carry a job token), status and duration.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p))
				httpapi.WriteError(rec, http.StatusInternalServerError, "500 Internal Server Error")
			}
			s.metrics.request(r.Pattern, rec.status)
			s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rec.status,
				"duration", time.Since(start), "request_id", r.Header.Get(runnerapi.HeaderRequestID))
		}()
		next.ServeHTTP(rec, r)
	})
}
