// Package coordinator assembles Berth's coordinator from its parts and
// runs one replica of it: GitLab's Runner API v4 (the real gitlab-runner
// and Berth's runner both use it), the REST API, git hosting, the job
// queue with long polling, the pipeline engine, and the leader's
// housekeeping. Each part is a package of its own; they meet at the store
// and the queue:
//
//	           HTTP: runnerhttp   resthttp   githost   pages   /-/metrics
//	                      │          │          │        │
//	   pipelines (engine) ┼──────────┤          │ push   │
//	           │          │          │ ◄────────┘ hook   │
//	           ▼          ▼          ▼                   │
//	    dispatch (queue, hand-outs, transitions) ◄── reaper (leader)
//	           │          runners (tokens, managers, offers)
//	           ▼          joblog (traces)
//	store (SQLite | PostgreSQL) · queue · artifacts (dir | S3) · cluster
//
// A Server is one replica: its event loop applies the other replicas'
// changes to its copies (replica.go), and when it leads the cluster it
// runs the reaper. Wire facts follow GitLab (reference:
// gitlab-protocol.md §1–§4). Where GitLab's behaviour is a known bug, the
// contract is kept and the behaviour fixed; docs/coordinator.md lists the
// decisions.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/idtoken"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/reaper"
	"github.com/berthci/berth/coordinator/resthttp"
	"github.com/berthci/berth/coordinator/runnerhttp"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/coordinator/tracing"
	"github.com/berthci/berth/coordinator/webui"
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
	// tracer traces pipelines to OTLP endpoints (nil: none).
	tracer  *tracing.Tracer
	runners *runners.Registry
	// dispatch is the job lifecycle: queue, hand-outs, transitions.
	dispatch *dispatch.Dispatcher

	// runnerAPI and restAPI are the HTTP faces (coordinator/runnerhttp,
	// coordinator/resthttp).
	runnerAPI *runnerhttp.API
	restAPI   *resthttp.API
	// reaper is the leader's housekeeping (coordinator/reaper).
	reaper *reaper.Reaper

	// git hosts the projects' repositories (coordinator/githost).
	git *githost.Host
	// pipelines creates pipelines and moves them on
	// (coordinator/pipelines).
	pipelines *pipelines.Engine
	// pages publishes and serves Pages sites (coordinator/pages).
	pages *pages.Sites
	// idKeys sign jobs' ID tokens (coordinator/idtoken).
	idKeys *idtoken.Keys
	// logs keeps the jobs' logs (coordinator/joblog).
	logs *joblog.Logs
	// jobTokens mint and verify job tokens (coordinator/jobtoken).
	jobTokens *jobtoken.Keys
	// ui is the web dashboard (coordinator/webui).
	ui *webui.UI

	stop       chan struct{}
	done       chan struct{}
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
	// SecretsKey is the key that seals secrets at rest (the store's
	// variables, see sealed.Wrap); failed jobs' VM snapshots are
	// encrypted with a key derived from it (coordinator/snapshots). nil:
	// snapshot uploads are refused.
	SecretsKey *sealed.Key
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
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
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
	s.git = githost.New(githost.Options{Dir: repoDir, Store: s.store, Logger: s.log,
		AdminTokenSetting: httpapi.AdminTokenSetting, JobProject: s.jobProject, Pushed: s.pushed, ExternalURL: s.cfg.ExternalURL})
	s.runners = runners.New(runners.Options{Store: s.store, Queue: s.queue, Cluster: s.cluster, Clock: s.clock,
		TokenExpiresIn: s.cfg.RunnerTokenExpiresIn, Cell: s.cfg.CellID})
	s.metrics = newMetrics(opts.Registerer, opts.Gatherer)
	var snaps *snapshots.Vault // nil: no key to encrypt them with
	if opts.SecretsKey != nil {
		snaps = snapshots.NewVault(opts.SecretsKey, s.artifacts)
	} else {
		s.log.Info("failed jobs' VM snapshots are refused: no secrets key to encrypt them with")
	}
	s.logs = joblog.New(joblog.Options{Store: s.store, Artifacts: s.artifacts, Logger: s.log,
		ArchiveAfter: s.cfg.TraceArchiveAfter, Registerer: s.metrics.registerer})
	s.pages = pages.New(pages.Options{Store: s.store, Artifacts: s.artifacts, Dir: pagesDir, BaseURL: s.baseURL(),
		Clock: s.clock, Logger: s.log})
	s.jobTokens = jobtoken.New(jobtoken.Options{Store: s.store, Clock: s.clock, Issuer: s.baseURL(), Cell: s.cfg.CellID})
	s.dispatch = dispatch.New(dispatch.Options{Store: s.store, Queue: s.queue, Runners: s.runners, Cluster: s.cluster,
		Clock: s.clock, Logger: s.log, Registerer: s.metrics.registerer, DefaultJobTimeout: s.cfg.DefaultJobTimeout,
		JobTokens: s.jobTokens,
		Timeouts: dispatch.Timeouts{Ack: s.cfg.AckTimeout, Pending: s.cfg.PendingTimeout, Stuck: s.cfg.StuckTimeout,
			Canceling: s.cfg.CancelingTimeout, Grace: s.cfg.TimeoutGrace},
		JobChanged: s.jobChanged})
	var err error
	if s.tracer, err = tracing.New(s.cfg.ExternalURL, s.cfg.OTELEndpoints, s.store, s.log); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	s.pipelines, err = pipelines.New(pipelines.Config{ExternalURL: s.cfg.ExternalURL, GitDepth: s.cfg.GitDepth,
		DefaultJobTimeout: s.cfg.DefaultJobTimeout, MaxPipelineHierarchySize: s.cfg.MaxPipelineHierarchySize,
		Includes: s.cfg.Includes}, pipelines.Options{Store: s.store, Artifacts: s.artifacts, Git: s.git,
		Dispatch: s.dispatch, Logs: s.logs, Pages: s.pages, Cluster: s.cluster, Clock: s.clock, Logger: s.log, Tracer: s.tracer})
	if err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	s.runnerAPI = runnerhttp.New(runnerhttp.Config{ExternalURL: s.cfg.ExternalURL, LongPollTimeout: s.cfg.LongPollTimeout,
		TraceUpdateInterval: s.cfg.TraceUpdateInterval, FinalTraceWait: s.cfg.FinalTraceWait,
		MaxArtifactSize: s.cfg.MaxArtifactSize, MaxSnapshotSize: s.cfg.MaxSnapshotSize, MaxSnapshotAge: s.cfg.MaxSnapshotAge, MaxTraceSize: s.cfg.MaxTraceSize,
		RegistrationDisabled: s.cfg.RegistrationDisabled, Replicated: !s.single},
		runnerhttp.Options{Store: s.store, Artifacts: s.artifacts, Dispatch: s.dispatch, Runners: s.runners,
			Pipelines: s.pipelines, Pages: s.pages, Logs: s.logs, Git: s.git, IDKeys: s.idKeys, Snapshots: snaps,
			Clock: s.clock, Logger: s.log, Registerer: s.metrics.registerer, Tracer: s.tracer})
	s.restAPI = resthttp.New(resthttp.Options{Store: s.store, Artifacts: s.artifacts, Dispatch: s.dispatch, Runners: s.runners,
		Pipelines: s.pipelines, Pages: s.pages, Logs: s.logs, Snapshots: snaps, Clock: s.clock, Logger: s.log,
		ExternalURL: s.cfg.ExternalURL})
	s.reaper = reaper.New(reaper.Options{Store: s.store, Artifacts: s.artifacts, Dispatch: s.dispatch,
		Pipelines: s.pipelines, Pages: s.pages, Logs: s.logs, Clock: s.clock, Logger: s.log, Interval: s.cfg.ReapInterval})
	s.ui, err = webui.New(s.cfg.UI, webui.Options{Store: s.store, Pipelines: s.pipelines, Dispatch: s.dispatch, Logs: s.logs,
		Artifacts: s.artifacts, Clock: s.clock, Logger: s.log.With("component", "webui"), ExternalURL: s.cfg.ExternalURL,
		AdminTokenSetting: httpapi.AdminTokenSetting})
	if err != nil {
		return nil, fmt.Errorf("web UI: %w", err)
	}
	return s, nil
}

