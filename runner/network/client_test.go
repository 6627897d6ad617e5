package network

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/runnerapi"
)

func testClient() *Client {
	return New(Options{Backoff: Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond, Factor: 2}, Version: "1.2.3"})
}

func jsonReply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func TestHeadersOnEveryRequest(t *testing.T) {
	var got http.Header
	var body runnerapi.VerifyRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		if r.URL.Path != "/gitlab/api/v4/runners/verify" {
			t.Errorf("path %s", r.URL.Path)
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		jsonReply(w, 200, runnerapi.RunnerTokenResponse{ID: 9, Token: "glrt-x"})
	}))
	defer srv.Close()
	out, err := testClient().Verify(context.Background(), RunnerCredentials{URL: srv.URL + "/gitlab/ci/", Token: "glrt-x"}, "s_123456789012", &runnerapi.Info{Name: "n"})
	if err != nil || out.ID != 9 {
		t.Fatalf("%+v %v", out, err)
	}
	if ua := got.Get("User-Agent"); !strings.HasPrefix(ua, "gitlab-runner 1.2.3 (berth; go") {
		t.Errorf("User-Agent %q", ua)
	}
	if id := got.Get("X-Request-Id"); len(id) != 32 || strings.Contains(id, "-") {
		t.Errorf("X-Request-Id %q", id)
	}
	if got.Get("Accept") != "application/json" || got.Get("Content-Type") != "application/json" || got.Get("RUNNER-TOKEN") != "glrt-x" {
		t.Errorf("headers %v", got)
	}
	if body.Token != "glrt-x" || body.SystemID != "s_123456789012" || body.Info == nil {
		t.Errorf("body %+v", body)
	}
}

func TestNonJSONSuccessIsRejected(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, "<html>proxy login</html>")
	}))
	defer srv.Close()
	_, err := testClient().RequestJob(context.Background(), RunnerCredentials{URL: srv.URL, Token: "t"}, "s", nil)
	if !errors.Is(err, ErrNotJSON) {
		t.Fatalf("err %v, want ErrNotJSON", err)
	}
	// Old GitLab answers verify with plain text 200: tolerated.
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "200")
	}))
	defer srv2.Close()
	if _, err := testClient().Verify(context.Background(), RunnerCredentials{URL: srv2.URL, Token: "t"}, "s", nil); err != nil {
		t.Fatalf("plain-text verify: %v", err)
	}
}

func TestRetriesHonourRetryAfterAndStopAtFive(t *testing.T) {
	var n atomic.Int32
	var times []time.Time
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		switch n.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "1")
			jsonReply(w, 429, map[string]string{"message": "slow down"})
		case 2:
			jsonReply(w, 502, map[string]string{"message": "bad gateway"})
		default:
			w.Header().Set(runnerapi.HeaderLastUpdate, "v1")
			w.WriteHeader(204)
		}
	}))
	defer srv.Close()
	c := testClient()
	job, err := c.RequestJob(context.Background(), RunnerCredentials{URL: srv.URL, Token: "t"}, "s", nil)
	if err != nil || job != nil || n.Load() != 3 {
		t.Fatalf("job %v err %v after %d attempts", job, err, n.Load())
	}
	// Retry-After: 1 means the second attempt came at least a second after
	// the first (a lower bound, not a timing assertion on speed).
	if d := times[1].Sub(times[0]); d < time.Second {
		t.Errorf("second attempt %v after the first; Retry-After asked for 1s", d)
	}

	n.Store(0)
	always := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		jsonReply(w, 503, map[string]string{"message": "down"})
	}))
	defer always.Close()
	_, err = c.RequestJob(context.Background(), RunnerCredentials{URL: always.URL, Token: "t"}, "s", nil)
	if !errors.Is(err, ErrServer) || n.Load() != 5 {
		t.Fatalf("err %v after %d attempts, want ErrServer after 5", err, n.Load())
	}
	var se *StatusError
	if !errors.As(err, &se) || se.Message != "down" {
		t.Fatalf("status error %+v", se)
	}
}

