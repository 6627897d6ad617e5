package helper

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/network"
)

// TestArtifactsDownloadAgainAfterABrokenBody: a transfer cut mid-body
// (found by berth chaos: a reset connection failed the job) is downloaded
// again; a 404 is not.
func TestArtifactsDownloadAgainAfterABrokenBody(t *testing.T) {
	src := t.TempDir()
	testenv.WriteFiles(t, src, map[string]string{"out/a.txt": strings.Repeat("artifact ", 5000)})
	var archive bytes.Buffer
	if _, err := CreateZip(&archive, src, []string{"out/", "out/a.txt"}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if strings.Contains(r.URL.Path, "/jobs/404/") {
			http.Error(w, `{"message":"404 Not Found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(archive.Len()))
		if n == 1 {
			w.Write(archive.Bytes()[:archive.Len()/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks off mid-body
		}
		w.Write(archive.Bytes())
	}))
	defer srv.Close()
	c := network.New(network.Options{MaxAttempts: 1})
	dst := t.TempDir()
	var out bytes.Buffer
	err := ArtifactsDownload(context.Background(), &out, c, network.JobCredentials{URL: srv.URL, ID: 7, Token: "glcbt-x"}, dst)
	if err != nil {
		t.Fatalf("download: %v\n%s", err, out.String())
	}
	if calls.Load() != 2 || !strings.Contains(out.String(), "downloading again (attempt 2 of 3)") {
		t.Errorf("%d requests, output %q: want a second download after the broken one", calls.Load(), out.String())
	}
	if b, err := os.ReadFile(filepath.Join(dst, "out/a.txt")); err != nil || len(b) != 5000*len("artifact ") {
		t.Errorf("extracted %d bytes, %v", len(b), err)
	}
	calls.Store(0)
	if err := ArtifactsDownload(context.Background(), &out, c, network.JobCredentials{URL: srv.URL, ID: 404, Token: "glcbt-x"}, dst); err == nil || calls.Load() != 1 {
		t.Errorf("missing artifact: %v after %d requests, want one failed request", err, calls.Load())
	}
}