// Start rebuilds the queue from the store (pending jobs, jobs in flight per
// manager; projects' isolation minimums and runner managers' last offers),
// starts the pipeline engine, the cluster's event loop and its leadership
// (the reaper), and replays pushes a crash interrupted. Call it once
// before serving.
func (s *Server) Start(ctx context.Context) error {
	if err := s.dispatch.Load(ctx); err != nil {
		return err
	}
	if err := s.openJobTokens(ctx); err != nil {
		return err
	}
	var err error
	// Before the engine sees them: a pipeline a crash left without jobs
	// is failed with the reason, not processed as an empty one. (With
	// other replicas, one of them may be creating a pipeline's jobs right
	// now: the leader does this for pipelines old enough.)
	interrupted := map[int64]bool{}
	if s.single {
		if interrupted, err = s.pipelines.FailInterrupted(ctx, time.Time{}); err != nil {
			return err
		}
	}
	if err := s.pipelines.Start(ctx); err != nil {
		return err
	}
	go s.leaderLoop()
	go s.eventLoop()
	s.ui.Start()
	if err := s.pipelines.ReplayPushes(ctx, interrupted); err != nil {
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
	// Push streams end first: their unanswered jobs go back to the queue
	// while it still takes them.
	s.runnerAPI.Close()
	s.queue.Close()
	s.ui.Close() // its event streams end
	close(s.stop)
	<-s.done
	<-s.eventsDone
	s.pipelines.Close()
	s.pages.Close()
	// Finished pipelines' spans still in memory go out, briefly.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.tracer.Close(ctx); err != nil {
		s.log.Warn("closing the tracer", "err", err)
	}
}

