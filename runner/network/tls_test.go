package network

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The certs directory gives each file the entry does not set, by the
// coordinator's host, as GitLab's runner's does.
func TestWithCertsDir(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ci.example.test.crt", "ci.example.test.auth.crt", "ci.example.test.auth.key", "::1.crt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "other.test.crt"), 0o700); err != nil {
		t.Fatal(err)
	}
	in := func(name string) string { return filepath.Join(dir, name) }
	for _, tt := range []struct {
		name string
		f    TLSFiles
		url  string
		want TLSFiles
	}{
		{"every file, port ignored", TLSFiles{}, "https://ci.example.test:8443/gitlab",
			TLSFiles{in("ci.example.test.crt"), in("ci.example.test.auth.crt"), in("ci.example.test.auth.key")}},
		{"the entry's files first", TLSFiles{CAFile: "/etc/ca.pem"}, "https://ci.example.test",
			TLSFiles{"/etc/ca.pem", in("ci.example.test.auth.crt"), in("ci.example.test.auth.key")}},
		{"an IPv6 address", TLSFiles{}, "https://[::1]:443", TLSFiles{CAFile: in("::1.crt")}},
		{"another host", TLSFiles{}, "https://gitlab.example.test", TLSFiles{}},
		{"a directory is not a file", TLSFiles{}, "https://other.test", TLSFiles{}},
		{"no URL", TLSFiles{}, "", TLSFiles{}},
	} {
		if got := tt.f.WithCertsDir(dir, tt.url); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if got := (TLSFiles{}).WithCertsDir("", "https://ci.example.test"); !got.IsZero() {
		t.Errorf("no directory: %+v", got)
	}
}

// A coordinator reached over TLS leaves the chain that verified it, root
// included, for jobs; over plain HTTP nothing.
func TestPresentedChain(t *testing.T) {
	answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"id":1,"token":"glrt-x"}`))
	})
	hs := httptest.NewTLSServer(answer)
	defer hs.Close()
	plain := httptest.NewServer(answer)
	defer plain.Close()
	pool := x509.NewCertPool()
	pool.AddCert(hs.Certificate())
	c := New(Options{HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, MaxAttempts: 1})
	if got := c.PresentedChain(hs.URL); got != "" {
		t.Fatalf("a chain before any call: %q", got)
	}
	for _, u := range []string{hs.URL, plain.URL} {
		if _, err := c.Verify(context.Background(), RunnerCredentials{URL: u, Token: "glrt-x"}, "s_x", nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.PresentedChain(plain.URL); got != "" {
		t.Errorf("plain HTTP left a chain: %q", got)
	}
	chain := c.PresentedChain(hs.URL + "/")
	block, rest := pem.Decode([]byte(chain))
	if block == nil || strings.TrimSpace(string(rest)) != "" {
		t.Fatalf("chain %q: want one PEM certificate (the self-signed test server's)", chain)
	}
	if cert, err := x509.ParseCertificate(block.Bytes); err != nil || !cert.Equal(hs.Certificate()) {
		t.Fatalf("chain holds another certificate: %v", err)
	}
}

// A chain lists each certificate once, in order, leaf first.
func TestChainPEM(t *testing.T) {
	mk := func(sig string) *x509.Certificate {
		return &x509.Certificate{Raw: []byte("raw-" + sig), Signature: []byte(sig)}
	}
	leaf, inter, root, cross := mk("leaf"), mk("inter"), mk("root"), mk("cross")
	got := chainPEM([][]*x509.Certificate{{leaf, inter, root}, {leaf, inter, cross}})
	var raws []string
	for rest := []byte(got); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		raws = append(raws, string(b.Bytes))
	}
	if strings.Join(raws, ",") != "raw-leaf,raw-inter,raw-root,raw-cross" {
		t.Fatalf("chain %v", raws)
	}
	if strings.HasSuffix(got, "\n") {
		t.Error("the chain ends in a newline (GitLab's runner trims it)")
	}
}
