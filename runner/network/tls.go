package network

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
)

// TLSFiles are a [[runners]] entry's tls-ca-file, tls-cert-file and
// tls-key-file, as GitLab's runner reads them: certificate authorities
// trusted for the coordinator beside the system's, and a client
// certificate for coordinators that ask for one.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// The job variables (file variables) that carry an entry's TLS files
// into its jobs, GitLab's names: git and the helper read them there.
const (
	TLSCAFileVariable   = "CI_SERVER_TLS_CA_FILE"
	TLSCertFileVariable = "CI_SERVER_TLS_CERT_FILE"
	TLSKeyFileVariable  = "CI_SERVER_TLS_KEY_FILE"
)

// TLSFilesFromEnv reads the TLS files a job's environment names (the
// client certificate only with its key).
func TLSFilesFromEnv(getenv func(string) string) TLSFiles {
	f := TLSFiles{CAFile: getenv(TLSCAFileVariable)}
	if c, k := getenv(TLSCertFileVariable), getenv(TLSKeyFileVariable); c != "" && k != "" {
		f.CertFile, f.KeyFile = c, k
	}
	return f
}

// WithCertsDir fills the files not set from dir, GitLab's runner's
// certificate directory: <host>.crt (authorities), <host>.auth.crt and
// <host>.auth.key (client certificate), host being the coordinator's at
// url, where such a file exists. (GitLab's runner takes the host as
// what precedes the first ':', which names no file for an IPv6 address;
// here it is the address.)
func (f TLSFiles) WithCertsDir(dir, coordinatorURL string) TLSFiles {
	u, err := url.Parse(coordinatorURL)
	if dir == "" || err != nil || u.Hostname() == "" {
		return f
	}
	for _, x := range []struct {
		file   *string
		suffix string
	}{{&f.CAFile, ".crt"}, {&f.CertFile, ".auth.crt"}, {&f.KeyFile, ".auth.key"}} {
		if *x.file != "" {
			continue
		}
		if p := filepath.Join(dir, u.Hostname()+x.suffix); fileExists(p) {
			*x.file = p
		}
	}
	return f
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// IsZero reports whether no file is set.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Config builds the TLS configuration of the files.
func (f TLSFiles) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls-ca-file %s: no PEM certificate in it", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls-cert-file/tls-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, errors.New("tls-cert-file and tls-key-file go together")
	}
	return cfg, nil
}

// tlsClients are the HTTP clients of one coordinator whose entry has its
// own TLS files.
type tlsClients struct {
	follow, noRedirect *http.Client
}

// SetTLS makes every call to the coordinator at url (a [[runners]] url)
// use the TLS files f; zero files go back to the default client.
func (c *Client) SetTLS(url string, f TLSFiles) error {
	key := BaseURL(url)
	if f.IsZero() {
		c.mu.Lock()
		delete(c.tls, key)
		c.mu.Unlock()
		return nil
	}
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	var tr *http.Transport
	if t, ok := c.http.Transport.(*http.Transport); ok {
		tr = t.Clone()
	} else {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	tr.TLSClientConfig = cfg
	follow := *c.http
	follow.Transport = tr
	nr := follow
	nr.CheckRedirect = c.noRedirect.CheckRedirect
	c.mu.Lock()
	c.tls[key] = tlsClients{follow: &follow, noRedirect: &nr}
	c.mu.Unlock()
	return nil
}

// clientFor is the HTTP client of calls to the coordinator at url.
func (c *Client) clientFor(url string, followRedirects bool) *http.Client {
	c.mu.Lock()
	tc, ok := c.tls[BaseURL(url)]
	c.mu.Unlock()
	switch {
	case ok && followRedirects:
		return tc.follow
	case ok:
		return tc.noRedirect
	case followRedirects:
		return c.http
	}
	return c.noRedirect
}

// TransportFor is the HTTP transport of calls to the coordinator at url
// (its TLS files, if set), for clients other than this one (the Job
// Router's).
func (c *Client) TransportFor(url string) http.RoundTripper {
	if t := c.clientFor(url, true).Transport; t != nil {
		return t
	}
	return http.DefaultTransport
}

// presentedChain is a coordinator's certificate chain as PEM, and the
// leaf it was made from.
type presentedChain struct {
	leaf []byte
	pem  string
}

// notePresentedChain records the chains that verified the coordinator at
// base in st, unless they are those of the leaf already recorded.
func (c *Client) notePresentedChain(base string, st *tls.ConnectionState) {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return
	}
	key := BaseURL(base)
	leaf := st.VerifiedChains[0][0].Raw
	c.mu.Lock()
	known := bytes.Equal(c.chains[key].leaf, leaf)
	c.mu.Unlock()
	if known {
		return
	}
	pc := presentedChain{leaf: leaf, pem: chainPEM(st.VerifiedChains)}
	c.mu.Lock()
	c.chains[key] = pc
	c.mu.Unlock()
}

// chainPEM is GitLab's runner's CA chain of a TLS connection: every
// certificate of its verified chains (leaf, intermediates and the root
// that verified them), each once, as PEM.
func chainPEM(chains [][]*x509.Certificate) string {
	var b bytes.Buffer
	seen := map[string]bool{}
	for _, chain := range chains {
		for _, cert := range chain {
			if seen[string(cert.Signature)] {
				continue
			}
			seen[string(cert.Signature)] = true
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
		}
	}
	return string(bytes.TrimSpace(b.Bytes()))
}

// PresentedChain is the certificate chain that verified the coordinator
// at url in its last answer over TLS, as PEM ("" before any, or over
// plain HTTP): what GitLab's runner gives jobs as CI_SERVER_TLS_CA_FILE
// when no tls-ca-file is set, so that a job image without the authority
// the runner's host trusts still trusts the coordinator.
func (c *Client) PresentedChain(url string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[BaseURL(url)].pem
}
