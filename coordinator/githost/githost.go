// Package githost is the coordinator's git hosting: each project's bare
// repository in one directory, served over git's smart HTTP at
// EXTERNAL_URL/<project path>.git (fetches through git upload-pack with a
// cached protocol v2 advertisement, pushes through git http-backend), the
// per-project write locks, the push journal that makes a push recoverable
// across a crash, and the refs digest of job payloads.
//
// A Host knows repositories, refs and files; what a push means (creating
// pipelines) and whether a job token is valid belong to the coordinator,
// which hands them in through Options. Projects, settings and jobs are
// read through store.Store.
//
//	New ──► ReplayPushes (once, at start) ──► ServeHTTP, Repo, RepoLock, … (concurrently)
package githost

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// ErrDisabled is returned for a repository when the Host has no
// repository directory.
var ErrDisabled = errors.New("git hosting is not configured (no repository directory)")

// PushFunc is what the coordinator does with one branch or tag a push
// created or moved (New is not ZeroSha): create its pipeline. It returns
// an error only when that work should exist but could not be done (a
// retry may succeed); a commit that calls for nothing is no error.
type PushFunc func(ctx context.Context, p *store.Project, repo *gitrepo.Repo, u RefUpdate) error

// Options are a Host's settings and collaborators.
type Options struct {
	// Dir holds the projects' bare repositories, one ID.git each ("":
	// git hosting is off; git requests then answer 404 and Repo
	// ErrDisabled). It must be absolute: git runs as a child elsewhere.
	Dir    string
	Store  store.Store
	Logger *slog.Logger // nil: discard
	// AdminTokenSetting is the store setting holding the admin token's
	// digest; the admin token may fetch and push every project.
	AdminTokenSetting string
	// JobProject authenticates a job token for git: the project of its
	// job, when the token may fetch repositories now (ok false
	// otherwise). nil: no job token is accepted.
	JobProject func(ctx context.Context, tok string) (projectID int64, ok bool, err error)
	// ExternalURL is the coordinator's URL, which Git LFS's transfer
	// addresses start with (the coordinator always has one).
	ExternalURL string
	// Pushed is called, after git moved the refs and with the
	// repository's lock released, once per ref a push created or moved,
	// in ref order, unless the push asked for ci.skip; the push answers
	// when every call returned. When one fails the push's journal is kept
	// and replayed at the next start (ReplayPushes). nil: pushes do
	// nothing more.
	Pushed PushFunc
}

// Host serves and keeps the projects' repositories. Its methods are safe
// for concurrent use.
type Host struct {
	dir               string
	store             store.Store
	log               *slog.Logger
	adminTokenSetting string
	jobProject        func(ctx context.Context, tok string) (int64, bool, error)
	pushed            PushFunc
	externalURL       string

	// locks serialize writes to one repository (pushes, commits), so
	// comparing refs before and after a push sees only that push.
	locks sync.Map // project id → *sync.Mutex
	// ads caches protocol v2 advertisements (gitupload.go).
	ads uploadPackAds
}

// New returns a Host for opts. It starts nothing and touches no file.
func New(opts Options) *Host {
	h := &Host{
		dir:               opts.Dir,
		store:             opts.Store,
		log:               opts.Logger,
		adminTokenSetting: opts.AdminTokenSetting,
		jobProject:        opts.JobProject,
		pushed:            opts.Pushed,
		externalURL:       opts.ExternalURL,
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.jobProject == nil {
		h.jobProject = func(context.Context, string) (int64, bool, error) { return 0, false, nil }
	}
	return h
}

// Dir is the repository directory ("": git hosting is off).
func (h *Host) Dir() string { return h.dir }

// RepoPath is the directory of a project's bare repository.
func (h *Host) RepoPath(projectID int64) string {
	return filepath.Join(h.dir, strconv.FormatInt(projectID, 10)+".git")
}

// Repo returns a project's repository, creating it if it went missing;
// ErrDisabled without a repository directory.
func (h *Host) Repo(ctx context.Context, p *store.Project) (*gitrepo.Repo, error) {
	if h.dir == "" {
		return nil, ErrDisabled
	}
	dir := h.RepoPath(p.ID)
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err == nil {
		return &gitrepo.Repo{Dir: dir}, nil
	}
	return gitrepo.Init(ctx, dir, p.DefaultBranch)
}

// RepoLock returns the lock serializing writes to a project's
// repository: a push holds it while git receives, and whoever else
// moves refs (a commit, a tag) holds it while doing so.
func (h *Host) RepoLock(projectID int64) *sync.Mutex {
	m, _ := h.locks.LoadOrStore(projectID, &sync.Mutex{})
	return m.(*sync.Mutex)
}

// writeError writes GitLab's error body {"message": ...}, as the rest of
// the coordinator's API does.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(runnerapi.ErrorResponse{Message: msg})
}

func (h *Host) internalError(w http.ResponseWriter, what string, err error) {
	h.log.Error(what, "err", err)
	writeError(w, http.StatusInternalServerError, "500 Internal Server Error")
}
