package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/token"
)

// fakeCell is a backend standing in for a cell: it answers /-/health
// (unless made unhealthy), echoes what it received as JSON, and lets a
// test add handlers.
type fakeCell struct {
	id      int64
	srv     *httptest.Server
	mux     *http.ServeMux
	healthy atomic.Bool
}

// echo is what a fakeCell answers by default.
type echo struct {
	Cell          int64
	Method, Path  string
	Query         string
	BodySHA256    string
	BodyLen       int
	Header        http.Header
	ContentLength int64
}

func newFakeCell(t *testing.T, id int64) *fakeCell {
	t.Helper()
	c := &fakeCell{id: id, mux: http.NewServeMux()}
	c.healthy.Store(true)
	c.mux.HandleFunc("GET /-/health", func(w http.ResponseWriter, r *http.Request) {
		if !c.healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "GitLab OK")
	})
	c.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(b)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(echo{Cell: id, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
			BodySHA256: hex.EncodeToString(sum[:]), BodyLen: len(b), Header: r.Header, ContentLength: r.ContentLength})
	})
	c.srv = httptest.NewServer(c.mux)
	t.Cleanup(c.srv.Close)
	return c
}

// routerOver serves a router over cells on loopback; cfg's cells are
// set from them.
func routerOver(t *testing.T, cfg Config, opts Options, cells ...*fakeCell) (*Router, *httptest.Server) {
	t.Helper()
	for _, c := range cells {
		cfg.Cells = append(cfg.Cells, Cell{ID: c.id, URL: c.srv.URL})
	}
	rt, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(rt)
	t.Cleanup(hs.Close)
	return rt, hs
}

func doJSON(t *testing.T, req *http.Request, v any) *http.Response {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: status %d, body %q: %v", req.Method, req.URL.Path, res.StatusCode, b, err)
		}
	}
	return res
}

// TestRouterProxiesBodiesIntact: bodies reach the cell byte for byte,
// whether the router read the token from them (a job update of 3 MiB,
// with and without Content-Length) or never looked (an artifact upload).
func TestRouterProxiesBodiesIntact(t *testing.T) {
	c1, c2 := newFakeCell(t, 1), newFakeCell(t, 2)
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1, c2)
	tok := routable(t, "glrt-t1_", 2)
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
	update := append([]byte(`{"token":"`+tok+`","state":"running","output":{"bytesize":1},"trace":"`), big...)
	update = append(update, `"}`...)
	artifact := append([]byte("PK\x03\x04"), big...)
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		header             map[string]string
		chunked            bool
	}{
		{"job update, token in the body", "PUT", "/api/v4/jobs/77", update, nil, false},
		{"job update, chunked", "PUT", "/api/v4/jobs/77", update, nil, true},
		{"artifact upload, JOB-TOKEN", "POST", "/api/v4/jobs/77/artifacts?artifact_format=zip", artifact, map[string]string{"JOB-TOKEN": tok}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length
			}
			req, _ := http.NewRequest(tc.method, hs.URL+tc.path, body)
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			var e echo
			res := doJSON(t, req, &e)
			sum := sha256.Sum256(tc.body)
			if res.StatusCode != 200 || e.Cell != 2 || res.Header.Get(HeaderCell) != "2" {
				t.Fatalf("status %d, answered by cell %d (header %q), want cell 2", res.StatusCode, e.Cell, res.Header.Get(HeaderCell))
			}
			if e.BodySHA256 != hex.EncodeToString(sum[:]) || e.BodyLen != len(tc.body) {
				t.Errorf("cell got %d bytes (sha256 %s), sent %d (%x)", e.BodyLen, e.BodySHA256, len(tc.body), sum)
			}
			if want := int64(len(tc.body)); !tc.chunked && e.ContentLength != want {
				t.Errorf("cell got Content-Length %d, want %d", e.ContentLength, want)
			}
			if e.Path != strings.Split(tc.path, "?")[0] {
				t.Errorf("cell got path %q", e.Path)
			}
		})
	}
}

