// Package resthttp serves the coordinator's REST API over HTTP: GitLab's
// project, pipeline, job, variable, runner administration, release,
// environment, deployment and Pages endpoints (admin token), and Berth's
// own (id-only lookups, enqueueing a job spec, the queue's backlog,
// failed jobs' VM snapshots). Its wire types are coordinator/restapi; it
// acts through the coordinator's parts (pipelines, dispatch, runners,
// joblog, snapshots) and maps their errors to GitLab's status codes and
// bodies here, at the edge.
package resthttp

import (
	"github.com/berthci/berth/coordinator/artifacts"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pages"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Options are the API's collaborators.
type Options struct {
	Store store.Store
	// Artifacts holds the artifacts' bytes (test reports are read from
	// it).
	Artifacts artifacts.Storage
	Dispatch  *dispatch.Dispatcher
	Runners   *runners.Registry
	Pipelines *pipelines.Engine
	Pages     *pages.Sites
	Logs      *joblog.Logs
	// Snapshots holds failed jobs' VM snapshots (nil: the coordinator
	// has no key for them, and none are stored).
	Snapshots *snapshots.Vault
	Clock     Clock
	Logger    *slog.Logger // nil: discard
	// ExternalURL is how clients reach the coordinator (web URLs in
	// bodies).
	ExternalURL string
}

// API is the REST API. Register its routes on a mux.
type API struct {
	store     store.Store
	artifacts artifacts.Storage
	dispatch  *dispatch.Dispatcher
	runners   *runners.Registry
	pipelines *pipelines.Engine
	pages     *pages.Sites
	logs      *joblog.Logs
	snapshots *snapshots.Vault
	clock     Clock
	log       *slog.Logger
	baseURL   string
}

// New returns the REST API over opts.
func New(opts Options) *API {
	a := &API{store: opts.Store, artifacts: opts.Artifacts, dispatch: opts.Dispatch, runners: opts.Runners, pipelines: opts.Pipelines,
		pages: opts.Pages, logs: opts.Logs, snapshots: opts.Snapshots, clock: opts.Clock, log: opts.Logger,
		baseURL: strings.TrimSuffix(opts.ExternalURL, "/")}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	return a
}

// Register adds the API's routes to mux.
func (s *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v4/user/runners", s.admin(s.handleCreateRunner))
	mux.HandleFunc("GET /api/v4/runners/all", s.admin(s.handleListRunners))
	mux.HandleFunc("GET /api/v4/runners/{id}", s.admin(s.handleGetRunner))
	mux.HandleFunc("GET /api/v4/runners/{id}/jobs", s.admin(s.handleRunnerJobs))
	mux.HandleFunc("PUT /api/v4/runners/{id}", s.admin(s.handleUpdateRunner))
	mux.HandleFunc("DELETE /api/v4/runners/{id}", s.admin(s.handleDeleteRunner))
	mux.HandleFunc("POST /api/v4/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.InstanceType)))
	mux.HandleFunc("POST /api/v4/groups/{scope}/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.GroupType)))
	mux.HandleFunc("POST /api/v4/projects/{scope}/runners/reset_registration_token", s.admin(s.handleResetRegistrationToken(store.ProjectType)))
	mux.HandleFunc("POST /api/v4/projects/{project}/runners", s.admin(s.handleEnableProjectRunner))
	mux.HandleFunc("DELETE /api/v4/projects/{project}/runners/{runner}", s.admin(s.handleDisableProjectRunner))
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs/{id}", s.projectMember(store.AccessReporter, s.handleGetJob))
	mux.HandleFunc("GET /api/v4/job", s.handleCurrentJob)
	mux.HandleFunc("POST /api/v4/projects/{project}/jobs/{id}/cancel", s.projectMember(store.AccessDeveloper, s.handleCancelJob))
	mux.HandleFunc("GET /api/v4/projects/{project}/jobs/{id}/trace", s.projectMember(store.AccessReporter, s.handleGetTrace))
	mux.HandleFunc("POST /api/v4/projects/{project}/jobs/{id}/erase", s.projectAdmin(s.handleEraseJob))
	mux.HandleFunc("DELETE /api/v4/projects/{project}/jobs/{id}/artifacts", s.projectAdmin(s.handleDeleteJobArtifacts))
	// Berth-only API.
	mux.HandleFunc("POST /api/v4/berth/jobs", s.admin(s.handleEnqueue))
	mux.HandleFunc("GET /api/v4/berth/queue", s.handleQueueStats)
	s.pipelineRoutes(mux)
	s.deployRoutes(mux)
	s.userRoutes(mux)
	s.snapshotRoutes(mux)
	s.memberRoutes(mux)
	s.scheduleRoutes(mux)
	s.triggerRoutes(mux)
}

// admin wraps a handler that needs the admin token.
func (s *API) admin(h http.HandlerFunc) http.HandlerFunc { return httpapi.RequireAdmin(s.store, h) }

// runnerOrFail authenticates the RUNNER-TOKEN header, answering 403 (or
// 500) itself on failure.
func (s *API) runnerOrFail(w http.ResponseWriter, r *http.Request) (*store.Runner, bool) {
	return httpapi.AuthRunner(w, r, s.runners, s.log, "")
}

// insightIsolation is the strongest level a runner's queue insight counts
// jobs at: the isolation_levels query parameter (comma-separated, may be
// repeated), else what the runner's managers offered within
// runners.OnlineWindow, else none.
func (s *API) insightIsolation(r *http.Request, rn *store.Runner) executor.Isolation {
	if qs, ok := r.URL.Query()["isolation_levels"]; ok {
		var names []string
		for _, q := range qs {
			names = append(names, strings.Split(q, ",")...)
		}
		levels := runners.OfferedLevels(&runnerapi.Info{IsolationLevels: names})
		return levels[len(levels)-1]
	}
	if l, ok := s.runners.StrongestOffer(rn.ID, s.clock.Now().Add(-runners.OnlineWindow)); ok {
		return l
	}
	return executor.IsolationNone
}
