package githost

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Git smart HTTP. The coordinator serves each project's bare repository at
// EXTERNAL_URL/<project path>.git through git's own `git http-backend`
// (CGI), after authenticating the request itself with HTTP basic auth:
//
//   - the admin token (any user name): fetch and push;
//   - a user's token (any user name; berth users): an admin user's as
//     the admin token; else by the user's access level in the project
//     (berth members): reporters fetch, developers push, but only
//     maintainers push to the default branch (protected, as in GitLab);
//   - gitlab-ci-token:<job token> of a job a runner holds: fetch its own
//     project, or any public project;
//   - no credentials: fetch a public project.
//
// A push holds the repository's lock while git receives it; the refs are
// compared before and after, and each branch or tag it created or moved
// goes to Options.Pushed (the coordinator creates its pipeline, if the
// commit has a .gitlab-ci.yml), unless the push carried the ci.skip push
// option (`git push -o ci.skip`).

// gitServices are the smart HTTP endpoints below a repository URL.
var gitServices = map[string]bool{"/info/refs": true, "/git-upload-pack": true, "/git-receive-pack": true}

// parseRepoURL splits a smart HTTP request path ("/group/demo.git/info/refs")
// into the project path ("group/demo") and the service path ("/info/refs").
// ok is false for anything else.
func parseRepoURL(p string) (project, service string, ok bool) {
	i := strings.LastIndex(p, ".git/")
	if i <= 1 || p[0] != '/' {
		return "", "", false
	}
	project, service = p[1:i], p[i+4:]
	if !gitServices[service] {
		return "", "", false
	}
	clean, err := ParseProjectPath(project)
	if err != nil || clean != project {
		return "", "", false
	}
	return project, service, true
}

// gitAccess is what a request may do with a repository.
type gitAccess int

const (
	gitNone gitAccess = iota
	gitRead
	gitWrite
)

// gitAuth decides the access of a request's credentials to a project:
// what it may do, the name it goes by, and its member level (AccessOwner
// for the admin token and admin users: every ref).
func (h *Host) gitAuth(ctx context.Context, r *http.Request, p *store.Project) (gitAccess, string, store.MemberAccess, error) {
	user, pass, ok := r.BasicAuth()
	public := p.Visibility == "public"
	anyone := gitNone
	if public {
		anyone = gitRead
	}
	if !ok || pass == "" {
		return anyone, "", 0, nil
	}
	want, err := h.store.GetSetting(ctx, h.adminTokenSetting)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return gitNone, "", 0, err
	}
	digest := token.Digest(pass)
	if err == nil && token.Equal(want, digest) {
		if user == "" {
			user = "admin"
		}
		return gitWrite, user, store.AccessOwner, nil
	}
	if user == "gitlab-ci-token" {
		project, ok, err := h.jobProject(ctx, pass)
		if err != nil {
			return gitNone, "", 0, err
		}
		if ok && (project == p.ID || public) {
			return gitRead, "gitlab-ci-token", 0, nil
		}
		return anyone, "", 0, nil
	}
	u, err := h.store.UserByTokenDigest(ctx, digest)
	if errors.Is(err, store.ErrNotFound) {
		return anyone, "", 0, nil
	}
	if err != nil {
		return gitNone, "", 0, err
	}
	level, err := store.AccessOf(ctx, h.store, u, p.ID)
	switch {
	case err != nil:
		return gitNone, "", 0, err
	case level >= store.AccessDeveloper:
		return gitWrite, u.Name, level, nil
	case level >= store.AccessReporter:
		return gitRead, u.Name, level, nil
	}
	return anyone, u.Name, level, nil
}

// refAllowed says why a member at level may not push update to project
// p ("" when it may): the default branch is protected, maintainers only.
func refAllowed(p *store.Project, level store.MemberAccess, u RefUpdate) string {
	branch, isBranch := strings.CutPrefix(u.Ref, "refs/heads/")
	protected := isBranch && p.Protects(branch)
	if level >= store.ActAccess(protected) {
		return ""
	}
	if protected {
		return fmt.Sprintf("%s is the default branch, protected: maintainers may push to it", u.Ref)
	}
	return fmt.Sprintf("pushing takes a developer; you may not push to %s", u.Ref)
}

