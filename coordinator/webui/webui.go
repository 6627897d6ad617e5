// Package webui is the coordinator's web dashboard: projects, their
// pipelines (filtering, stages, the needs graph), jobs with their logs
// streaming live (ANSI colours, collapsible sections with durations,
// timestamps), retry, cancel and play, artifacts to browse and download,
// runners, and the runner managers' fleets with the queue and small live
// charts. GitLab users find its URLs where GitLab has them:
//
//	/                                   projects
//	/GROUP/NAME/-/pipelines             a project's pipelines (?status=&ref=&sha=&page=)
//	/GROUP/NAME/-/pipelines/ID          a pipeline (?view=stages|needs|jobs)
//	/GROUP/NAME/-/jobs/ID               a job and its log
//	/GROUP/NAME/-/jobs/ID/artifacts/…   browse, download, file
//	/-/runners, /-/fleet                runners; fleets and the queue
//	/-/sign_in, /-/sign_out             sessions
//	/-/assets/…                         embedded CSS and JavaScript
//
// Project paths never hold a "/-/" (a path segment cannot start with
// '-'), so the UI shares the root with git over HTTP (/PATH.git/…), the
// API (/api/v4/…) and Pages (/-/pages/…) without ambiguity.
//
// Pages are rendered on the server (html/template) and read without
// JavaScript; with it, htmx (embedded, assets/) refreshes what changes on
// server-sent events and a small script of our own streams a job's log.
// Nothing but the sign-in page and the assets is served without a
// session (auth.go); every action needs an admin's session and its CSRF
// token. Nothing the UI renders comes from a secret: no tokens, no
// variable values, no job specs.
package webui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Config configures the UI.
type Config struct {
	// Disabled turns the UI off: its paths answer 404.
	Disabled bool
	// SessionTTL is how long a sign-in lasts (default 12 h).
	SessionTTL time.Duration
	// RefreshInterval is how often the runners and fleet pages refresh
	// and the charts take a sample (default 15 s).
	RefreshInterval time.Duration
	// SecureCookies marks the session cookie Secure (set it when the
	// coordinator is reached over https; New does from ExternalURL).
	SecureCookies bool
}

// Defaults are the values zero fields take.
var Defaults = Config{SessionTTL: 12 * time.Hour, RefreshInterval: 15 * time.Second}

// Options are the UI's collaborators.
type Options struct {
	Store     store.Store
	Pipelines *pipelines.Engine
	Dispatch  *dispatch.Dispatcher
	Logs      *joblog.Logs
	Artifacts artifacts.Storage
	Clock     Clock
	Logger    *slog.Logger // nil: discard
	// ExternalURL is how browsers reach the coordinator; an https URL
	// makes the session cookie Secure.
	ExternalURL string
	// AdminTokenSetting names the store setting with the admin token's
	// digest (the admin token signs in as admin).
	AdminTokenSetting string
}

// UI is the web dashboard. Serve it as an http.Handler (for every path
// the coordinator's other handlers leave), Start its sampler and Close it.
//
//	New ──► Start ──► (ServeHTTP) ──► Close
type UI struct {
	cfg     Config
	opts    Options
	st      store.Store
	clock   Clock
	log     *slog.Logger
	tmpl    *template.Template
	assets  fs.FS
	charts  *charts
	stop    chan struct{}
	done    chan struct{}
	started bool
	once    sync.Once
	tickets tickets
	// externalHost is the external URL's host[:port] (actions' Origin).
	externalHost string
}

// New returns the UI. It parses its templates; it starts nothing.
func New(cfg Config, opts Options) (*UI, error) {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = Defaults.SessionTTL
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = Defaults.RefreshInterval
	}
	if strings.HasPrefix(opts.ExternalURL, "https://") {
		cfg.SecureCookies = true
	}
	if opts.Store == nil || opts.Pipelines == nil || opts.Dispatch == nil || opts.Logs == nil || opts.Artifacts == nil {
		return nil, errors.New("webui: store, pipelines, dispatch, logs and artifacts are required")
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	t, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	assets, err := fs.Sub(assetFS, "assets")
	if err != nil {
		return nil, err
	}
	u := &UI{cfg: cfg, opts: opts, st: opts.Store, clock: opts.Clock, log: opts.Logger, tmpl: t, assets: assets,
		charts: newCharts(240), stop: make(chan struct{}), done: make(chan struct{})}
	if eu, err := url.Parse(opts.ExternalURL); err == nil {
		u.externalHost = eu.Host
	}
	return u, nil
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Start runs the sampler of the charts until Close.
func (u *UI) Start() {
	if u.cfg.Disabled {
		return
	}
	u.started = true
	go u.sampleLoop()
}

// Close stops the sampler and ends the event streams.
func (u *UI) Close() {
	u.once.Do(func() {
		close(u.stop)
		if u.started {
			<-u.done
		}
	})
}

// sampleLoop takes a chart sample every RefreshInterval.
func (u *UI) sampleLoop() {
	defer close(u.done)
	t := time.NewTicker(u.cfg.RefreshInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), u.cfg.RefreshInterval)
		u.sample(ctx)
		cancel()
		select {
		case <-u.stop:
			return
		case <-t.C:
		}
	}
}

