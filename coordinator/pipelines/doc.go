// Package pipelines is the coordinator's pipeline engine: projects and
// their repositories' pipelines, from the configuration of a commit (with
// its includes) to the stored jobs, and the engine that moves each
// pipeline on as its jobs change — enqueueing the next jobs through
// coordinator/dispatch, retries, manual and delayed jobs, resource groups,
// trigger jobs and their downstream pipelines, cross-pipeline needs,
// environments and deployments, releases and Pages.
//
// The engine is one goroutine per replica: every change to a pipeline's
// jobs that is a decision (enqueue, skip, retry, play, cancel of a
// pipeline, resource groups) runs on it, so decisions never race each
// other; the store's conditional writes keep them correct against the
// runner API, which changes job statuses on its own (ack, finish, cancel
// of a running job). Replicas take the cluster's engine lock for each
// step, so pipelines move on as if one engine ran them.
//
//	job acked / finished / canceled, reaper, push, API ──► Mark(pipeline)
//	                                                          │ (coalesced)
//	                                  engine goroutine ◄──────┘
//	                                        │ processPipeline:
//	                                        │   auto-retries → graph.Plan (pure) →
//	                                        │   apply → pipeline status
//	                                        ▼
//	                           watchers of the pipeline are woken
package pipelines

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/githost"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/tracing"
)

// Errors of the pipeline and project operations, mapped to HTTP codes at
// the edge.
var (
	// ErrNotFound: the project, pipeline, job or ref does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed; the message says why.
	ErrInvalid = errors.New("invalid request")
	// ErrExists: the project or variable already exists.
	ErrExists = errors.New("already exists")
	// ErrNotAllowed: the action does not apply to the job or pipeline in
	// its current state (e.g. playing a job that is not manual).
	ErrNotAllowed = errors.New("not allowed")
	// ErrGitDisabled: the coordinator has no repository directory.
	ErrGitDisabled = githost.ErrDisabled
)

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

// Config is what the engine needs of the coordinator's configuration.
type Config struct {
	// ExternalURL is how runners and jobs reach the coordinator.
	ExternalURL string
	// GitDepth is git_info.depth of pipeline jobs; -1 means a full clone.
	GitDepth int
	// DefaultJobTimeout applies to jobs without one, in seconds.
	DefaultJobTimeout int
	// MaxPipelineHierarchySize bounds a tree of pipelines linked by
	// trigger jobs.
	MaxPipelineHierarchySize int
	// Includes configures how includes outside the commit are resolved.
	Includes IncludeConfig
}

// Options are the engine's collaborators.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	Git       *githost.Host
	Dispatch  *dispatch.Dispatcher
	Logs      *joblog.Logs
	Pages     *pages.Sites
	Cluster   cluster.Cluster
	Clock     Clock
	Logger    *slog.Logger // nil: discard
	// Tracer exports the trace of each pipeline that finishes (nil:
	// none).
	Tracer *tracing.Tracer
}

// Engine creates pipelines and moves them on. Build it with New, Start it
// once, and Close it when done.
//
//	New ──► Start ──► (Mark, CreatePipeline, PlayJob, …) ──► Close
type Engine struct {
	cfg       Config
	store     store.Store
	artifacts artifacts.Storage
	git       *githost.Host
	dispatch  *dispatch.Dispatcher
	logs      *joblog.Logs
	pages     *pages.Sites
	cluster   cluster.Cluster
	clock     Clock
	log       *slog.Logger
	tracer    *tracing.Tracer
	// remote fetches and caches include:remote files (includes.go).
	remote *remoteFetcher

	engine engine
	// bg counts the bridges being prepared off the engine, which Close
	// waits for.
	bg         sync.WaitGroup
	stop       chan struct{}
	engineDone chan struct{}
	closeOnce  sync.Once
	started    atomic.Bool
}

// New builds an engine; cfg.Includes is checked here.
func New(cfg Config, opts Options) (*Engine, error) {
	remote, err := newRemoteFetcher(cfg.Includes, opts.Clock)
	if err != nil {
		return nil, err
	}
	s := &Engine{cfg: cfg, store: opts.Store, artifacts: opts.Artifacts, git: opts.Git, dispatch: opts.Dispatch,
		logs: opts.Logs, pages: opts.Pages, cluster: opts.Cluster, clock: opts.Clock, log: opts.Logger, remote: remote, tracer: opts.Tracer,
		stop: make(chan struct{}), engineDone: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cluster == nil {
		s.cluster = cluster.Local{}
	}
	s.engine.init()
	return s, nil
}

// Start marks every unfinished pipeline for processing and starts the
// engine goroutine.
func (s *Engine) Start(ctx context.Context) error {
	if err := s.Resume(ctx); err != nil {
		return err
	}
	s.started.Store(true)
	go s.engineLoop()
	return nil
}

// Close stops the engine and waits for the bridges being prepared. Safe
// to call more than once, and without Start.
func (s *Engine) Close() {
	s.closeOnce.Do(func() { close(s.stop) })
	if s.started.Load() {
		<-s.engineDone
	}
	s.bg.Wait()
}

func (s *Engine) baseURL() string { return strings.TrimSuffix(s.cfg.ExternalURL, "/") }

// Mark asks the engine to process a pipeline (0: none). Cheap and
// non-blocking: the runner API's hot path calls it.
func (s *Engine) Mark(pipelineID int64) { s.engine.mark(pipelineID) }

// WakeWatchers wakes this replica's watchers of a pipeline another
// replica changed.
func (s *Engine) WakeWatchers(pipelineID int64) { s.engine.notify(pipelineID) }
