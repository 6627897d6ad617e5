// Package router is Berth's Cells router: a stateless HTTP reverse proxy
// in front of several cells (coordinator clusters, each with its own
// store) that sends every Runner API v4, REST API and git request to the
// cell that owns its token, without a database. Tokens carry their cell
// (GitLab's routable tokens and job token JWTs, see TokenRouting);
// requests whose token does not go to the default cell or to the cell
// X-Berth-Cell names. Route is the decision, Router the proxy, its
// health checks of the cells, the ID token discovery it merges, and its
// metrics. docs/cells.md describes the whole.
//
// This is not GitLab's runner "Job Router" (a gRPC service runners ask
// for jobs); it is the counterpart of GitLab's Cells HTTP Router.
//
//	New ──► Run(ctx) (health checks, until ctx is done)
//	   └──► ServeHTTP (any time after New; cells count as healthy until
//	        checks say otherwise)
package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options are a Router's collaborators.
type Options struct {
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer and Gatherer are where the router's metrics go and what
	// /-/metrics serves; nil: a registry of the router's own.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Transport reaches the cells (default: one like
	// http.DefaultTransport, with Config.DialTimeout and no response
	// timeout, as long polls need).
	Transport http.RoundTripper
}

// Router routes requests to cells. It is safe for concurrent use.
type Router struct {
	cfg     Config
	log     *slog.Logger
	cells   map[int64]*cell
	order   []*cell // by id
	client  *http.Client
	metrics *metrics
}

// cell is one cell as the router sees it.
type cell struct {
	id    int64
	label string // id in decimal, the metrics' cell label
	url   *url.URL
	proxy *httputil.ReverseProxy

	healthy atomic.Bool
	mu      sync.Mutex // guards failures
	// failures counts health checks failed in a row.
	failures int
}

// New builds a router for cfg (which must Validate). It starts nothing:
// Run checks the cells' health.
func New(cfg Config, opts Options) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	cfg = cfg.withDefaults()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := opts.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
		// Runners' long polls are many and concurrent.
		t.MaxIdleConnsPerHost = 256
		t.MaxIdleConns = 256 * len(cfg.Cells)
		t.ResponseHeaderTimeout = 0
		tr = t
	}
	rt := &Router{
		cfg: cfg, log: log, cells: map[int64]*cell{},
		client:  &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		metrics: newMetrics(opts.Registerer, opts.Gatherer),
	}
	pool := newBufferPool()
	for _, id := range cellIDs(cfg.Cells) {
		var c *cell
		for _, cc := range cfg.Cells {
			if cc.ID == id {
				u, _ := cellURL(cc.URL) // checked by Validate
				c = &cell{id: id, label: strconv.FormatInt(id, 10), url: u}
			}
		}
		c.healthy.Store(true)
		c.proxy = &httputil.ReverseProxy{
			Rewrite:        c.rewrite,
			Transport:      tr,
			FlushInterval:  -1, // traces, long polls and streams reach the client as they come
			BufferPool:     pool,
			ErrorHandler:   rt.proxyError(c),
			ModifyResponse: c.modifyResponse,
			ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		rt.cells[id] = c
		rt.order = append(rt.order, c)
		rt.metrics.cellUp.WithLabelValues(c.label).Set(1)
	}
	return rt, nil
}

// rewrite sends a request to the cell: the cell's scheme, host and base
// path; X-Forwarded-For keeps the client's chain and adds the client,
// X-Forwarded-Host and -Proto say what the client asked for.
func (c *cell) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(c.url)
	if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 {
		pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
	}
	pr.SetXForwarded()
}

// modifyResponse says which cell answered.
func (c *cell) modifyResponse(res *http.Response) error {
	res.Header.Set(HeaderCell, c.label)
	return nil
}

// proxyError answers a request the cell did not: 502, unless the client
// went away first (a long poll given up), which is no error of the
// cell's.
func (rt *Router) proxyError(c *cell) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() != nil {
			if rec, ok := w.(*recorder); ok {
				rec.status = statusClientClosed
			}
			return
		}
		var ue *url.Error // carries the URL, and a URL may carry a token
		if errors.As(err, &ue) {
			err = ue.Err
		}
		rt.metrics.proxyErrors.WithLabelValues(c.label).Inc()
		rt.log.Warn("cell did not answer", "cell", c.id, "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusBadGateway, fmt.Sprintf("502 Bad Gateway - cell %d did not answer", c.id))
	}
}

// statusClientClosed is the status the metrics record for a request
// whose client went away before the cell answered (nginx's 499).
const statusClientClosed = 499