func TestNoRetryOnClientErrors(t *testing.T) {
	for _, tc := range []struct {
		code int
		want error
	}{{403, ErrForbidden}, {409, ErrConflict}, {422, ErrOrphaned}, {400, ErrBadRequest}} {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			jsonReply(w, tc.code, map[string]string{"message": "no"})
		}))
		_, err := testClient().RequestJob(context.Background(), RunnerCredentials{URL: srv.URL, Token: "t"}, "s", nil)
		srv.Close()
		if !errors.Is(err, tc.want) || n.Load() != 1 {
			t.Errorf("%d: err %v after %d attempts", tc.code, err, n.Load())
		}
	}
}

func TestLastUpdateEchoedPerRunner(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req runnerapi.JobRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		seen[req.Token] = append(seen[req.Token], req.LastUpdate)
		mu.Unlock()
		w.Header().Set(runnerapi.HeaderLastUpdate, "v-"+req.Token)
		w.WriteHeader(204) // no body, no Content-Type: what Workhorse answers
	}))
	defer srv.Close()
	c := testClient()
	a, b := RunnerCredentials{URL: srv.URL, Token: "a"}, RunnerCredentials{URL: srv.URL, Token: "b"}
	for _, rc := range []RunnerCredentials{a, a, b} {
		if _, err := c.RequestJob(context.Background(), rc, "s", nil); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(seen["a"], ",") != ",v-a" || strings.Join(seen["b"], ",") != "" {
		t.Fatalf("last_update sent: %v", seen)
	}
}

func TestUpdateAndPatchResults(t *testing.T) {
	type answer struct {
		code   int
		header map[string]string
	}
	var next answer
	var lastHeader http.Header
	var lastBody []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastHeader = r.Header.Clone()
		lastBody, _ = io.ReadAll(r.Body)
		for k, v := range next.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(next.code)
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	c := testClient()
	jc := JobCredentials{URL: srv.URL, ID: 7, Token: "glcbt-job"}
	ctx := context.Background()

	next = answer{200, map[string]string{"Job-Status": "running", "X-GitLab-Trace-Update-Interval": "7"}}
	res, err := c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "running"})
	if err != nil || res.State != StateOK || res.TraceUpdateInterval != 7*time.Second || lastHeader.Get("JOB-TOKEN") != "glcbt-job" ||
		!strings.Contains(string(lastBody), `"token":"glcbt-job"`) {
		t.Fatalf("%+v %v %s", res, err, lastBody)
	}
	next = answer{200, map[string]string{"Job-Status": "canceling"}}
	if res, _ = c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "running"}); res.State != StateCancel {
		t.Fatalf("canceling: %+v", res)
	}
	for _, st := range []string{"canceled", "failed"} {
		next = answer{200, map[string]string{"Job-Status": st}}
		if res, _ = c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "running"}); res.State != StateAbort {
			t.Fatalf("%s: %+v", st, res)
		}
	}
	next = answer{403, nil}
	if res, err = c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "success"}); err != nil || res.State != StateAbort {
		t.Fatalf("403: %+v %v", res, err)
	}
	next = answer{202, nil}
	if res, _ = c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "success"}); !res.Accepted {
		t.Fatalf("202: %+v", res)
	}
	next = answer{412, nil}
	if res, _ = c.UpdateJob(ctx, jc, runnerapi.UpdateJobRequest{State: "success"}); !res.TraceReset {
		t.Fatalf("412: %+v", res)
	}

	next = answer{202, map[string]string{"Range": "0-15"}}
	pr, err := c.PatchTrace(ctx, jc, 10, []byte("hello"), false)
	if err != nil || !pr.RangeOK || pr.Offset != 15 || lastHeader.Get("Content-Range") != "10-14" || lastHeader.Get("Content-Type") != "text/plain" {
		t.Fatalf("%+v %v %v", pr, err, lastHeader)
	}
	next = answer{416, map[string]string{"Range": "0-3"}}
	if pr, err = c.PatchTrace(ctx, jc, 10, []byte("x"), false); err != nil || !pr.RangeMismatch || pr.Offset != 3 {
		t.Fatalf("416: %+v %v", pr, err)
	}
	next = answer{416, nil}
	if _, err = c.PatchTrace(ctx, jc, 10, []byte("x"), false); err == nil {
		t.Fatal("416 without Range accepted")
	}
	next = answer{404, nil}
	if pr, _ = c.PatchTrace(ctx, jc, 0, []byte("x"), false); !pr.Gone || pr.State != StateAbort {
		t.Fatalf("404: %+v", pr)
	}
}