// TestRouterForwardsClientHeaders: X-Forwarded-* say who asked and
// how; the client's own chain is kept.
func TestRouterForwardsClientHeaders(t *testing.T) {
	c1 := newFakeCell(t, 1)
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1)
	req, _ := http.NewRequest("GET", hs.URL+"/api/v4/projects?per_page=2", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Host = "gitlab.example.com"
	var e echo
	doJSON(t, req, &e)
	if got := e.Header.Get("X-Forwarded-For"); got != "203.0.113.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q", got)
	}
	if e.Header.Get("X-Forwarded-Host") != "gitlab.example.com" || e.Header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("X-Forwarded-Host %q, -Proto %q", e.Header.Get("X-Forwarded-Host"), e.Header.Get("X-Forwarded-Proto"))
	}
	if e.Query != "per_page=2" {
		t.Errorf("query %q", e.Query)
	}
}

// TestRouterPassesWebSocketUpgrades: an upgrade (the push channel's
// gRPC-over-WebSocket, Authorization: Bearer <runner token>) reaches the
// token's cell and the connection is then the cell's, both ways.
func TestRouterPassesWebSocketUpgrades(t *testing.T) {
	c1, c2 := newFakeCell(t, 1), newFakeCell(t, 2)
	var gotAuth atomic.Value
	c2.mux.HandleFunc("GET /api/v4/runners/push", func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", 400)
			return
		}
		gotAuth.Store(r.Header.Get("Authorization"))
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Protocol: ws-tunnel\r\n\r\n")
		brw.Flush()
		// Echo, upper-cased, until the client closes.
		buf := make([]byte, 256)
		for {
			n, err := brw.Read(buf)
			if err != nil {
				return
			}
			conn.Write(bytes.ToUpper(buf[:n]))
		}
	})
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1, c2)
	tok := routable(t, "glrt-t2_", 2)
	conn, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /api/v4/runners/push HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: ws-tunnel\r\n\r\n", tok)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Sec-WebSocket-Protocol") != "ws-tunnel" {
		t.Fatalf("upgrade: %s %v", res.Status, res.Header)
	}
	for _, msg := range []string{"hello", "frames both ways"} {
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != strings.ToUpper(msg) {
			t.Fatalf("echo %q, want %q", got, strings.ToUpper(msg))
		}
	}
	if gotAuth.Load() != "Bearer "+tok {
		t.Errorf("cell got Authorization %q", gotAuth.Load())
	}
}