// ServeHTTP answers the router's own endpoints (GET /-/health,
// /-/metrics, /.well-known/openid-configuration, /oauth/discovery/keys
// and /-/jwks, unless X-Berth-Cell sends them to a cell) and routes
// everything else (Route) to its cell: 421 or 400 when it cannot, 503
// when the cell is unhealthy, 502 when the cell does not answer.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	label := "router"
	defer func() {
		rt.metrics.observe(label, rec.status, time.Since(start))
	}()
	if h := rt.own(r); h != nil {
		h(rec, r)
		return
	}
	d, err := rt.Route(r)
	if err != nil {
		label = "none"
		var re *RouteError
		if !errors.As(err, &re) {
			re = &RouteError{Status: http.StatusBadRequest, Detail: err.Error(), Err: err}
		}
		by := string(d.TokenSource)
		if by == "" {
			by = "none"
		}
		rt.metrics.routes.WithLabelValues(label, by).Inc()
		rt.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "token", tokenLog(d.Token),
			"token_source", d.TokenSource, "status", re.Status, "reason", re.Detail)
		if re.Status == http.StatusUnauthorized {
			rec.Header().Set("WWW-Authenticate", `Basic realm="GitLab"`)
		}
		writeError(rec, re.Status, re.Message())
		return
	}
	c := rt.cells[d.Cell]
	label = c.label
	rt.metrics.routes.WithLabelValues(label, string(d.By)).Inc()
	if !c.healthy.Load() {
		rec.Header().Set("Retry-After", strconv.Itoa(max(1, int(rt.cfg.HealthInterval/time.Second))))
		writeError(rec, http.StatusServiceUnavailable, fmt.Sprintf("503 Service Unavailable - cell %d is unavailable (its health checks fail); retry later", c.id))
		return
	}
	rt.log.Debug("routing", "method", r.Method, "path", r.URL.Path, "cell", c.id, "by", d.By, "token", tokenLog(d.Token))
	c.proxy.ServeHTTP(rec, r)
}

// own is the handler of the router's own endpoints, or nil.
func (rt *Router) own(r *http.Request) http.HandlerFunc {
	if (r.Method != http.MethodGet && r.Method != http.MethodHead) || r.Header.Get(HeaderCell) != "" {
		return nil
	}
	switch r.URL.Path {
	case "/-/health":
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("GitLab OK"))
		}
	case "/-/metrics":
		return rt.metrics.handler().ServeHTTP
	case "/.well-known/openid-configuration":
		return rt.serveOpenIDConfiguration
	case "/oauth/discovery/keys", "/-/jwks":
		return rt.serveJWKS
	}
	return nil
}

// Healthy says whether the router counts cell id healthy (false for a
// cell it does not serve).
func (rt *Router) Healthy(id int64) bool {
	c, ok := rt.cells[id]
	return ok && c.healthy.Load()
}

// writeError answers GitLab's error body, {"message": msg}.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	b, _ := jsonMarshal(map[string]string{"message": msg})
	_, _ = w.Write(append(b, '\n'))
}

// recorder keeps the status of a response for the metrics. Flush and
// Hijack (WebSocket upgrades) reach the writer underneath through
// Unwrap (http.ResponseController).
type recorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader && code >= 200 {
		r.status, r.wroteHeader = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Hijack takes the connection over for a protocol switch (101).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(r.ResponseWriter).Hijack()
	if err == nil {
		r.status, r.wroteHeader = http.StatusSwitchingProtocols, true
	}
	return conn, brw, err
}

// bufferPool lends the proxies their copy buffers.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

// Run checks every cell's health (GET /-/health answering 200) every
// HealthInterval until ctx is done, and returns nil then. A cell is
// marked unhealthy after UnhealthyAfter failed checks in a row, healthy
// again after one good one.
func (rt *Router) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, c := range rt.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(rt.cfg.HealthInterval)
			defer t.Stop()
			for {
				rt.check(ctx, c)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// check asks a cell's /-/health once and records the outcome.
func (rt *Router) check(ctx context.Context, c *cell) {
	err := rt.probe(ctx, c)
	if ctx.Err() != nil {
		return // stopping: not the cell's fault
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.failures = 0
		if !c.healthy.Swap(true) {
			rt.log.Info("cell healthy again", "cell", c.id)
		}
		rt.metrics.cellUp.WithLabelValues(c.label).Set(1)
		return
	}
	c.failures++
	rt.metrics.healthFailures.WithLabelValues(c.label).Inc()
	if c.failures >= rt.cfg.UnhealthyAfter && c.healthy.Swap(false) {
		rt.log.Warn("cell unhealthy: its requests get 503", "cell", c.id, "failed_checks", c.failures, "err", err)
	} else {
		rt.log.Debug("cell health check failed", "cell", c.id, "failed_checks", c.failures, "err", err)
	}
	if !c.healthy.Load() {
		rt.metrics.cellUp.WithLabelValues(c.label).Set(0)
	}
}

// probe is one health check.
func (rt *Router) probe(ctx context.Context, c *cell) error {
	ctx, cancel := context.WithTimeout(ctx, rt.cfg.HealthTimeout)
	defer cancel()
	res, err := rt.get(ctx, c, "/-/health")
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /-/health: status %d", res.StatusCode)
	}
	return nil
}

// get sends GET path to the cell.
func (rt *Router) get(ctx context.Context, c *cell, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url.JoinPath(path).String(), nil)
	if err != nil {
		return nil, err
	}
	res, err := rt.client.Do(req)
	var ue *url.Error
	if errors.As(err, &ue) {
		err = fmt.Errorf("GET %s: %w", path, ue.Err)
	}
	return res, err
}