// ServeHTTP serves smart HTTP for a project's repository: requests for
// /<project path>.git/info/refs, /git-upload-pack and /git-receive-pack,
// and its Git LFS objects (lfs.go); any other path answers 404.
func (h *Host) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isLFS(r.URL.Path) {
		h.serveLFS(w, r)
		return
	}
	projectPath, service, ok := parseRepoURL(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	q := r.URL.Query().Get("service")
	write := service == "/git-receive-pack" || (service == "/info/refs" && q == "git-receive-pack")
	switch {
	case service == "/info/refs" && q != "git-upload-pack" && q != "git-receive-pack":
		writeError(w, http.StatusForbidden, "403 Forbidden - only git's smart HTTP protocol is served")
		return
	case service != "/info/refs" && r.Method != http.MethodPost, service == "/info/refs" && r.Method != http.MethodGet:
		writeError(w, http.StatusMethodNotAllowed, "405 Method Not Allowed")
		return
	}
	ctx := r.Context()
	if h.dir == "" {
		writeError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	p, err := h.store.ProjectByPath(ctx, projectPath)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.internalError(w, "loading project", err)
		return
	}
	access, user, level := gitNone, "", store.MemberAccess(0)
	if err == nil {
		if access, user, level, err = h.gitAuth(ctx, r, p); err != nil {
			h.internalError(w, "authenticating git request", err)
			return
		}
	}
	if access == gitNone || (write && access < gitWrite) {
		if _, _, hasAuth := r.BasicAuth(); !hasAuth {
			w.Header().Set("WWW-Authenticate", `Basic realm="Berth"`)
			writeError(w, http.StatusUnauthorized, "401 Unauthorized")
			return
		}
		if access == gitNone {
			// Who may not see a project is not told whether it exists:
			// a missing and a private project answer the same.
			writeError(w, http.StatusNotFound, "404 Not Found")
			return
		}
		writeError(w, http.StatusForbidden, "403 Forbidden")
		return
	}
	if p == nil {
		writeError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	repo, err := h.Repo(ctx, p)
	if err != nil {
		h.internalError(w, "opening repository", err)
		return
	}
	if !write {
		h.serveUploadPack(w, r, p, repo, service)
		return
	}
	if service == "/info/refs" {
		h.serveGitCGI(w, r, p, service, user)
		return
	}
	h.receivePack(w, r, p, repo, user, level)
}

// receivePack serves a push and has the pipelines it asks for created.
func (h *Host) receivePack(w http.ResponseWriter, r *http.Request, p *store.Project, repo *gitrepo.Repo, user string, level store.MemberAccess) {
	ctx := r.Context()
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
		r.Header.Del("Content-Encoding")
		r.ContentLength = -1
	}
	br := bufio.NewReaderSize(body, 64<<10)
	hdr, raw, err := readReceivePackHeader(br)
	if err != nil {
		writeError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	// Every ref or none: git applies a push whole or refuses it whole.
	for _, u := range hdr.Updates {
		if why := refAllowed(p, level, u); why != "" {
			h.log.Info("push refused", "project_id", p.ID, "user", user, "ref", u.Ref, "access_level", int(level))
			writeError(w, http.StatusForbidden, "403 Forbidden - "+why)
			return
		}
	}
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw), br))
	if r.ContentLength >= 0 && int64(len(raw)) > r.ContentLength {
		r.ContentLength = -1
	}

	// The journal makes the push recoverable: a crash after git moved
	// the refs and before the pipelines exist is replayed at the next
	// start (pushjournal.go).
	journal := ""
	if !hdr.SkipCI() {
		if journal, err = journalPush(repo, hdr.Updates); err != nil {
			h.internalError(w, "journaling a push", err)
			return
		}
	}
	lock := h.RepoLock(p.ID)
	lock.Lock()
	before, err := repo.Refs(ctx)
	if err != nil {
		lock.Unlock()
		h.internalError(w, "listing refs", err)
		return
	}
	h.serveGitCGI(w, r, p, "/git-receive-pack", user)
	after, err := repo.Refs(context.WithoutCancel(ctx))
	lock.Unlock()
	if err != nil {
		h.log.Error("listing refs after a push", "project_id", p.ID, "err", err)
		return
	}
	updates := changedRefs(before, after)
	if hdr.SkipCI() {
		if len(updates) > 0 {
			h.log.Info("push with ci.skip: no pipeline", "project_id", p.ID, "refs", len(updates))
		}
		return
	}
	failed := false
	for _, u := range updates {
		if err := h.push(context.WithoutCancel(ctx), p, repo, u); err != nil {
			h.log.Error("push: creating its pipeline failed; retried at the next start", "project_id", p.ID, "ref", u.Ref, "err", err)
			failed = true
		}
	}
	if journal != "" && !failed {
		if err := os.Remove(journal); err != nil {
			h.log.Warn("removing a push journal", "file", journal, "err", err)
		}
	}
}