// TestRouterStreamsResponses: what a cell writes and flushes reaches the
// client at once (a trace being read, a long poll's answer), not when
// the response ends.
func TestRouterStreamsResponses(t *testing.T) {
	c1 := newFakeCell(t, 1)
	release := make(chan struct{})
	c1.mux.HandleFunc("GET /api/v4/jobs/1/trace", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first line\n")
		http.NewResponseController(w).Flush()
		<-release
		io.WriteString(w, "second line\n")
	})
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1)
	res, err := http.Get(hs.URL + "/api/v4/jobs/1/trace")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	done := make(chan string, 1)
	go func() { l, _ := br.ReadString('\n'); done <- l }()
	select {
	case l := <-done:
		if l != "first line\n" {
			t.Fatalf("first read %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flushed line did not come through before the response ended")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second line\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestRouterHealthChecks: a cell whose health checks fail is marked
// unhealthy after UnhealthyAfter checks and its requests get 503 (not
// another cell's answer); one good check brings it back.
func TestRouterHealthChecks(t *testing.T) {
	c1, c2 := newFakeCell(t, 1), newFakeCell(t, 2)
	rt, hs := routerOver(t, Config{DefaultCell: 1, HealthInterval: 100 * time.Millisecond, HealthTimeout: 100 * time.Millisecond, UnhealthyAfter: 3}, Options{}, c1, c2)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- rt.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	tok := routable(t, "glrt-t1_", 2)
	get := func() (*http.Response, string) {
		req, _ := http.NewRequest("POST", hs.URL+"/api/v4/jobs/request", strings.NewReader(`{"token":"`+tok+`"}`))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	if res, _ := get(); res.StatusCode != 200 {
		t.Fatalf("healthy cell: %d", res.StatusCode)
	}
	c2.healthy.Store(false)
	waitFor(t, "cell 2 marked unhealthy", func() bool { return !rt.Healthy(2) })
	if !rt.Healthy(1) {
		t.Error("cell 1 marked unhealthy too")
	}
	res, body := get()
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, `"503 Service Unavailable - cell 2 is unavailable (its health checks fail); retry later"`) {
		t.Fatalf("unhealthy cell: %d %q (Retry-After %q)", res.StatusCode, body, res.Header.Get("Retry-After"))
	}
	c2.healthy.Store(true)
	waitFor(t, "cell 2 healthy again", func() bool { return rt.Healthy(2) })
	if res, _ := get(); res.StatusCode != 200 {
		t.Fatalf("recovered cell: %d", res.StatusCode)
	}
	// A stopped cell (connection refused) is unhealthy too.
	c2.srv.Close()
	waitFor(t, "stopped cell 2 marked unhealthy", func() bool { return !rt.Healthy(2) })
	waitMetrics(t, hs.URL, `berth_router_cell_up{cell="1"} 1`, `berth_router_cell_up{cell="2"} 0`, `berth_router_requests_total{cell="2",code="503"} 1`)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// waitMetrics waits until the router's metrics have every line of
// wants: a request is counted once answered, which may be just after
// its client has the answer.
func waitMetrics(t *testing.T, base string, wants ...string) {
	t.Helper()
	var m string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m = scrape(t, base)
		missing := false
		for _, w := range wants {
			missing = missing || !strings.Contains(m, w)
		}
		if !missing {
			return
		}
	}
	for _, w := range wants {
		if !strings.Contains(m, w) {
			t.Errorf("metrics lack %s", w)
		}
	}
	t.Logf("metrics:\n%s", m)
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	res, err := http.Get(base + "/-/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// TestRouterCellNotAnswering: a cell that refuses connections before the
// health checks notice gives 502, counted as a proxy error.
func TestRouterCellNotAnswering(t *testing.T) {
	c1 := newFakeCell(t, 1)
	c1.srv.Close()
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1)
	res, err := http.Get(hs.URL + "/api/v4/projects?private_token=secret")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 502 || !strings.Contains(string(b), "502 Bad Gateway - cell 1 did not answer") {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	waitMetrics(t, hs.URL, `berth_router_proxy_errors_total{cell="1"} 1`, `berth_router_requests_total{cell="1",code="502"} 1`)
}

// TestRouterOwnEndpoints: the router answers its health and metrics
// itself, or sends them to the cell X-Berth-Cell names.
func TestRouterOwnEndpoints(t *testing.T) {
	c1, c2 := newFakeCell(t, 1), newFakeCell(t, 2)
	c2.healthy.Store(false) // the router's health is its own
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1, c2)
	res, err := http.Get(hs.URL + "/-/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != "GitLab OK" || res.Header.Get(HeaderCell) != "" {
		t.Fatalf("router health: %d %q (cell %q)", res.StatusCode, b, res.Header.Get(HeaderCell))
	}
	req, _ := http.NewRequest("GET", hs.URL+"/-/health", nil)
	req.Header.Set(HeaderCell, "2")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 || res.Header.Get(HeaderCell) != "2" {
		t.Fatalf("cell 2's health through the router: %d (cell %q)", res.StatusCode, res.Header.Get(HeaderCell))
	}
	waitMetrics(t, hs.URL,
		`berth_router_requests_total{cell="router",code="200"} 1`,
		`berth_router_requests_total{cell="2",code="503"} 1`,
		`berth_router_routes_total{by="cell_header",cell="2"} 1`,
		`berth_router_request_duration_seconds_count{cell="2"} 1`)
}

// TestRouterMergesDiscovery: the JWKS is every healthy cell's keys, each
// kid once; a cell that fails is left out; the discovery document names
// the router as issuer.
func TestRouterMergesDiscovery(t *testing.T) {
	cells := []*fakeCell{newFakeCell(t, 1), newFakeCell(t, 2), newFakeCell(t, 3)}
	keys := map[int64]string{
		1: `{"keys":[{"kty":"RSA","kid":"a","n":"1"},{"kty":"RSA","kid":"shared","n":"s"}]}`,
		2: `{"keys":[{"kty":"RSA","kid":"shared","n":"s"},{"kty":"RSA","kid":"b","n":"2"},{"kty":"RSA","n":"nokid"}]}`,
	}
	for _, c := range cells {
		c.mux.HandleFunc("GET /oauth/discovery/keys", func(w http.ResponseWriter, r *http.Request) {
			k, ok := keys[c.id]
			if !ok {
				http.Error(w, "broken", 500)
				return
			}
			io.WriteString(w, k)
		})
		c.mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"issuer":"http://cell%d","jwks_uri":"http://cell%d/oauth/discovery/keys","claims_supported":["sub"]}`, c.id, c.id)
		})
	}
	_, hs := routerOver(t, Config{DefaultCell: 1, ExternalURL: "https://gitlab.example.com/"}, Options{}, cells...)
	for _, path := range []string{"/oauth/discovery/keys", "/-/jwks"} {
		var set struct {
			Keys []map[string]string `json:"keys"`
		}
		res := doJSON(t, mustReq(t, "GET", hs.URL+path), &set)
		var got []string
		for _, k := range set.Keys {
			got = append(got, k["kid"]+"/"+k["n"])
		}
		if res.StatusCode != 200 || strings.Join(got, " ") != "a/1 shared/s b/2 /nokid" {
			t.Errorf("%s: %d, keys %v", path, res.StatusCode, got)
		}
	}
	var doc map[string]any
	doJSON(t, mustReq(t, "GET", hs.URL+"/.well-known/openid-configuration"), &doc)
	if doc["issuer"] != "https://gitlab.example.com" || doc["jwks_uri"] != "https://gitlab.example.com/oauth/discovery/keys" || doc["claims_supported"] == nil {
		t.Errorf("discovery document %v", doc)
	}
	waitMetrics(t, hs.URL, `berth_router_proxy_errors_total{cell="3"} 2`)
}

func mustReq(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestRouterNeverLogsTokens: at debug level, with requests routed,
// refused and failing, no token appears whole in the log.
func TestRouterNeverLogsTokens(t *testing.T) {
	c1, c2 := newFakeCell(t, 1), newFakeCell(t, 2)
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{Logger: log}, c1, c2)
	c2.srv.Close()
	toks := []string{routable(t, "glrt-t1_", 2), routable(t, "glpat-", 7), "glpat-notroutable0123456789", jobJWT(t, map[string]any{"c": "1"})}
	for _, tok := range toks {
		for _, req := range []*http.Request{
			mustReq(t, "GET", hs.URL+"/api/v4/projects?private_token="+tok),
			mustReq(t, "GET", hs.URL+"/api/v4/jobs/1/artifacts?job_token="+tok),
		} {
			req.Header.Set("JOB-TOKEN", tok)
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		}
	}
	out := logs.String()
	if !strings.Contains(out, "routing") || !strings.Contains(out, "cell did not answer") || !strings.Contains(out, "request refused") {
		t.Fatalf("the test logged less than it means to check:\n%s", out)
	}
	for _, tok := range toks {
		if strings.Contains(out, tok) || strings.Contains(out, tok[len(tok)/2:]) {
			t.Errorf("the log shows token %s:\n%s", tok, out)
		}
	}
}

func TestRouterConfigValidate(t *testing.T) {
	ok := []Cell{{ID: 1, URL: "http://127.0.0.1:8081"}, {ID: 2, URL: "https://cell2.internal/base"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // parts of the error; none: valid
	}{
		{"valid", Config{Cells: ok, DefaultCell: 2, ExternalURL: "https://gitlab.example.com"}, nil},
		{"valid without default", Config{Cells: ok}, nil},
		{"no cells", Config{}, []string{"no cells: give at least one (--cell ID=URL)"}},
		{"duplicate id", Config{Cells: []Cell{ok[0], {ID: 1, URL: "http://other"}}}, []string{"cell 1 listed twice"}},
		{"bad id", Config{Cells: []Cell{{ID: 0, URL: "http://x"}}}, []string{"cell 1 (http://x): id 0: want a positive integer"}},
		{"bad URLs", Config{Cells: []Cell{{ID: 1, URL: "127.0.0.1:8081"}, {ID: 2, URL: "ftp://x"}, {ID: 3, URL: "http://"}, {ID: 4, URL: "http://x/?a=b"}}},
			[]string{`cell 1: URL "127.0.0.1:8081"`, `cell 2: URL "ftp://x": want http:// or https://`, `cell 3: URL "http://": no host`, `cell 4: URL "http://x/?a=b": want no user, query or fragment`}},
		{"default not listed", Config{Cells: ok, DefaultCell: 3}, []string{"default cell 3 is not one of the cells (1, 2)"}},
		{"bad external URL", Config{Cells: ok, ExternalURL: "gitlab.example.com"}, []string{"external URL: "}},
		{"timeouts", Config{Cells: ok, HealthInterval: time.Second, HealthTimeout: 2 * time.Second, UnhealthyAfter: -1},
			[]string{"health timeout 2s is longer than the health interval 1s", "unhealthy after -1 failed checks"}},
		{"timeout longer than the default interval", Config{Cells: ok, HealthTimeout: 10 * time.Second},
			[]string{"health timeout 10s is longer than the health interval 5s"}},
		{"short interval, default timeout", Config{Cells: ok, HealthInterval: 100 * time.Millisecond}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate: nil")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %v\nlacks %q", err, w)
				}
			}
		})
	}
}

