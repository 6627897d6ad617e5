package githost

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// Fetches are served by git upload-pack without http-backend: every
// protocol version git speaks clones and fetches shallowly, and the
// cached v2 advertisement stays right after pushes.
func TestUploadPackProtocols(t *testing.T) {
	e := newHostEnv(t)
	e.createProject(t, "demo")
	e.pushFiles(t, "demo", "main", map[string]string{"a.txt": "one"}, "-o", "ci.skip")
	remote := e.http.URL + "/demo.git"
	for _, v := range []string{"0", "1", "2"} {
		t.Run("protocol v"+v, func(t *testing.T) {
			dir := t.TempDir()
			testenv.Git(t, dir, testenv.GitBasicAuth("x", e.admin), "-c", "protocol.version="+v, "clone", "-q", "--depth", "1", remote, "c")
			out, err := testenv.GitOutput(dir+"/c", nil, "show", "HEAD:a.txt")
			if err != nil || strings.TrimSpace(out) != "one" {
				t.Fatalf("a.txt after a v%s clone: %q (%v)", v, out, err)
			}
		})
	}
	// A v2 client fetching after a push sees the new commit (the
	// advertisement is cached, the refs are not).
	dir := t.TempDir()
	testenv.Git(t, dir, testenv.GitBasicAuth("x", e.admin), "-c", "protocol.version=2", "clone", "-q", remote, "c")
	e.pushFiles(t, "demo", "main", map[string]string{"a.txt": "two"}, "-o", "ci.skip")
	testenv.Git(t, dir+"/c", testenv.GitBasicAuth("x", e.admin), "-c", "protocol.version=2", "fetch", "-q", "--depth", "5", "origin")
	if out, err := testenv.GitOutput(dir+"/c", nil, "show", "FETCH_HEAD:a.txt"); err != nil || strings.TrimSpace(out) != "two" {
		t.Fatalf("a.txt after fetching the second push: %q (%v)", out, err)
	}
}

func TestUploadPackRequests(t *testing.T) {
	e := newHostEnv(t)
	e.createProject(t, "demo")
	e.pushFiles(t, "demo", "main", map[string]string{"a.txt": "one"}, "-o", "ci.skip")
	post := func(ct, enc string, body []byte) (int, string) {
		rq, _ := http.NewRequest("POST", e.http.URL+"/demo.git/git-upload-pack", bytes.NewReader(body))
		rq.SetBasicAuth("x", e.admin)
		rq.Header.Set("Content-Type", ct)
		rq.Header.Set("Git-Protocol", "version=2")
		if enc != "" {
			rq.Header.Set("Content-Encoding", enc)
		}
		res, err := e.http.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		return res.StatusCode, b.String()
	}
	// ls-refs, plain and gzipped, as git sends it.
	lsRefs := []byte("0014command=ls-refs\n00010009peel\n0000")
	const ct = "application/x-git-upload-pack-request"
	if code, body := post(ct, "", lsRefs); code != http.StatusOK || !strings.Contains(body, "refs/heads/main") {
		t.Errorf("ls-refs: %d %q, want 200 listing refs/heads/main", code, body)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(lsRefs)
	zw.Close()
	if code, body := post(ct, "gzip", gz.Bytes()); code != http.StatusOK || !strings.Contains(body, "refs/heads/main") {
		t.Errorf("gzipped ls-refs: %d %q, want 200 listing refs/heads/main", code, body)
	}
	if code, _ := post("text/plain", "", lsRefs); code != http.StatusForbidden {
		t.Errorf("wrong content type: %d, want 403", code)
	}
	if code, _ := post(ct, "gzip", []byte("not gzip")); code != http.StatusBadRequest {
		t.Errorf("broken gzip: %d, want 400", code)
	}
	// The advertisement answers with git's cache headers and content type.
	rq, _ := http.NewRequest("GET", e.http.URL+"/demo.git/info/refs?service=git-upload-pack", nil)
	rq.SetBasicAuth("x", e.admin)
	rq.Header.Set("Git-Protocol", "version=2")
	for range 2 { // the second from the cache
		res, err := e.http.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		res.Body.Close()
		if res.Header.Get("Content-Type") != "application/x-git-upload-pack-advertisement" || res.Header.Get("Cache-Control") == "" ||
			!strings.HasPrefix(b.String(), "000eversion 2\n") || !strings.Contains(b.String(), "ls-refs") {
			t.Errorf("v2 advertisement: %v %q", res.Header, b.String())
		}
	}
	// Other Git-Protocol values are answered, not cached: the client
	// chooses them, and the cache must not grow with them.
	for i := range 3 {
		rq.Header.Set("Git-Protocol", fmt.Sprintf("version=2:x-%d=1", i))
		res, err := e.http.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		res.Body.Close()
		if !strings.HasPrefix(b.String(), "000eversion 2\n") {
			t.Errorf("v2 advertisement for %s: %q", rq.Header.Get("Git-Protocol"), b.String())
		}
	}
	if n := len(e.h.ads.ads); n != 1 {
		t.Errorf("%d cached advertisements, want 1 (the plain version=2 one)", n)
	}
}

func TestGitProtocolHeader(t *testing.T) {
	for in, want := range map[string]string{
		"version=2":                      "version=2",
		"version=2:object-format=sha256": "version=2:object-format=sha256",
		"version=2\nX=1":                 "",
		"version=2 ; rm":                 "",
		strings.Repeat("a", 300):         "",
	} {
		r, _ := http.NewRequest("GET", "/", nil)
		r.Header["Git-Protocol"] = []string{in}
		if got := gitProtocol(r); got != want {
			t.Errorf("gitProtocol(%q) = %q, want %q", in, got, want)
		}
	}
	if !wantsV2("version=2") || !wantsV2("object-format=sha1:version=2") || wantsV2("version=1") || wantsV2("") {
		t.Error("wantsV2")
	}
}
