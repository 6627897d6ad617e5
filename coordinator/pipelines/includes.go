package pipelines

import (
	"container/list"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// IncludeConfig says how pipelines' include:remote, include:template,
// include:project and include:component are resolved (docs/ci-yaml.md,
// "Includes").
type IncludeConfig struct {
	// TemplatesDir holds GitLab's CI templates (a copy of
	// lib/gitlab/ci/templates from a GitLab checkout), for
	// include:template. Empty: include:template is an error saying so.
	TemplatesDir string
	// RemoteTimeout bounds one include:remote fetch, connection to last
	// byte (default 10s).
	RemoteTimeout time.Duration
	// RemoteAllowHosts, if set, are the only hosts include:remote may
	// fetch from; RemoteDenyHosts are never fetched from. An entry is a
	// host name ("ci.example.com") or "*.example.com" for its subdomains.
	RemoteAllowHosts []string
	RemoteDenyHosts  []string
	// RemoteAllowHTTP allows plain http:// URLs (default: https only).
	RemoteAllowHTTP bool
	// RemoteAllowPrivate allows fetching from loopback, private,
	// link-local and other non-public addresses (default: refused, so
	// that a pipeline cannot make the coordinator reach its own network).
	RemoteAllowPrivate bool
	// RemoteCAFile is a PEM file of extra certificate authorities trusted
	// for include:remote (beside the system's).
	RemoteCAFile string
	// RemoteCacheTTL is how long a fetched file is reused when the
	// include does not say (include:remote:cache does); 0: not reused,
	// as GitLab.
	RemoteCacheTTL time.Duration
	// RemoteCacheBytes bounds the cache of fetched files (default 32 MiB;
	// least recently used files go first).
	RemoteCacheBytes int64
}

// WithDefaults returns c with zero fields set to their defaults.
func (c IncludeConfig) WithDefaults() IncludeConfig {
	if c.RemoteTimeout == 0 {
		c.RemoteTimeout = 10 * time.Second
	}
	if c.RemoteCacheBytes == 0 {
		c.RemoteCacheBytes = 32 << 20
	}
	return c
}

// Validate checks c (after defaults are applied).
func (c IncludeConfig) Validate() []error {
	var errs []error
	if c.RemoteTimeout < 0 || c.RemoteCacheTTL < 0 || c.RemoteCacheBytes < 0 {
		errs = append(errs, errors.New("include remote timeout, cache TTL and cache size must not be negative"))
	}
	if c.TemplatesDir != "" {
		if st, err := os.Stat(c.TemplatesDir); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("CI templates directory %q is not a directory", c.TemplatesDir))
		}
	}
	for _, h := range append(append([]string(nil), c.RemoteAllowHosts...), c.RemoteDenyHosts...) {
		if h == "" || strings.ContainsAny(h, "/: ") {
			errs = append(errs, fmt.Errorf("include remote host %q: want a host name or *.domain", h))
		}
	}
	if c.RemoteCAFile != "" {
		if _, err := caPool(c.RemoteCAFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func caPool(file string) (*x509.CertPool, error) {
	if file == "" {
		// nil: crypto/tls verifies against the system's roots, loaded
		// when first needed (parsing them took 20-30 ms of every
		// coordinator start).
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("include remote CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("include remote CA file %s: no PEM certificates", file)
	}
	return pool, nil
}

// maxIncludeBytes is the size limit of an included file (GitLab's
// max_yaml_size_bytes, ci.Limits' default).
const maxIncludeBytes = 1 << 20

// includeResolver resolves a pipeline's includes for its project.
//
// Access rule for include:project and include:component: a pipeline of
// project P reads project Q when Q is P, Q is public, or P and Q are in
// the same top-level group (the first segment of their full paths; a
// project at the top level shares a group with no other). A project it
// may not read answers exactly as a missing one, so includes cannot probe
// which private projects exist.
type includeResolver struct {
	s    *Engine
	proj *store.Project
}

func (s *Engine) includeResolver(proj *store.Project) ci.IncludeResolver {
	return &includeResolver{s: s, proj: proj}
}

// mayInclude is the access rule above.
func mayInclude(from, to *store.Project) bool {
	if from.ID == to.ID || to.Visibility == "public" {
		return true
	}
	g := topGroup(from.Path)
	return g != "" && g == topGroup(to.Path)
}

func topGroup(path string) string {
	g, _, ok := strings.Cut(path, "/")
	if !ok {
		return ""
	}
	return strings.ToLower(g)
}

// project finds a project the pipeline may read, nil if none.
func (r *includeResolver) project(ctx context.Context, path string) (*store.Project, *gitrepo.Repo, error) {
	p, err := r.s.store.ProjectByPath(ctx, path)
	if errors.Is(err, store.ErrNotFound) {
		// Full paths match case-insensitively, as in GitLab.
		p, err = r.projectFold(ctx, path)
	}
	if errors.Is(err, store.ErrNotFound) || err == nil && !mayInclude(r.proj, p) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	repo, err := r.s.git.Repo(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	return p, repo, nil
}

func (r *includeResolver) projectFold(ctx context.Context, path string) (*store.Project, error) {
	all, err := r.s.store.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range all {
		if strings.EqualFold(p.Path, path) {
			return p, nil
		}
	}
	return nil, store.ErrNotFound
}

// commit resolves a branch, a tag or a full commit SHA of repo.
func commitOf(ctx context.Context, repo *gitrepo.Repo, ref string) (string, error) {
	refs, err := repo.Refs(ctx)
	if err != nil {
		return "", err
	}
	if sha, ok := refs["refs/heads/"+ref]; ok {
		return sha, nil
	}
	if sha, ok := refs["refs/tags/"+ref]; ok {
		return sha, nil
	}
	if gitrepo.IsSha(ref) {
		sha, err := repo.ResolveCommit(ctx, ref)
		if errors.Is(err, gitrepo.ErrNotFound) {
			return "", nil
		}
		return sha, err
	}
	return "", nil
}

func readIncluded(fsys fs.FS, name string) ([]byte, bool, error) {
	st, err := fs.Stat(fsys, name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) || err == nil && st.IsDir() {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if st.Size() > maxIncludeBytes {
		return nil, true, ci.IncludeErrorf("%s is %d bytes, larger than the limit of %d bytes", name, st.Size(), maxIncludeBytes)
	}
	b, err := fs.ReadFile(fsys, name)
	return b, true, err
}

// Project reads a file of a hosted project.
func (r *includeResolver) Project(ctx context.Context, path, ref, file string) (*ci.IncludedFile, error) {
	p, repo, err := r.project(ctx, path)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, ci.IncludeErrorf("Project `%s` not found or access denied! Make sure any includes in the pipeline configuration are correctly defined.", path)
	}
	if ref == "" {
		ref = p.DefaultBranch
	}
	sha, err := commitOf(ctx, repo, ref)
	if err != nil {
		return nil, err
	}
	if sha == "" {
		return nil, ci.IncludeErrorf("Project `%s` reference `%s` does not exist!", path, ref)
	}
	fsys, err := repo.FS(ctx, sha)
	if err != nil {
		return nil, err
	}
	data, found, err := readIncluded(fsys, file)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, ci.IncludeErrorf("Project `%s` file `%s` does not exist!", path, file)
	case strings.TrimSpace(string(data)) == "":
		return nil, ci.IncludeErrorf("Project `%s` file `%s` is empty!", path, file)
	}
	name := p.Path + "@" + ref + ":"
	return &ci.IncludedFile{Data: data, Location: name + file, Tree: fsys, TreeName: name}, nil
}

// existsIn answers rules:exists:project for a pipeline of proj: files of
// another hosted project at a ref (default: its default branch). A
// project proj may not read (the include:project access rule) or a ref
// that does not exist has no files, so rules cannot probe them.
func (s *Engine) existsIn(proj *store.Project) ci.ExistsInFunc {
	r := &includeResolver{s: s, proj: proj}
	return func(ctx context.Context, path, ref string, patterns []string) (bool, error) {
		p, repo, err := r.project(ctx, path)
		if err != nil || p == nil {
			return false, err
		}
		if ref == "" {
			ref = p.DefaultBranch
		}
		sha, err := commitOf(ctx, repo, ref)
		if err != nil || sha == "" {
			return false, err
		}
		fsys, err := repo.FS(ctx, sha)
		if err != nil {
			return false, err
		}
		return ci.FSExists(fsys)(ctx, patterns)
	}
}

// Template reads a GitLab CI template from the templates directory.
func (r *includeResolver) Template(ctx context.Context, name string) (*ci.IncludedFile, error) {
	dir := r.s.cfg.Includes.TemplatesDir
	if dir == "" {
		return nil, ci.IncludeErrorf("include:template %s: this server has no CI templates. Berth cannot ship GitLab's templates; "+
			"its administrator can copy lib/gitlab/ci/templates from a GitLab checkout into a directory and give it as --ci-templates-dir", name)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening CI templates directory: %w", err)
	}
	defer root.Close()
	data, found, err := readIncluded(root.FS(), name)
	switch {
	case err != nil:
		var ie *ci.IncludeError
		if errors.As(err, &ie) {
			return nil, err
		}
		return nil, fmt.Errorf("reading CI template %s: %w", name, err)
	case !found:
		return nil, ci.IncludeErrorf("Included file `%s` is empty or does not exist! (not in this server's CI templates directory)", name)
	}
	return &ci.IncludedFile{Data: data, Location: "templates/" + name}, nil
}

// Component returns the tree of a hosted project at a component version.
func (r *includeResolver) Component(ctx context.Context, ref ci.ComponentRef) (*ci.IncludedFile, error) {
	prefix := "Component '" + ref.Address + "' -"
	if !r.s.ownHost(ref.Host) {
		return nil, ci.IncludeErrorf("%s the component path is not supported: components are read from this server's projects (%s)", prefix, r.s.serverHost())
	}
	p, repo, err := r.project(ctx, ref.Project)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, ci.IncludeErrorf("%s project does not exist or you don't have sufficient permissions", prefix)
	}
	version := ref.Version
	if ci.IsVersionPattern(version) {
		refs, err := repo.Refs(ctx)
		if err != nil {
			return nil, err
		}
		var tags []string
		for name := range refs {
			if t, ok := strings.CutPrefix(name, "refs/tags/"); ok {
				tags = append(tags, t)
			}
		}
		t, ok := ci.ResolveComponentVersion(version, tags)
		if !ok {
			return nil, ci.IncludeErrorf("%s no release tag of %s matches %s (a semantic version tag such as 1.2.3)", prefix, p.Path, version)
		}
		version = t
	}
	sha, err := commitOf(ctx, repo, version)
	if err != nil {
		return nil, err
	}
	if sha == "" {
		return nil, ci.IncludeErrorf("%s content not found", prefix)
	}
	fsys, err := repo.FS(ctx, sha)
	if err != nil {
		return nil, err
	}
	return &ci.IncludedFile{Tree: fsys, TreeName: ref.Host + "/" + p.Path + "@" + version + ":", SHA: sha, Version: ci.ReleasedVersion(version)}, nil
}

// serverHost is this server's host as components name it
// (CI_SERVER_FQDN: host and port of the external URL).
func (s *Engine) serverHost() string {
	u, err := url.Parse(s.cfg.ExternalURL)
	if err != nil {
		return ""
	}
	return u.Host
}

func (s *Engine) ownHost(h string) bool {
	u, err := url.Parse(s.cfg.ExternalURL)
	if err != nil {
		return false
	}
	return strings.EqualFold(h, u.Host) || strings.EqualFold(h, u.Hostname())
}

// Remote fetches a URL through the server's fetcher.
func (r *includeResolver) Remote(ctx context.Context, rawURL string, opts ci.RemoteOptions) (*ci.IncludedFile, error) {
	data, err := r.s.remote.fetch(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	return &ci.IncludedFile{Data: data, Location: rawURL}, nil
}

// remoteFetcher fetches include:remote files under the configured policy
// and caches them by URL. Safe for concurrent use.
type remoteFetcher struct {
	cfg    IncludeConfig
	clock  Clock
	client *http.Client

	mu    sync.Mutex
	lru   *list.List // of *cached, most recent first
	byURL map[string]*list.Element
	bytes int64
}

type cached struct {
	url     string
	data    []byte
	digest  [sha256.Size]byte
	fetched time.Time
}

// errRedirect is a redirect the policy refuses.
type errRedirect struct{ err error }

func (e *errRedirect) Error() string { return e.err.Error() }

// errBlockedAddress is a connection the policy refuses.
type errBlockedAddress struct{ addr string }

func (e *errBlockedAddress) Error() string {
	return "requests to the non-public address " + e.addr + " are not allowed"
}

func newRemoteFetcher(cfg IncludeConfig, clock Clock) (*remoteFetcher, error) {
	pool, err := caPool(cfg.RemoteCAFile)
	if err != nil {
		return nil, err
	}
	f := &remoteFetcher{cfg: cfg, clock: clock, lru: list.New(), byURL: map[string]*list.Element{}}
	dialer := &net.Dialer{Timeout: cfg.RemoteTimeout, Control: f.control}
	tr := &http.Transport{
		Proxy:                  nil, // the address checked is the one dialled
		DialContext:            dialer.DialContext,
		TLSClientConfig:        &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    cfg.RemoteTimeout,
		ResponseHeaderTimeout:  cfg.RemoteTimeout,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		MaxIdleConns:           8,
		IdleConnTimeout:        30 * time.Second,
	}
	f.client = &http.Client{
		Transport: tr,
		Timeout:   cfg.RemoteTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return &errRedirect{errors.New("it redirected more than 5 times")}
			}
			if err := f.checkURL(req.URL); err != nil {
				return &errRedirect{fmt.Errorf("it redirected to %s, and %w", req.URL.Redacted(), err)}
			}
			return nil
		},
	}
	return f, nil
}

// control refuses connections to non-public addresses (after DNS, so a
// name that resolves to one is refused too).
func (f *remoteFetcher) control(network, address string, _ syscall.RawConn) error {
	if f.cfg.RemoteAllowPrivate {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &errBlockedAddress{addr: address}
	}
	if !publicAddr(ap.Addr()) {
		return &errBlockedAddress{addr: ap.Addr().String()}
	}
	return nil
}

var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

func hostMatches(host string, list []string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, e := range list {
		e = strings.ToLower(e)
		if suffix, ok := strings.CutPrefix(e, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
			continue
		}
		if host == e {
			return true
		}
	}
	return false
}

// checkURL applies the scheme and host policy.
func (f *remoteFetcher) checkURL(u *url.URL) error {
	switch {
	case u.Scheme == "http" && !f.cfg.RemoteAllowHTTP:
		return errors.New("plain http is not allowed by this server (use https)")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("the scheme %q is not allowed", u.Scheme)
	case hostMatches(u.Hostname(), f.cfg.RemoteDenyHosts):
		return fmt.Errorf("the host %s is denied by this server", u.Hostname())
	case len(f.cfg.RemoteAllowHosts) > 0 && !hostMatches(u.Hostname(), f.cfg.RemoteAllowHosts):
		return fmt.Errorf("the host %s is not in this server's allowed hosts", u.Hostname())
	}
	return nil
}

func (f *remoteFetcher) fetch(ctx context.Context, rawURL string, opts ci.RemoteOptions) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, ci.IncludeErrorf("Remote file `%s` does not have a valid address!", rawURL)
	}
	if err := f.checkURL(u); err != nil {
		return nil, ci.IncludeErrorf("Remote file `%s` could not be fetched because %v!", rawURL, err)
	}
	ttl := opts.CacheTTL
	if ttl == 0 {
		ttl = f.cfg.RemoteCacheTTL
	}
	if ttl > 0 {
		if b, ok := f.cachedBody(rawURL, ttl, opts.Integrity); ok {
			return b, nil
		}
	}
	b, err := f.get(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if ttl > 0 {
		f.store(rawURL, b)
	}
	return b, nil
}

