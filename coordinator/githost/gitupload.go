package githost

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/berthci/berth/coordinator/gitrepo"
	"github.com/berthci/berth/coordinator/store"
)

// The fetch side of smart HTTP (GET info/refs?service=git-upload-pack and
// POST git-upload-pack) is served by running `git upload-pack` directly,
// as git http-backend would, without http-backend's own process in
// between; and a protocol v2 client's first request, the capability
// advertisement (the same for every request on a repository), is answered
// from memory after the repository's first. A fetch costs one upload-pack
// per remaining request instead of two processes per request. Pushes
// still go through http-backend (receivePack).

// maxUploadPackRequest bounds a fetch request's body (after gzip), as
// GIT_HTTP_MAX_REQUEST_BUFFER bounds http-backend's.
const maxUploadPackRequest = 100 << 20

// gitProtocol is the request's Git-Protocol header when it is one git
// could have sent ("version=2", "version=2:object-format=sha256"); "" else.
func gitProtocol(r *http.Request) string {
	v := r.Header.Get("Git-Protocol")
	if len(v) > 256 {
		return ""
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("=:._-", c)) {
			return ""
		}
	}
	return v
}

// wantsV2 reports whether a Git-Protocol value asks for protocol v2.
func wantsV2(proto string) bool {
	for _, kv := range strings.Split(proto, ":") {
		if kv == "version=2" {
			return true
		}
	}
	return false
}

// uploadPackAds caches protocol v2 capability advertisements by
// repository directory, for the plain "version=2" request (one entry per
// repository). A repository's configuration, which could change them, is
// written once, when Berth creates it.
type uploadPackAds struct {
	mu  sync.Mutex
	ads map[string][]byte
}

func (c *uploadPackAds) get(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.ads[key]
	return b, ok
}

func (c *uploadPackAds) put(key string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ads == nil {
		c.ads = map[string][]byte{}
	}
	c.ads[key] = b
}

// serveUploadPack serves a fetch request on repo.
func (h *Host) serveUploadPack(w http.ResponseWriter, r *http.Request, p *store.Project, repo *gitrepo.Repo, service string) {
	gitPathOnce.Do(func() { gitPath, gitPathErr = exec.LookPath("git") })
	if gitPathErr != nil {
		h.internalError(w, "finding git", gitPathErr)
		return
	}
	proto := gitProtocol(r)
	hdr := w.Header()
	hdr.Set("Expires", "Fri, 01 Jan 1980 00:00:00 GMT")
	hdr.Set("Pragma", "no-cache")
	hdr.Set("Cache-Control", "no-cache, max-age=0, must-revalidate")
	if service == "/info/refs" {
		hdr.Set("Content-Type", "application/x-git-upload-pack-advertisement")
		if wantsV2(proto) {
			// Only git's plain request is cached: the header is the
			// client's to choose, and a cache keyed by any value it
			// sends would grow without bound.
			cacheable := proto == "version=2"
			key := repo.Dir
			ad, ok := h.ads.get(key)
			if !ok || !cacheable {
				var out bytes.Buffer
				if err := h.runUploadPack(r.Context(), p, repo, proto, nil, &out, "--advertise-refs"); err != nil {
					h.internalError(w, "git upload-pack --advertise-refs", err)
					return
				}
				ad = out.Bytes()
				if cacheable {
					h.ads.put(key, ad)
				}
			}
			_, _ = w.Write(ad)
			return
		}
		// Protocol v0/v1: the service line, then the refs.
		var out bytes.Buffer
		out.WriteString("001e# service=git-upload-pack\n0000")
		if err := h.runUploadPack(r.Context(), p, repo, proto, nil, &out, "--advertise-refs"); err != nil {
			h.internalError(w, "git upload-pack --advertise-refs", err)
			return
		}
		_, _ = w.Write(out.Bytes())
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-git-upload-pack-request" {
		writeError(w, http.StatusForbidden, "403 Forbidden - content type "+ct)
		return
	}
	body := io.Reader(http.MaxBytesReader(w, r.Body, maxUploadPackRequest))
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxUploadPackRequest)
	}
	hdr.Set("Content-Type", "application/x-git-upload-pack-result")
	out := &flushWriter{w: w}
	if err := h.runUploadPack(r.Context(), p, repo, proto, body, out, ""); err != nil && !out.wrote {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
			return
		}
		if r.Context().Err() == nil {
			h.internalError(w, "git upload-pack", err)
		}
	}
}

// runUploadPack runs git upload-pack --stateless-rpc [flag] on repo.
func (h *Host) runUploadPack(ctx context.Context, p *store.Project, repo *gitrepo.Repo, proto string, stdin io.Reader, stdout io.Writer, flag string) error {
	args := []string{"upload-pack", "--stateless-rpc"}
	if flag != "" {
		args = append(args, flag)
	}
	cmd := exec.CommandContext(ctx, gitPath, append(args, repo.Dir)...)
	cmd.Env = append(gitChildEnv(), "GIT_CONFIG_NOSYSTEM=1")
	if proto != "" {
		cmd.Env = append(cmd.Env, "GIT_PROTOCOL="+proto)
	}
	cmd.Stdin, cmd.Stdout = stdin, stdout
	cmd.Stderr = &logWriter{log: h.log, project: p.ID}
	return cmd.Run()
}

// flushWriter sends what upload-pack writes as it writes it (progress on
// the sideband, then the pack).
type flushWriter struct {
	w     http.ResponseWriter
	wrote bool
}

func (f *flushWriter) Write(b []byte) (int, error) {
	f.wrote = true
	n, err := f.w.Write(b)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// gitChildEnv is the environment of git processes the coordinator
// starts for clients: only what git needs to run.
func gitChildEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
