// Package includetest serves include:remote files for tests: a real HTTPS
// server whose CA is written to a PEM file the coordinator is told to
// trust.
package includetest

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// Server serves:
//   - /ci/remote.yml: Body (a job named remote-job at first), counting Hits;
//   - /big.yml: a file of more than BigBytes;
//   - /slow.yml: nothing until the test ends;
//   - /redirect.yml: a redirect to /ci/remote.yml over plain HTTP.
type Server struct {
	*httptest.Server
	// CAFile holds the server's certificate, PEM encoded.
	CAFile string
	Hits   atomic.Int64
	Body   atomic.Value // string
}

// BigBytes is the least size of /big.yml.
const BigBytes = 1 << 20

// NewServer starts a Server, closed when t ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	rs := &Server{}
	rs.Body.Store("remote-job:\n  stage: test\n  script: [remote]\n")
	mux := http.NewServeMux()
	mux.HandleFunc("/ci/remote.yml", func(w http.ResponseWriter, r *http.Request) {
		rs.Hits.Add(1)
		w.Write([]byte(rs.Body.Load().(string)))
	})
	mux.HandleFunc("/big.yml", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("a: " + strings.Repeat("x", BigBytes+10) + "\n"))
	})
	// /slow.yml answers nothing until the test ends, whatever happens to
	// the request: once in a run under the race detector the handler saw
	// its request's context end early, answered 200 with an empty body,
	// and a fetch meant to time out succeeded.
	slow := make(chan struct{})
	mux.HandleFunc("/slow.yml", func(w http.ResponseWriter, r *http.Request) {
		<-slow
		panic(http.ErrAbortHandler) // no answer at all
	})
	mux.HandleFunc("/redirect.yml", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+r.Host+"/ci/remote.yml", http.StatusFound)
	})
	rs.Server = httptest.NewTLSServer(mux)
	t.Cleanup(rs.Close)
	t.Cleanup(func() { close(slow) }) // before Close, which waits for handlers
	rs.CAFile = filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rs.Certificate().Raw})
	if err := os.WriteFile(rs.CAFile, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return rs
}