// ServeHTTP serves the UI's paths; anything else is 404.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if u.cfg.Disabled {
		http.NotFound(w, r)
		return
	}
	securityHeaders(w.Header())
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, "/-/assets/"):
		u.serveAsset(w, r, strings.TrimPrefix(path, "/-/assets/"))
		return
	case path == "/-/sign_in":
		u.handleSignIn(w, r)
		return
	case path == "/favicon.ico":
		http.Redirect(w, r, "/-/assets/favicon.svg", http.StatusMovedPermanently)
		return
	case path == "/-/sign_in/ticket" && isRead(r):
		u.handleTicket(w, r)
		return
	}
	p := u.principal(w, r)
	if p == nil {
		return // answered: redirected to sign in, or 401
	}
	ctx := withPrincipal(r.Context(), p)
	r = r.WithContext(ctx)
	if r.Method == http.MethodPost {
		if !u.checkCSRF(w, r, p) {
			return
		}
	}
	switch {
	case path == "/" && isRead(r):
		u.handleProjects(w, r)
	case path == "/-/sign_out" && r.Method == http.MethodPost:
		u.handleSignOut(w, r)
	case path == "/-/runners" && isRead(r):
		u.handleRunners(w, r)
	case path == "/-/fleet" && isRead(r):
		u.handleFleet(w, r)
	case path == "/-/events" && isRead(r):
		u.handleTicks(w, r)
	case (strings.HasPrefix(path, "/-/pipelines/") || strings.HasPrefix(path, "/-/jobs/")) && isRead(r):
		u.handleByID(w, r)
	case strings.Contains(path, "/-/"):
		i := strings.Index(path, "/-/")
		u.projectRoute(w, r, strings.Trim(path[:i], "/"), path[i+len("/-/"):])
	case isRead(r) && len(path) > 1:
		// /GROUP/NAME: the project's pipelines, as GitLab's project
		// page leads to them.
		project := strings.Trim(path, "/")
		if _, err := u.opts.Pipelines.Project(r.Context(), project); err != nil {
			u.notFound(w, r, "project")
			return
		}
		http.Redirect(w, r, "/"+project+"/-/pipelines", http.StatusSeeOther)
	default:
		u.notFound(w, r, "page")
	}
}

// handleByID leads /-/pipelines/ID and /-/jobs/ID to the page of the
// pipeline or job under its project (links across projects).
func (u *UI) handleByID(w http.ResponseWriter, r *http.Request) {
	kind, idStr, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/-/"), "/")
	id, err := strconv.ParseInt(idStr, 10, 64)
	if err != nil || id <= 0 {
		u.notFound(w, r, "page")
		return
	}
	var projectID int64
	switch kind {
	case "pipelines":
		pl, err := u.st.GetPipeline(r.Context(), id)
		if err != nil {
			u.notFound(w, r, "pipeline")
			return
		}
		projectID = pl.ProjectID
	default:
		j, err := u.st.GetJob(r.Context(), id)
		if err != nil {
			u.notFound(w, r, "job")
			return
		}
		projectID = j.ProjectID
	}
	p, err := u.st.GetProject(r.Context(), projectID)
	if err != nil {
		u.notFound(w, r, "project")
		return
	}
	http.Redirect(w, r, fmt.Sprintf("/%s/-/%s/%d", p.Path, kind, id), http.StatusSeeOther)
}

func isRead(r *http.Request) bool { return r.Method == http.MethodGet || r.Method == http.MethodHead }

// securityHeaders are set on every answer of the UI: no framing, no
// sniffing, scripts and styles from the UI's own assets only, nothing
// cached by shared caches, no referrer to other sites.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// serveAsset serves an embedded asset (public: code and styles, no data).
func (u *UI) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	if !isRead(r) || name == "" || strings.Contains(name, "..") {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(u.assets, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasSuffix(name, ".css"):
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case strings.HasSuffix(name, ".js"):
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(name, ".svg"):
		w.Header().Set("Content-Type", "image/svg+xml")
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	// The assets change only with the binary.
	w.Header().Set("Cache-Control", "public, max-age=3600")
	_, _ = w.Write(b)
}