func TestRouterParseCells(t *testing.T) {
	cells, err := ParseCells("1=http://127.0.0.1:8081, 2=http://127.0.0.1:8082\n36=https://c36")
	if err != nil || len(cells) != 3 || cells[2] != (Cell{ID: 36, URL: "https://c36"}) {
		t.Fatalf("%v %v", cells, err)
	}
	for in, want := range map[string]string{
		"http://x":   `cell "http://x": want ID=URL, such as 1=http://127.0.0.1:8081`,
		"a=http://x": `cell "a=http://x": id "a" is not a positive integer`,
		"1=x":        `cell 1: URL "x": want http:// or https://`,
	} {
		if _, err := ParseCell(in); err == nil || err.Error() != want {
			t.Errorf("ParseCell(%q): %v, want %q", in, err, want)
		}
	}
}

// TestRouterClientGivesUpLongPoll: a client that leaves a held long poll
// is no error of the cell's: no 502, no proxy error, status 499 in the
// metrics; the cell sees the request end.
func TestRouterClientGivesUpLongPoll(t *testing.T) {
	c1 := newFakeCell(t, 1)
	held, ended := make(chan struct{}), make(chan struct{})
	c1.mux.HandleFunc("POST /api/v4/jobs/request", func(w http.ResponseWriter, r *http.Request) {
		// A server notices a client leave only once the body is read.
		io.ReadAll(r.Body)
		close(held)
		<-r.Context().Done()
		close(ended)
	})
	_, hs := routerOver(t, Config{DefaultCell: 1}, Options{}, c1)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/api/v4/jobs/request", strings.NewReader(`{"token":"x"}`))
	errc := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	<-held
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the abandoned poll got an answer")
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the cell's request did not end with the client's")
	}
	waitMetrics(t, hs.URL, `berth_router_requests_total{cell="1",code="499"} 1`)
	if m := scrape(t, hs.URL); strings.Contains(m, "berth_router_proxy_errors_total") {
		t.Errorf("a client leaving counted as a proxy error:\n%s", m)
	}
}

