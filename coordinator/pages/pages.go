// Package pages publishes and serves GitLab Pages: when a Pages job
// succeeds, the coordinator copies the published directory out of the
// job's artifacts archive into its Pages directory and serves it at
// /-/pages/<project path>/[<prefix>/]…
//
//	job success ──► extract publish/ to PAGES/<project>/.tmp-… ──► rename to
//	PAGES/<project>/<dir> ──► PutPagesDeployment (replaces the prefix's
//	previous one in one transaction) ──► remove the previous directory
//
// A reader resolves the deployment through the store, so it sees the old
// site until the new one is complete and recorded, then the new one.
package pages

import (
	"archive/zip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Options are what Sites work with.
type Options struct {
	Store     store.Store
	Artifacts artifacts.Storage
	// Dir holds the published sites ("": Pages are off; Pages jobs run
	// but publish nothing).
	Dir string
	// BaseURL is the coordinator's external URL, without a trailing
	// slash.
	BaseURL string
	Clock   Clock
	Logger  *slog.Logger // nil: discard
}

// Sites are the projects' published Pages sites. Close waits for the
// deployments under way.
type Sites struct {
	store     store.Store
	artifacts artifacts.Storage
	dir       string
	baseURL   string
	clock     Clock
	log       *slog.Logger

	bg   sync.WaitGroup
	stop chan struct{}
	once sync.Once
}

// New returns the sites kept in opts.Dir.
func New(opts Options) *Sites {
	s := &Sites{store: opts.Store, artifacts: opts.Artifacts, dir: opts.Dir, baseURL: opts.BaseURL, clock: opts.Clock,
		log: opts.Logger, stop: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Dir is where the sites are kept ("": Pages are off).
func (s *Sites) Dir() string { return s.dir }

// Close cancels the deployments under way and waits for them.
func (s *Sites) Close() {
	s.once.Do(func() { close(s.stop) })
	s.bg.Wait()
}

// ErrNoArchive: the job has no artifacts archive.
var ErrNoArchive = errors.New("no artifacts archive")

// Limits of one Pages deployment (GitLab's defaults: 200,000 files; the
// size is bounded by the artifact size, a zip bomb by this).
const (
	maxPagesFiles = 200_000
	maxPagesBytes = 1 << 30
)

// pagesCSP sandboxes every Pages response (see servePagesFile).
const pagesCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// URL is the URL of a project's Pages site (CI_PAGES_URL).
func (s *Sites) URL(projectPath, prefix string) string {
	u := s.baseURL + "/-/pages/" + projectPath
	if prefix != "" {
		u += "/" + prefix
	}
	return u
}

// JobPages completes a Pages job at pipeline creation: its path prefix
// expanded (and slugged, as GitLab does), and CI_PAGES_URL with the
// prefix (GitLab 17.9).
func (s *Sites) JobPages(p *store.Project, pg *ci.Pages, vars map[string]string) (*graph.Pages, []runnerapi.Variable) {
	if pg == nil {
		return nil, nil
	}
	g := &graph.Pages{Publish: pg.Publish, ExpireIn: pg.ExpireIn, PathPrefix: ci.Slug(dispatch.ExpandString(pg.PathPrefix, vars), 63)}
	if g.PathPrefix == "" {
		return g, nil
	}
	return g, []runnerapi.Variable{{Key: "CI_PAGES_URL", Value: s.URL(p.Path, g.PathPrefix), Public: true}}
}

// pagesExpiry is when a deployment made at now expires (zero: never):
// expire_in, else never for the main site and 24 hours with a prefix.
func pagesExpiry(g *graph.Pages, now time.Time) (time.Time, error) {
	v := g.ExpireIn
	if v == "" && g.PathPrefix != "" {
		v = "24 hours"
	}
	if v == "" || v == "never" {
		return time.Time{}, nil
	}
	d, err := ci.ParseDuration(v)
	if err != nil {
		return time.Time{}, fmt.Errorf("pages:expire_in %q: %w", v, err)
	}
	return now.Add(d), nil
}

// DeployLater deploys a succeeded Pages job in the background.
func (s *Sites) DeployLater(j *store.Job, g *graph.Pages) {
	if s.dir == "" {
		s.log.Warn("Pages job succeeded but Pages are off (no pages directory)", "job_id", j.ID)
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if d, err := s.Deploy(ctx, j.ID, g); err != nil {
			s.log.Error("Pages deployment failed", "job_id", j.ID, "err", err)
		} else {
			s.log.Info("Pages deployed", "job_id", j.ID, "project_id", d.ProjectID, "path_prefix", d.PathPrefix, "files", d.FileCount)
		}
	}()
}

// Deploy publishes the Pages directory of a succeeded job's
// artifacts archive, replacing the project's deployment of the same path
// prefix. g is the job's Pages keyword (nil: read from the job).
func (s *Sites) Deploy(ctx context.Context, jobID int64, g *graph.Pages) (*store.PagesDeployment, error) {
	if s.dir == "" {
		return nil, errors.New("pages are off: no pages directory")
	}
	j, err := s.store.GetJob(ctx, jobID)
	if err != nil {
		return nil, err
	}
	if g == nil {
		g = graph.Decode(j.Graph).Pages
	}
	if g == nil {
		return nil, fmt.Errorf("job %d is not a Pages job", jobID)
	}
	var spec dispatch.JobSpec
	if err := json.Unmarshal(j.Spec, &spec); err != nil {
		return nil, fmt.Errorf("decoding spec of job %d: %w", j.ID, err)
	}
	vars, err := dispatch.JobVariables(ctx, s.store, s.baseURL, j, &spec)
	if err != nil {
		return nil, err
	}
	publish := path.Clean(strings.TrimPrefix(dispatch.ExpandString(g.Publish, vars), "./"))
	if publish == ".." || strings.HasPrefix(publish, "../") || strings.HasPrefix(publish, "/") {
		return nil, fmt.Errorf("pages:publish %q is outside the project directory", publish)
	}
	zr, closer, err := JobArchive(ctx, s.store, s.artifacts, j.ID)
	if err != nil {
		return nil, err
	}
	defer closer.Close()

	projDir := filepath.Join(s.dir, strconv.FormatInt(j.ProjectID, 10))
	if err := os.MkdirAll(projDir, 0o750); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(projDir, ".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	files, size, err := extractDir(ctx, zr, publish, tmp)
	if err != nil {
		return nil, fmt.Errorf("extracting %s/ of job %d: %w", publish, j.ID, err)
	}
	if files == 0 {
		return nil, fmt.Errorf("the artifacts of job %d have no files in %s/ (the published directory): nothing to deploy", j.ID, publish)
	}
	name := fmt.Sprintf("j%d-%s", j.ID, rand.Text()[:8])
	if err := os.Rename(tmp, filepath.Join(projDir, name)); err != nil {
		return nil, err
	}
	now := s.clock.Now().UTC()
	expire, err := pagesExpiry(g, now)
	if err != nil {
		return nil, err
	}
	d := &store.PagesDeployment{ProjectID: j.ProjectID, JobID: j.ID, PathPrefix: g.PathPrefix, Dir: name, Size: size,
		FileCount: files, ExpireAt: expire, CreatedAt: now}
	replaced, err := s.store.PutPagesDeployment(ctx, d)
	if err != nil {
		os.RemoveAll(filepath.Join(projDir, name))
		return nil, err
	}
	if replaced != nil {
		if err := os.RemoveAll(filepath.Join(projDir, replaced.Dir)); err != nil {
			s.log.Warn("removing a replaced Pages deployment", "dir", replaced.Dir, "err", err)
		}
	}
	return d, nil
}

// JobArchive opens a job's artifacts archive (zip). Close the closer when
// done with the reader.
func JobArchive(ctx context.Context, st store.Store, arts artifacts.Storage, jobID int64) (*zip.Reader, io.Closer, error) {
	list, err := st.ListArtifacts(ctx, jobID)
	if err != nil {
		return nil, nil, err
	}
	var a *store.Artifact
	for _, x := range list {
		if x.Type == "archive" {
			a = x
		}
	}
	if a == nil {
		return nil, nil, fmt.Errorf("job %d has no artifacts archive: %w", jobID, ErrNoArchive)
	}
	if a.Format != "zip" {
		return nil, nil, fmt.Errorf("the artifacts archive of job %d is %s, not zip", jobID, a.Format)
	}
	rc, size, err := arts.Open(ctx, a.StorageKey)
	if err != nil {
		return nil, nil, err
	}
	ra, ok := rc.(io.ReaderAt)
	if !ok {
		rc.Close()
		return nil, nil, fmt.Errorf("artifact storage cannot read the archive of job %d at random", jobID)
	}
	zr, err := zip.NewReader(ra, size)
	if err != nil {
		rc.Close()
		return nil, nil, fmt.Errorf("reading the artifacts archive of job %d: %w", jobID, err)
	}
	return zr, rc, nil
}

// extractDir copies the regular files below dir/ of the archive into
// dst, keeping their paths relative to dir. Entries that would leave dst,
// symbolic links and other special files are skipped.
func extractDir(ctx context.Context, zr *zip.Reader, dir, dst string) (files int, size int64, err error) {
	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	for _, f := range zr.File {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		name := strings.TrimPrefix(path.Clean("/"+strings.ReplaceAll(f.Name, "\\", "/")), "/")
		if !strings.HasPrefix(name, prefix) || !f.Mode().IsRegular() || strings.HasSuffix(f.Name, "/") {
			continue
		}
		rel := strings.TrimPrefix(name, prefix)
		if rel == "" {
			continue
		}
		files++
		if files > maxPagesFiles {
			return 0, 0, fmt.Errorf("more than %d files", maxPagesFiles)
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		if !strings.HasPrefix(target, dst+string(filepath.Separator)) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return 0, 0, err
		}
		n, err := extractFile(f, target, maxPagesBytes-size)
		if err != nil {
			return 0, 0, err
		}
		size += n
	}
	return files, size, nil
}

func extractFile(f *zip.File, target string, room int64) (int64, error) {
	r, err := f.Open()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	w, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(w, io.LimitReader(r, room+1))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > room {
		err = fmt.Errorf("the site is larger than %d bytes", maxPagesBytes)
	}
	return n, err
}

// Expire removes the Pages deployments past their expiry (reaper).
func (s *Sites) Expire(ctx context.Context, now time.Time) error {
	expired, err := s.store.ExpiredPagesDeployments(ctx, now, 100)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range expired {
		if err := s.store.DeletePagesDeployment(ctx, d.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		if s.dir != "" {
			if err := os.RemoveAll(filepath.Join(s.dir, strconv.FormatInt(d.ProjectID, 10), d.Dir)); err != nil {
				errs = append(errs, err)
			}
		}
		s.log.Info("Pages deployment expired", "project_id", d.ProjectID, "path_prefix", d.PathPrefix)
	}
	return errors.Join(errs...)
}

// maxProjectDepth bounds the path segments tried as a project path.
const maxProjectDepth = 21

// ServeHTTP serves GET and HEAD /-/pages/<project path>/[<prefix>/]<file>.
// Public projects' sites are public; a private project's site needs the
// admin token. Directories serve their index.html (a directory URL
// without its slash is redirected to it), missing files the site's
// 404.html with status 404; there are no directory listings, and nothing
// outside the deployment's directory is ever opened.
func (s *Sites) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if s.dir == "" {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	rest := r.PathValue("rest")
	segs := strings.Split(strings.Trim(rest, "/"), "/")
	var (
		proj *store.Project
		n    int
	)
	for i := min(len(segs), maxProjectDepth); i >= 1 && proj == nil; i-- {
		p, err := s.store.ProjectByPath(ctx, strings.Join(segs[:i], "/"))
		if err == nil {
			proj, n = p, i
		} else if !errors.Is(err, store.ErrNotFound) {
			httpapi.InternalError(s.log, w, "loading project", err)
			return
		}
	}
	if proj == nil || (proj.Visibility != "public" && !httpapi.IsAdmin(r, s.store)) {
		http.NotFound(w, r)
		return
	}
	deps, err := s.store.ListPagesDeployments(ctx, proj.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing Pages deployments", err)
		return
	}
	var dep *store.PagesDeployment
	sub := segs[n:]
	for _, d := range deps {
		if d.PathPrefix != "" && len(sub) > 0 && sub[0] == d.PathPrefix {
			dep, sub = d, sub[1:]
			break
		}
	}
	if dep == nil {
		for _, d := range deps {
			if d.PathPrefix == "" {
				dep = d
			}
		}
	}
	if dep == nil {
		http.NotFound(w, r)
		return
	}
	root := filepath.Join(s.dir, strconv.FormatInt(proj.ID, 10), dep.Dir)
	// The request's own path decides the trailing slash; the file path
	// is cleaned so that it cannot leave root.
	file := path.Clean("/" + strings.Join(sub, "/"))
	if len(sub) == 0 || strings.HasSuffix(r.URL.Path, "/") {
		file = path.Join(file, "index.html")
	}
	if s.servePagesFile(w, r, root, file, http.StatusOK) {
		return
	}
	// A directory asked for without its slash: redirect to it, as static
	// hosts do, so relative links resolve inside it.
	if st, err := os.Lstat(filepath.Join(root, filepath.FromSlash(file))); err == nil && st.IsDir() {
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(file), "index.html")); err == nil {
			http.Redirect(w, r, r.URL.Path+"/", http.StatusFound)
			return
		}
	}
	if s.servePagesFile(w, r, root, "/404.html", http.StatusNotFound) {
		return
	}
	http.NotFound(w, r)
}

// servePagesFile serves one regular file of a deployment (never a
// directory, never through a symbolic link); false when there is none.
func (s *Sites) servePagesFile(w http.ResponseWriter, r *http.Request, root, file string, status int) bool {
	p := filepath.Join(root, filepath.FromSlash(file))
	if p != root && !strings.HasPrefix(p, root+string(filepath.Separator)) {
		return false
	}
	st, err := os.Lstat(p)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Sites are served from the coordinator's own origin: the sandbox
	// (without allow-same-origin) gives their pages an opaque origin, so a
	// project's scripts cannot act on the coordinator's API or read its
	// cookies with the visitor's credentials.
	w.Header().Set("Content-Security-Policy", pagesCSP)
	if status != http.StatusOK {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		if r.Method != http.MethodHead {
			_, _ = io.Copy(w, f)
		}
		return true
	}
	http.ServeContent(w, r, path.Base(file), st.ModTime(), f)
	return true
}