func TestArtifactUploadFollows307AndDownloadDropsTokenOnRedirect(t *testing.T) {
	var storageHeader http.Header
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		storageHeader = r.Header.Clone()
		_, _ = io.WriteString(w, "zipbytes")
	}))
	defer storage.Close()
	var uploads atomic.Int32
	var gotFile string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/api/v4/jobs/3/artifacts":
			uploads.Add(1)
			w.Header().Set("Location", "/upload-here?x=1")
			w.WriteHeader(307)
		case r.Method == "POST" && r.URL.Path == "/upload-here":
			f, hdr, err := r.FormFile("file")
			if err != nil || hdr.Filename != "out.zip" || r.Header.Get("JOB-TOKEN") != "glcbt-t" {
				t.Errorf("upload: %v %v", err, hdr)
				w.WriteHeader(400)
				return
			}
			b, _ := io.ReadAll(f)
			gotFile = string(b)
			w.WriteHeader(201)
		case r.Method == "GET":
			http.Redirect(w, r, storage.URL+"/obj", http.StatusFound)
		}
	}))
	defer srv.Close()
	c := testClient()
	jc := JobCredentials{URL: srv.URL, ID: 3, Token: "glcbt-t"}
	err := c.UploadArtifact(context.Background(), jc, func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader("content")), nil
	}, ArtifactOptions{Name: "out.zip", Type: "archive", Format: "zip", ExpireIn: "1 week"})
	if err != nil || gotFile != "content" || uploads.Load() != 1 {
		t.Fatalf("upload %v %q %d", err, gotFile, uploads.Load())
	}
	rc, err := c.DownloadArtifact(context.Background(), jc)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "zipbytes" || storageHeader.Get("JOB-TOKEN") != "" {
		t.Fatalf("download %q; object storage saw JOB-TOKEN %q", b, storageHeader.Get("JOB-TOKEN"))
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://gitlab.example.com":      "https://gitlab.example.com/api/v4/",
		"https://gitlab.example.com/":     "https://gitlab.example.com/api/v4/",
		"https://gitlab.example.com/ci":   "https://gitlab.example.com/api/v4/",
		"https://h/sub/gitlab/ci/":        "https://h/sub/gitlab/api/v4/",
		"http://127.0.0.1:8080/anything/": "http://127.0.0.1:8080/anything/api/v4/",
	} {
		if got := BaseURL(in); got != want {
			t.Errorf("BaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// connection_max_age: idle connections are reused until the age passed,
// then closed, so the next request opens a new one; 0 keeps them.
func TestConnectionMaxAge(t *testing.T) {
	var mu sync.Mutex
	conns := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		jsonReply(w, 200, runnerapi.RunnerTokenResponse{ID: 9, Token: "glrt-x"})
	}))
	defer srv.Close()
	opened := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
	for _, c := range []struct {
		maxAge time.Duration
		want   int
	}{{time.Minute, 2}, {0, 1}, {time.Hour, 1}} {
		clear(conns)
		now := time.Unix(1_800_000_000, 0)
		cl := New(Options{Version: "1", ConnectionMaxAge: c.maxAge, Now: func() time.Time { return now },
			HTTPClient: &http.Client{Transport: &http.Transport{}}})
		verify := func() {
			t.Helper()
			if _, err := cl.Verify(context.Background(), RunnerCredentials{URL: srv.URL, Token: "glrt-x"}, "s_123456789012", nil); err != nil {
				t.Fatal(err)
			}
		}
		verify()
		verify() // within the age: the same connection
		if opened() != 1 {
			t.Fatalf("max age %s: %d connections for two requests in a row", c.maxAge, opened())
		}
		now = now.Add(2 * time.Minute)
		verify()
		if got := opened(); got != c.want {
			t.Errorf("max age %s: %d connections after 2 minutes, want %d", c.maxAge, got, c.want)
		}
	}
}