// openJobTokens reads the job token keys, creating the first one on a
// fresh store. Replicas starting together take the cluster's engine lock
// for it, so that they agree on that first key.
func (s *Server) openJobTokens(ctx context.Context) error {
	unlock, err := s.cluster.EngineLock(ctx)
	if err != nil {
		return fmt.Errorf("job token keys: %w", err)
	}
	defer unlock()
	if _, err := jobtoken.Open(ctx, jobtoken.Options{Store: s.store, Clock: s.clock}); err != nil {
		return fmt.Errorf("job token keys: %w", err)
	}
	return nil
}

// jobProject authenticates a job token for git hosting: a token that may
// fetch repositories, of a job handed out and not finished.
func (s *Server) jobProject(ctx context.Context, tok string) (int64, bool, error) {
	_, c, err := s.dispatch.Authenticate(ctx, tok)
	switch {
	case errors.Is(err, dispatch.ErrBadToken), errors.Is(err, dispatch.ErrJobNotRunning):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return c.ProjectID, c.Allows(jobtoken.ScopeRepositoryRead), nil
}

// pushed is git hosting's push hook: a pushed ref gets its pipeline.
func (s *Server) pushed(ctx context.Context, p *store.Project, repo *gitrepo.Repo, u githost.RefUpdate) error {
	return s.pipelines.PushPipeline(ctx, p, repo, u)
}

// baseURL is the external URL without a trailing slash.
func (s *Server) baseURL() string { return strings.TrimSuffix(s.cfg.ExternalURL, "/") }

// Dispatch is the coordinator's job lifecycle (for in-process tools such
// as berth run, which asks why a job waits).
func (s *Server) Dispatch() *dispatch.Dispatcher { return s.dispatch }

// Queue exposes the dispatch queue (for in-process tools such as the
// dispatch benchmark).
func (s *Server) Queue() *queue.Queue { return s.queue }

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.runnerAPI.Register(mux)
	s.restAPI.Register(mux)
	mux.Handle("GET /-/pages/{rest...}", s.pages)
	mux.Handle("GET /-/metrics", s.metrics.handler())
	mux.HandleFunc("GET /-/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("GitLab OK"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(r.URL.Path, ".git/"):
			s.git.ServeHTTP(w, r) // git smart HTTP: /<project path>.git/...
		case strings.HasPrefix(r.URL.Path, "/api/"):
			httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		default:
			s.ui.ServeHTTP(w, r) // the web UI: /, /<project path>/-/…, /-/…
		}
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

// Unwrap lets http.ResponseController reach the writer: the push
// channel's WebSocket upgrade takes the connection, the web UI's event
// streams flush.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

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

// EnsureAdminToken makes tok the admin token if given; otherwise it keeps
// the stored one, or mints and stores a new one, which it returns (the
// only time it is ever shown). It returns "" when an admin token already
// existed and none was given.
func (s *Server) EnsureAdminToken(ctx context.Context, tok string) (string, error) {
	return httpapi.EnsureAdminToken(ctx, s.store, tok, s.cfg.CellID)
}

// Enqueue validates a job spec, stores the job as pending and queues it
// (dispatch.Dispatcher.Enqueue).
func (s *Server) Enqueue(ctx context.Context, spec dispatch.JobSpec) (*store.Job, error) {
	return s.dispatch.Enqueue(ctx, spec)
}

// jobChanged follows a job the dispatcher changed: the engine moves its
// pipeline on, and a finished job's final-update state is dropped.
func (s *Server) jobChanged(j *store.Job) {
	if j.Status.Finished() {
		s.runnerAPI.JobFinished(j.ID)
	}
	s.pipelines.JobChanged(j)
}

// Pipelines is the coordinator's pipeline engine: projects, pipelines and
// their jobs, for in-process callers (berth run, tools, tests).
func (s *Server) Pipelines() *pipelines.Engine { return s.pipelines }

// Logs are the jobs' logs.
func (s *Server) Logs() *joblog.Logs { return s.logs }

// UI is the web dashboard (berth run --ui signs its user in through it).
func (s *Server) UI() *webui.UI { return s.ui }