// RefUpdate is one ref a push changed. Its field names are the push
// journal's format on disk (pushjournal.go).
type RefUpdate struct {
	Old, New, Ref string
}

// push hands one pushed ref to Options.Pushed.
func (h *Host) push(ctx context.Context, p *store.Project, repo *gitrepo.Repo, u RefUpdate) error {
	if h.pushed == nil {
		return nil
	}
	return h.pushed(ctx, p, repo, u)
}

// changedRefs lists the branches and tags created or moved between two
// listings (deleted refs start no pipeline), ordered by name.
func changedRefs(before, after map[string]string) []RefUpdate {
	var out []RefUpdate
	for ref, sha := range after {
		if old, ok := before[ref]; !ok || old != sha {
			if !ok {
				old = gitrepo.ZeroSha
			}
			out = append(out, RefUpdate{Old: old, New: sha, Ref: ref})
		}
	}
	slices.SortFunc(out, func(a, b RefUpdate) int { return strings.Compare(a.Ref, b.Ref) })
	return out
}

var (
	gitPathOnce sync.Once
	gitPath     string
	gitPathErr  error
)

// serveGitCGI runs git http-backend for a request on a project's
// repository.
func (h *Host) serveGitCGI(w http.ResponseWriter, r *http.Request, p *store.Project, service, user string) {
	gitPathOnce.Do(func() { gitPath, gitPathErr = exec.LookPath("git") })
	if gitPathErr != nil {
		h.internalError(w, "finding git", gitPathErr)
		return
	}
	r2 := r.Clone(r.Context())
	r2.Body = r.Body
	r2.URL.Path = "/" + strconv.FormatInt(p.ID, 10) + ".git" + service
	r2.URL.RawPath = ""
	env := []string{
		"GIT_PROJECT_ROOT=" + h.dir,
		"GIT_HTTP_EXPORT_ALL=1",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_HTTP_MAX_REQUEST_BUFFER=100M",
	}
	if user != "" {
		env = append(env, "REMOTE_USER="+user)
	}
	cgiHandler := &cgi.Handler{
		Path:       gitPath,
		Args:       []string{"http-backend"},
		Env:        env,
		InheritEnv: []string{"PATH", "HOME", "TMPDIR"},
		Stderr:     &logWriter{log: h.log, project: p.ID},
	}
	cgiHandler.ServeHTTP(w, r2)
}

// logWriter sends git's stderr to the log, one entry per write.
type logWriter struct {
	log     *slog.Logger
	project int64
}

func (l *logWriter) Write(b []byte) (int, error) {
	if msg := strings.TrimSpace(string(b)); msg != "" {
		l.log.Warn("git http-backend", "project_id", l.project, "stderr", msg)
	}
	return len(b), nil
}

