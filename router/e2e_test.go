package router_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/router"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// cells is two real coordinators (embedded, SQLite) behind a router,
// everything on loopback, each cell with an instance runner whose token
// is routable to it. The coordinator does not mint routable tokens yet:
// the test writes its runners into each cell's store itself.
type cells struct {
	url    string // the router's
	router *router.Router
	cell   map[int64]*embedded.Coordinator
	direct map[int64]string // each cell's own address
	runner map[int64]string // runner token by cell
	admin  map[int64]string // admin token by cell
}

func startCells(t *testing.T) *cells {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &cells{url: "http://" + rl.Addr().String(), cell: map[int64]*embedded.Coordinator{}, direct: map[int64]string{}, runner: map[int64]string{}, admin: map[int64]string{}}
	cfg := router.Config{DefaultCell: 1, ExternalURL: e.url, HealthInterval: 200 * time.Millisecond, HealthTimeout: 200 * time.Millisecond, UnhealthyAfter: 3}
	for _, id := range []int64{1, 2} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Every URL a cell hands out (CI_SERVER_URL, repositories, the ID
		// tokens' issuer) is the router's.
		c, err := embedded.Open(ctx, embedded.Options{DataDir: t.TempDir(), Listener: ln,
			Config: coordinator.Config{ExternalURL: e.url, LongPollTimeout: 20 * time.Second, CellID: id}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		e.admin[id], err = c.EnsureAdminToken(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		e.direct[id] = "http://" + ln.Addr().String()
		cfg.Cells = append(cfg.Cells, router.Cell{ID: id, URL: e.direct[id]})
		e.cell[id] = c
	}
	if e.router, err = router.New(cfg, router.Options{}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.router}
	served, ran := make(chan error, 1), make(chan error, 1)
	go func() { served <- srv.Serve(rl) }()
	go func() { ran <- e.router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("router server: %v", err)
		}
		<-ran
	})
	// Each cell's runner is created through the router with that cell's
	// admin token, which names its cell (the cells mint routable tokens).
	for _, id := range []int64{1, 2} {
		created, err := client.New(e.url, e.admin[id]).CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type",
			Description: "cell " + strconv.FormatInt(id, 10), RunUntagged: ptr(true)})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := token.ParseRoutable(created.Token); err != nil || r.Cell != id {
			t.Fatalf("cell %d minted runner token routing to %+v (%v)", id, r, err)
		}
		e.runner[id] = created.Token
	}
	return e
}

func ptr[T any](v T) *T { return &v }

type reply struct {
	code   int
	header http.Header
	body   []byte
}

func (e *cells) do(t *testing.T, method, path string, body io.Reader, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, b}
}