func (f *remoteFetcher) get(ctx context.Context, rawURL string) ([]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, f.cfg.RemoteTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, ci.IncludeErrorf("Remote file `%s` does not have a valid address!", rawURL)
	}
	req.Header.Set("User-Agent", "berth-coordinator (CI include:remote)")
	res, err := f.client.Do(req)
	if err != nil {
		return nil, f.fetchErr(ctx, rawURL, err)
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		return nil, ci.IncludeErrorf("Remote file `%s` could not be fetched because of HTTP code `%d` error!", rawURL, res.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, maxIncludeBytes+1))
	if err != nil {
		return nil, f.fetchErr(ctx, rawURL, err)
	}
	if len(b) > maxIncludeBytes {
		return nil, ci.IncludeErrorf("Remote file `%s` is larger than the limit of %d bytes", rawURL, maxIncludeBytes)
	}
	return b, nil
}

// fetchErr classifies a failed fetch: the pipeline's own cancellation is
// returned as is; anything else is the include's problem.
func (f *remoteFetcher) fetchErr(ctx context.Context, rawURL string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var blocked *errBlockedAddress
	var redirect *errRedirect
	var nerr net.Error
	switch {
	case errors.As(err, &redirect):
		return ci.IncludeErrorf("Remote file `%s` could not be fetched because %v!", rawURL, redirect)
	case errors.As(err, &blocked):
		return ci.IncludeErrorf("Remote file could not be fetched because %v!", blocked)
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout():
		return ci.IncludeErrorf("Remote file `%s` could not be fetched because of a timeout error!", rawURL)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	return ci.IncludeErrorf("Remote file `%s` could not be fetched because of a socket error! (%v)", rawURL, err)
}

// cachedBody returns a cached body younger than ttl whose content still
// has its digest and, if integrity is given, matches it.
func (f *remoteFetcher) cachedBody(rawURL string, ttl time.Duration, integrity string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	el, ok := f.byURL[rawURL]
	if !ok {
		return nil, false
	}
	c := el.Value.(*cached)
	if f.clock.Now().Sub(c.fetched) >= ttl || sha256.Sum256(c.data) != c.digest {
		return nil, false
	}
	if integrity != "" && integrity != "sha256-"+base64.StdEncoding.EncodeToString(c.digest[:]) {
		return nil, false
	}
	f.lru.MoveToFront(el)
	return append([]byte(nil), c.data...), true
}

func (f *remoteFetcher) store(rawURL string, b []byte) {
	if int64(len(b)) > f.cfg.RemoteCacheBytes {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if el, ok := f.byURL[rawURL]; ok {
		f.bytes -= int64(len(el.Value.(*cached).data))
		f.lru.Remove(el)
		delete(f.byURL, rawURL)
	}
	c := &cached{url: rawURL, data: append([]byte(nil), b...), digest: sha256.Sum256(b), fetched: f.clock.Now()}
	f.byURL[rawURL] = f.lru.PushFront(c)
	f.bytes += int64(len(b))
	for f.bytes > f.cfg.RemoteCacheBytes {
		last := f.lru.Back()
		old := last.Value.(*cached)
		f.lru.Remove(last)
		delete(f.byURL, old.url)
		f.bytes -= int64(len(old.data))
	}
}