// receivePackHeader is the part of a git-receive-pack request before the
// pack: the ref update commands and the push options.
type receivePackHeader struct {
	Updates      []RefUpdate
	Capabilities []string
	Options      []string
}

// SkipCI reports whether the push asked for no pipeline (-o ci.skip).
func (h *receivePackHeader) SkipCI() bool {
	for _, o := range h.Options {
		if o == "ci.skip" || o == "skip-ci" {
			return true
		}
	}
	return false
}

// Limits of readReceivePackHeader.
const (
	maxPushCommands = 10000
	maxPushOptions  = 100
	maxPktLen       = 65520
)

// readReceivePackHeader reads the commands and push options of a
// git-receive-pack request body (pkt-lines up to the flush after the
// commands, and after the options when the client negotiated
// push-options), and returns them with the bytes it consumed, which the
// caller passes on to git unchanged.
func readReceivePackHeader(r *bufio.Reader) (*receivePackHeader, []byte, error) {
	var raw bytes.Buffer
	h := &receivePackHeader{}
	first := true
	for {
		line, flush, err := readPkt(r, &raw)
		if err != nil {
			return nil, nil, fmt.Errorf("reading push commands: %w", err)
		}
		if flush {
			break
		}
		// A push from a shallow repository starts with "shallow <sha>"
		// lines; the capabilities ride on the first command after them.
		if sha, ok := strings.CutPrefix(line, "shallow "); ok && len(h.Updates) == 0 {
			if !gitrepo.IsSha(sha) {
				return nil, nil, fmt.Errorf("malformed shallow line %q", truncate(line, 100))
			}
			continue
		}
		if first {
			cmd, caps, hasCaps := strings.Cut(line, "\x00")
			line = cmd
			if hasCaps {
				h.Capabilities = strings.Fields(caps)
			}
			first = false
		}
		f := strings.Fields(line)
		if len(f) != 3 || !gitrepo.IsSha(f[0]) || !gitrepo.IsSha(f[1]) || !strings.HasPrefix(f[2], "refs/") {
			return nil, nil, fmt.Errorf("malformed push command %q", truncate(line, 100))
		}
		if len(h.Updates) >= maxPushCommands {
			return nil, nil, errors.New("too many push commands")
		}
		h.Updates = append(h.Updates, RefUpdate{Old: f[0], New: f[1], Ref: f[2]})
	}
	if len(h.Updates) == 0 {
		// A push with nothing to update: git sends only a flush.
		return h, raw.Bytes(), nil
	}
	pushOptions := false
	for _, c := range h.Capabilities {
		if c == "push-options" {
			pushOptions = true
		}
	}
	if !pushOptions {
		return h, raw.Bytes(), nil
	}
	for {
		line, flush, err := readPkt(r, &raw)
		if err != nil {
			return nil, nil, fmt.Errorf("reading push options: %w", err)
		}
		if flush {
			break
		}
		if len(h.Options) >= maxPushOptions {
			return nil, nil, errors.New("too many push options")
		}
		h.Options = append(h.Options, line)
	}
	return h, raw.Bytes(), nil
}

// readPkt reads one pkt-line, copying its bytes to raw. It returns the
// payload without a trailing newline, or flush for "0000".
func readPkt(r *bufio.Reader, raw *bytes.Buffer) (string, bool, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", false, err
	}
	raw.Write(hdr[:])
	n, err := strconv.ParseUint(string(hdr[:]), 16, 16)
	if err != nil {
		return "", false, fmt.Errorf("bad pkt-line length %q", hdr[:])
	}
	if n == 0 {
		return "", true, nil
	}
	if n < 4 || n > maxPktLen {
		return "", false, fmt.Errorf("bad pkt-line length %d", n)
	}
	buf := make([]byte, n-4)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", false, err
	}
	raw.Write(buf)
	return strings.TrimSuffix(string(buf), "\n"), false, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
