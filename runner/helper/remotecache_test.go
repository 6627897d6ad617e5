package helper

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// fakeBucket is a pure-unit stand-in for pre-signed S3 URLs: objects by
// path, a refusal by path, and what each PUT looked like. The real
// server's tests are in runner/cache and the runner's end-to-end tests.
type fakeBucket struct {
	mu      sync.Mutex
	objects map[string][]byte
	refuse  map[string]int
	puts    []*http.Request
}

func newFakeBucket(t *testing.T) (*fakeBucket, *httptest.Server) {
	b := &fakeBucket{objects: map[string][]byte{}, refuse: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if code := b.refuse[r.URL.Path]; code != 0 {
			w.WriteHeader(code)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied.</Message></Error>`)
			return
		}
		switch r.Method {
		case http.MethodGet:
			body, ok := b.objects[r.URL.Path]
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `<Error><Code>NoSuchKey</Code></Error>`)
				return
			}
			w.Write(body)
		case http.MethodPut:
			body, _ := io.ReadAll(r.Body)
			b.objects[r.URL.Path] = body
			b.puts = append(b.puts, r)
		}
	}))
	t.Cleanup(srv.Close)
	return b, srv
}

const sig = "X-Amz-Signature=0123456789abcdef-secret-signature"

func TestRemoteCacheRoundTripAndFallback(t *testing.T) {
	b, srv := newFakeBucket(t)
	src := t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"vendor/dep.txt": "dependency", "vendor/sub/x": "x", "other.txt": "no"})
	var out bytes.Buffer
	put := srv.URL + "/bucket/project/1/fallback-non_protected?" + sig
	if err := (RemoteCache{}).Archive(context.Background(), &out, put, "fallback-non_protected", src, Selection{Paths: []string{"vendor/"}}, 0); err != nil {
		t.Fatal(err)
	}
	if len(b.puts) != 1 || b.puts[0].ContentLength <= 0 || len(b.puts[0].TransferEncoding) != 0 || b.puts[0].Header.Get("Content-Type") != "application/zip" {
		t.Fatalf("PUT %+v: a pre-signed PUT needs a Content-Length, not a chunked body", b.puts)
	}
	if !strings.Contains(out.String(), "Uploaded cache fallback-non_protected") {
		t.Errorf("log: %s", out.String())
	}

	dst := t.TempDir()
	out.Reset()
	urls := []string{srv.URL + "/bucket/project/1/main-non_protected?" + sig, put}
	if err := (RemoteCache{}).Extract(context.Background(), &out, urls, []string{"main-non_protected", "fallback-non_protected"}, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "vendor/dep.txt")); string(got) != "dependency" {
		t.Fatalf("extracted %q", got)
	}
	if _, err := os.Stat(filepath.Join(dst, "other.txt")); err == nil {
		t.Error("a file outside the cache's paths was archived")
	}
	for _, want := range []string{"No cache found for main-non_protected", "Using fallback cache fallback-non_protected", "Downloaded and extracted cache"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRemoteCacheMissingIsAWarningNotAFailure(t *testing.T) {
	_, srv := newFakeBucket(t)
	var out bytes.Buffer
	err := (RemoteCache{}).Extract(context.Background(), &out, []string{srv.URL + "/b/k?" + sig, srv.URL + "/b/f?" + sig}, nil, t.TempDir())
	if err != nil || !strings.Contains(out.String(), "WARNING: Cache not found") {
		t.Fatalf("%v\n%s", err, out.String())
	}
}

// Refusals and network errors fail the command (the job script turns
// that into a warning) and never carry the URL's signature to the log.
func TestRemoteCacheErrorsHideTheSignature(t *testing.T) {
	b, srv := newFakeBucket(t)
	b.refuse["/b/denied"] = http.StatusForbidden
	src := t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"vendor/a": strings.Repeat("a", 4096)})
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	check := func(what string, err error, out string, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error()+out, want) {
			t.Errorf("%s: %v\n%s\nwant a failure saying %q", what, err, out, want)
		}
		for _, s := range []string{err.Error(), out} {
			if strings.Contains(s, "secret-signature") {
				t.Errorf("%s: the signature reached the log: %s", what, s)
			}
		}
	}
	var out bytes.Buffer
	err := (RemoteCache{}).Extract(context.Background(), &out, []string{srv.URL + "/b/denied?" + sig}, []string{"k"}, t.TempDir())
	check("denied GET", err, out.String(), "403 Forbidden (AccessDenied: Access Denied.)")
	out.Reset()
	err = (RemoteCache{}).Extract(context.Background(), &out, []string{dead.URL + "/b/k?" + sig}, nil, t.TempDir())
	check("GET to a dead server", err, out.String(), "GET "+dead.URL+"/b/k")
	out.Reset()
	err = (RemoteCache{}).Archive(context.Background(), &out, srv.URL+"/b/denied?"+sig, "k", src, Selection{Paths: []string{"vendor"}}, 0)
	check("denied PUT", err, out.String(), "AccessDenied")
	out.Reset()
	err = (RemoteCache{}).Archive(context.Background(), &out, dead.URL+"/b/k?"+sig, "k", src, Selection{Paths: []string{"vendor"}}, 0)
	check("PUT to a dead server", err, out.String(), "PUT "+dead.URL+"/b/k")
	out.Reset()
	err = (RemoteCache{}).Archive(context.Background(), &out, srv.URL+"/b/big?"+sig, "k", src, Selection{Paths: []string{"vendor"}}, 100)
	check("over MaxUploadedArchiveSize", err, out.String(), "over MaxUploadedArchiveSize (100); not uploaded")
	if _, ok := b.objects["/b/big"]; ok {
		t.Error("an archive over the limit was uploaded")
	}
}

// The command line: URLs come from --url or, in a job script, from
// $BERTH_CACHE_URLS, one a line.
func TestCacheCommandsWithURLs(t *testing.T) {
	b, srv := newFakeBucket(t)
	src, dst := t.TempDir(), t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"deps/x": "x"})
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"cache-archive", "--dir", src, "--path", "deps", "--key", "k", "--url", srv.URL + "/b/k?" + sig}, &out, &errOut, nil, "test"); code != 0 {
		t.Fatalf("cache-archive --url: %d %s", code, errOut.String())
	}
	t.Setenv(CacheURLsEnv, srv.URL+"/b/missing?"+sig+"\n"+srv.URL+"/b/k?"+sig+"\n")
	if code := Run(context.Background(), []string{"cache-extract", "--dir", dst, "--key", "missing", "--key", "k"}, &out, &errOut, nil, "test"); code != 0 {
		t.Fatalf("cache-extract from $%s: %d %s", CacheURLsEnv, code, errOut.String())
	}
	if _, err := os.Stat(filepath.Join(dst, "deps/x")); err != nil {
		t.Fatalf("not extracted: %v\n%s", err, out.String())
	}
	if code := Run(context.Background(), []string{"cache-extract", "--dir", dst, "--file", "/x", "--url", srv.URL}, &out, &errOut, nil, "test"); code != 1 {
		t.Errorf("--file and --url together: exit %d, want 1", code)
	}
	if len(b.puts) != 1 {
		t.Errorf("%d uploads", len(b.puts))
	}
}