// TestRouterNeverOpensAStore: the router decides from tokens alone; no
// package of the coordinator, its store or its drivers is linked in.
func TestRouterNeverOpensAStore(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to list the router's dependencies: ", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", "github.com/berthci/berth/router").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/berthci/berth/coordinator") || strings.Contains(dep, "sqlite") ||
			strings.Contains(dep, "pgx") || dep == "database/sql" {
			t.Errorf("the router depends on %s", dep)
		}
	}
}

// TestRouterAsksForCredentials: without a default cell, a request without
// any token is answered 401 with a Basic challenge, so that a git client
// (which sends its credentials only after one) retries with them; a token
// that names no cell is 421.
func TestRouterAsksForCredentials(t *testing.T) {
	_, hs := routerOver(t, Config{}, Options{}, newFakeCell(t, 1))
	res, err := http.Get(hs.URL + "/group/app.git/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Fatalf("no credentials: %d, WWW-Authenticate %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}
	req, _ := http.NewRequest("GET", hs.URL+"/group/app.git/info/refs?service=git-upload-pack", nil)
	req.SetBasicAuth("gitlab-ci-token", token.NewJob())
	var e struct{ Message string }
	if res := doJSON(t, req, &e); res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a token naming no cell: %d %s", res.StatusCode, e.Message)
	}
	req, _ = http.NewRequest("GET", hs.URL+"/group/app.git/info/refs?service=git-upload-pack", nil)
	tok, _ := token.NewRoutable(token.PrefixPersonal, token.Routing{Cell: 1, Organization: 1})
	req.SetBasicAuth("admin", tok)
	var got echo
	if res := doJSON(t, req, &got); res.StatusCode != http.StatusOK || got.Cell != 1 {
		t.Fatalf("with credentials naming cell 1: %d %+v", res.StatusCode, got)
	}
}
