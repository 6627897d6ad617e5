package helper

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/runner/network"
)

// In a job's environment the helper trusts the coordinator's authority
// that CI_SERVER_TLS_CA_FILE names, as the runner does: without it the
// download is refused for the certificate, with it the archive arrives.
func TestHelperTrustsTheJobsCAFile(t *testing.T) {
	var zipped bytes.Buffer
	zw := zip.NewWriter(&zipped)
	w, _ := zw.Create("out.txt")
	_, _ = w.Write([]byte("from-tls"))
	_ = zw.Close()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v4/jobs/7/artifacts" || r.Header.Get("JOB-TOKEN") != "glcbt-x" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(zipped.Bytes())
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"artifacts-download", "--url", srv.URL, "--id", "7", "--token", "glcbt-x", "--dir", dir}
	var out, errOut bytes.Buffer
	t.Setenv(network.TLSCAFileVariable, "")
	if code := Run(context.Background(), args, &out, &errOut, nil, "test"); code == 0 || !strings.Contains(errOut.String(), "certificate") {
		t.Fatalf("without the CA file: exit %d, %s", code, errOut.String())
	}
	t.Setenv(network.TLSCAFileVariable, ca)
	errOut.Reset()
	if code := Run(context.Background(), args, &out, &errOut, nil, "test"); code != 0 {
		t.Fatalf("with the CA file: exit %d, %s", code, errOut.String())
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(b) != "from-tls" {
		t.Errorf("extracted %q %v", b, err)
	}
}