func jsonBody(t *testing.T, v any) io.Reader {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

func TestRouterCellsEndToEnd(t *testing.T) {
	e := startCells(t)
	ctx := context.Background()

	t.Run("runner endpoints reach the token's cell, body token included", func(t *testing.T) {
		for id, tok := range e.runner {
			// As gitlab-runner sends it: the token in the JSON body only.
			r := e.do(t, "POST", "/api/v4/runners/verify", jsonBody(t, runnerapi.VerifyRequest{Token: tok, SystemID: "s_0123456789ab"}), nil)
			if r.code != http.StatusOK || r.header.Get(router.HeaderCell) != strconv.FormatInt(id, 10) {
				t.Fatalf("verify of cell %d's runner: %d from cell %q: %s", id, r.code, r.header.Get(router.HeaderCell), r.body)
			}
		}
		// The other cell does not know the token: it did go to its own.
		r := e.do(t, "POST", "/api/v4/runners/verify", jsonBody(t, runnerapi.VerifyRequest{Token: e.runner[2]}), map[string]string{router.HeaderCell: "1"})
		if r.code != http.StatusOK || r.header.Get(router.HeaderCell) != "2" {
			t.Fatalf("X-Berth-Cell overrode the token's cell: %d from cell %q", r.code, r.header.Get(router.HeaderCell))
		}
	})

	var job runnerapi.JobResponse
	t.Run("a long poll through the router gets a job enqueued on its cell", func(t *testing.T) {
		poll := func(tok, lastUpdate string) reply {
			return e.do(t, "POST", "/api/v4/jobs/request", jsonBody(t, runnerapi.JobRequest{Token: tok, SystemID: "s_0123456789ab", LastUpdate: lastUpdate,
				Info: &runnerapi.Info{Name: "gitlab-runner", Features: runnerapi.Features{TraceReset: true}}}), nil)
		}
		first := poll(e.runner[2], "")
		if first.code != http.StatusNoContent {
			t.Fatalf("first poll: %d %s", first.code, first.body)
		}
		var enqueued atomic.Bool
		go func() {
			time.Sleep(300 * time.Millisecond)
			enqueued.Store(true)
			if _, err := e.cell[2].Enqueue(ctx, dispatch.JobSpec{Name: "on-cell-2", ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}}); err != nil {
				t.Error(err)
			}
		}()
		held := poll(e.runner[2], first.header.Get(runnerapi.HeaderLastUpdate))
		if held.code != http.StatusCreated || !enqueued.Load() {
			t.Fatalf("held poll: %d (enqueued: %v) %s", held.code, enqueued.Load(), held.body)
		}
		if err := json.Unmarshal(held.body, &job); err != nil || job.JobInfo.Name != "on-cell-2" || job.Token == "" {
			t.Fatalf("job %+v, %v", job.JobInfo, err)
		}
		// Cell 1's runner does not see cell 2's queue.
		if r := poll(e.runner[1], ""); r.code != http.StatusNoContent || r.header.Get(router.HeaderCell) != "1" {
			t.Fatalf("cell 1's runner: %d from cell %q %s", r.code, r.header.Get(router.HeaderCell), r.body)
		}
	})
	if job.ID == 0 {
		t.Fatal("no job handed out")
	}

	t.Run("an artifact upload passes intact", func(t *testing.T) {
		// The job token names its cell: nothing else is needed.
		hdr := map[string]string{runnerapi.HeaderJobToken: job.Token}
		data := bytes.Repeat([]byte("artifact bytes\x00\xff"), 200<<10) // 3.2 MB
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "artifacts.zip")
		fw.Write(data)
		mw.Close()
		hdr["Content-Type"] = mw.FormDataContentType()
		path := "/api/v4/jobs/" + strconv.FormatInt(job.ID, 10) + "/artifacts"
		if r := e.do(t, "POST", path+"?artifact_format=zip&artifact_type=archive", &body, hdr); r.code != http.StatusCreated {
			t.Fatalf("upload: %d %s", r.code, r.body)
		}
		delete(hdr, "Content-Type")
		r := e.do(t, "GET", path, nil, hdr)
		if r.code != http.StatusOK || !bytes.Equal(r.body, data) {
			t.Fatalf("download: %d, %d bytes back of %d", r.code, len(r.body), len(data))
		}
	})

	t.Run("ID token keys merged from both cells", func(t *testing.T) {
		kids := func(base string) []string {
			res, err := http.Get(base + "/oauth/discovery/keys")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var set struct {
				Keys []struct {
					Kid string `json:"kid"`
				} `json:"keys"`
			}
			if err := json.NewDecoder(res.Body).Decode(&set); err != nil || res.StatusCode != 200 {
				t.Fatalf("%s: %d %v", base, res.StatusCode, err)
			}
			var out []string
			for _, k := range set.Keys {
				out = append(out, k.Kid)
			}
			return out
		}
		want := append(kids(e.direct[1]), kids(e.direct[2])...)
		got := kids(e.url)
		if len(want) < 2 || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("router's kids %v, cells' %v", got, want)
		}
		var doc map[string]any
		r := e.do(t, "GET", "/.well-known/openid-configuration", nil, nil)
		if err := json.Unmarshal(r.body, &doc); err != nil || doc["issuer"] != e.url || doc["jwks_uri"] != e.url+"/oauth/discovery/keys" {
			t.Fatalf("discovery: %d %s", r.code, r.body)
		}
	})

	t.Run("metrics per cell", func(t *testing.T) {
		wants := []string{
			`berth_router_requests_total{cell="1",code="200"}`, `berth_router_requests_total{cell="2",code="201"} 3`,
			`berth_router_routes_total{by="body",cell="2"}`, `berth_router_routes_total{by="job_token",cell="2"}`,
			`berth_router_routes_total{by="private_token",cell="1"}`, `berth_router_routes_total{by="private_token",cell="2"}`,
			`berth_router_cell_up{cell="1"} 1`, `berth_router_cell_up{cell="2"} 1`,
		}
		// A request is counted once answered, which may be just after
		// its client has the answer.
		var m string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			m = string(e.do(t, "GET", "/-/metrics", nil, nil).body)
			all := true
			for _, w := range wants {
				all = all && strings.Contains(m, w)
			}
			if all {
				return
			}
		}
		for _, w := range wants {
			if !strings.Contains(m, w) {
				t.Errorf("metrics lack %s", w)
			}
		}
	})

	t.Run("a stopped cell's requests get 503, the other cell's go on", func(t *testing.T) {
		if err := e.cell[2].Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); e.router.Healthy(2); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("cell 2 still healthy 10 s after it stopped")
			}
		}
		r := e.do(t, "POST", "/api/v4/runners/verify", jsonBody(t, runnerapi.VerifyRequest{Token: e.runner[2]}), nil)
		if r.code != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "cell 2 is unavailable") {
			t.Fatalf("cell 2 stopped: %d %s", r.code, r.body)
		}
		if r := e.do(t, "POST", "/api/v4/runners/verify", jsonBody(t, runnerapi.VerifyRequest{Token: e.runner[1]}), nil); r.code != http.StatusOK {
			t.Fatalf("cell 1: %d %s", r.code, r.body)
		}
		if r := e.do(t, "GET", "/oauth/discovery/keys", nil, nil); r.code != http.StatusOK || r.header.Get(router.HeaderCell) != "" {
			t.Fatalf("JWKS with one cell down: %d %s", r.code, r.body)
		}
	})
}
