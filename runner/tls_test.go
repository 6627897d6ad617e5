package runner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// tlsFront serves the coordinator (and a git repository at /git/) over
// HTTPS with a certificate of its own authority, as a GitLab behind an
// internal CA; it returns its URL and the authority's PEM file.
func tlsFront(t *testing.T, coordinatorURL string, git http.Handler) (string, string) {
	t.Helper()
	u, err := url.Parse(coordinatorURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/git/") {
			git.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return hs.URL, ca
}

// TestTLSCAFile: an entry whose coordinator's certificate comes from an
// authority of its own takes jobs, and its job fetches the repository
// with git and uploads artifacts over HTTPS, trusting that authority
// through CI_SERVER_TLS_CA_FILE as GitLab's runner does — whether the
// authority is the entry's tls-ca-file, the certs directory's <host>.crt
// (GitLab's runner's /etc/gitlab-runner/certs), or one the runner's host
// trusts (here: the runner's HTTP client), which jobs get as the chain the
// coordinator presented: the job's git and helper do not trust it
// otherwise.
func TestTLSCAFile(t *testing.T) {
	for _, how := range []string{"tls-ca-file", "certs directory", "presented chain"} {
		t.Run(how, func(t *testing.T) {
			e := newE2E(t)
			git, gh := newGitHandler(t)
			front, ca := tlsFront(t, e.url, gh)
			git.url = front + "/git/group/demo.git"
			if how == "presented chain" {
				pem, err := os.ReadFile(ca)
				if err != nil {
					t.Fatal(err)
				}
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(pem)
				e.options = func(o *Options) {
					o.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
				}
			}
			_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
				rc.URL = front
				switch how {
				case "tls-ca-file":
					rc.TLSCAFile = ca
				case "certs directory":
					rc.CertsDir = t.TempDir()
					u, _ := url.Parse(front)
					if err := os.Rename(ca, filepath.Join(rc.CertsDir, u.Hostname()+".crt")); err != nil {
						t.Fatal(err)
					}
				}
			}, nil)
			spec := dispatch.JobSpec{Name: "over-tls", ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
				Steps: script(
					"cat README",
					`grep -q "BEGIN CERTIFICATE" "$CI_SERVER_TLS_CA_FILE" && echo ca-file-given`,
					"echo built > out.txt"),
				Artifacts: []runnerapi.Artifact{{Paths: []string{"out.txt"}, When: "on_success", ArtifactType: "archive", ArtifactFormat: "zip"}},
			}
			id := e.enqueue(t, spec)
			j := e.waitDone(t, id)
			tr := e.trace(t, id)
			if j.Status != "success" || !strings.Contains(tr, "demo-repo-content") || !strings.Contains(tr, "ca-file-given") {
				t.Fatalf("job over TLS: %s\n%s", j.Status, tr)
			}
			if git.served.Load() == 0 {
				t.Error("the repository was not fetched over HTTPS")
			}
			var arts []restapi.ArtifactJSON
			if jj, err := e.admin.Job(context.Background(), 1, id); err == nil {
				arts = jj.Artifacts
			}
			if len(arts) == 0 {
				t.Errorf("no artifact uploaded over HTTPS\n%s", tr)
			}
		})
	}
}

// Without the entry's authority the coordinator's certificate is refused;
// with it, the same call goes through; a bad file is an error naming it.
func TestTLSFilesClient(t *testing.T) {
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"id":1,"token":"glrt-x"}`))
	}))
	defer hs.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	_ = os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o644)
	c := network.New(network.Options{Backoff: network.Backoff{Min: 1, Max: 2, Factor: 2}, MaxAttempts: 1})
	rc := network.RunnerCredentials{URL: hs.URL, Token: "glrt-x"}
	if _, err := c.Verify(context.Background(), rc, "s_x", nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without tls-ca-file: %v, want a certificate error", err)
	}
	if err := c.SetTLS(hs.URL, network.TLSFiles{CAFile: ca}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(context.Background(), rc, "s_x", nil); err != nil {
		t.Fatalf("with tls-ca-file: %v", err)
	}
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	_ = os.WriteFile(notPEM, []byte("not a certificate"), 0o644)
	for f, want := range map[network.TLSFiles]string{
		{CAFile: notPEM}:                    "no PEM certificate",
		{CAFile: "/nonexistent/ca.pem"}:     "tls-ca-file",
		{CertFile: ca}:                      "go together",
		{CertFile: notPEM, KeyFile: notPEM}: "tls-cert-file",
	} {
		if err := c.SetTLS(hs.URL, f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", f, err, want)
		}
	}
}
