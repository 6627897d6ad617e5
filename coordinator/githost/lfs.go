package githost

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
)

// Git LFS. Each project's repository serves Git LFS's batch API
// (https://github.com/git-lfs/git-lfs/blob/main/docs/api/batch.md) with
// the basic transfer, at the paths GitLab uses, so that git-lfs finds it
// from the repository's URL alone:
//
//	POST EXTERNAL_URL/<project>.git/info/lfs/objects/batch
//	GET  EXTERNAL_URL/<project>.git/gitlab-lfs/objects/<oid>
//	PUT  EXTERNAL_URL/<project>.git/gitlab-lfs/objects/<oid>/<size>
//
// with git's own authentication and rules: whoever may fetch the project
// downloads (a job's token included), whoever may push uploads. Objects
// live beside the repository (<id>.git/lfs/objects/<oid[0:2]>/<oid[2:4]>/
// <oid>, git's own layout, which git ignores in a bare repository), so
// they go with it and every replica sharing the repository directory has
// them. An upload is checked against its oid (SHA-256) and size before it
// is kept, and lands atomically. The locking API is not served (git-lfs
// then says so once and carries on).

// MaxLFSObject bounds one Git LFS object (GitLab's default has none;
// 5 GiB keeps one upload from filling the disk by mistake).
const MaxLFSObject = 5 << 30

// lfsMediaType is Git LFS's JSON media type.
const lfsMediaType = "application/vnd.git-lfs+json"

var (
	lfsBatchRe  = regexp.MustCompile(`^/(.+)\.git/info/lfs/objects/batch$`)
	lfsObjectRe = regexp.MustCompile(`^/(.+)\.git/gitlab-lfs/objects/([0-9a-f]{64})(?:/([0-9]+))?$`)
	lfsOIDRe    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// isLFS reports whether a request path is one of Git LFS's.
func isLFS(path string) bool {
	return strings.Contains(path, ".git/info/lfs/") || strings.Contains(path, ".git/gitlab-lfs/")
}

// lfsObjectPath is where an object of a project's repository lives.
func (h *Host) lfsObjectPath(projectID int64, oid string) string {
	return filepath.Join(h.RepoPath(projectID), "lfs", "objects", oid[0:2], oid[2:4], oid)
}

// lfsRequest is what a Git LFS request's method and path ask for.
type lfsRequest struct {
	project string // the project's path
	oid     string // an object transfer's ("" for a batch)
	size    int64  // an upload's
	upload  bool
}

// parseLFSRequest reads a Git LFS request's method and path; code is the
// HTTP status refusing it (0: none).
func parseLFSRequest(method, path string) (req lfsRequest, code int) {
	if m := lfsBatchRe.FindStringSubmatch(path); m != nil {
		if method != http.MethodPost {
			return req, http.StatusMethodNotAllowed
		}
		req.project = m[1]
	} else {
		o := lfsObjectRe.FindStringSubmatch(path)
		if o == nil {
			return req, http.StatusNotFound
		}
		req.project, req.oid = o[1], o[2]
		switch {
		case method == http.MethodGet && o[3] == "":
		case method == http.MethodPut && o[3] != "":
			size, err := strconv.ParseInt(o[3], 10, 64)
			if err != nil {
				return req, http.StatusBadRequest
			}
			req.size, req.upload = size, true
		default:
			return req, http.StatusMethodNotAllowed
		}
	}
	if clean, err := ParseProjectPath(req.project); err != nil || clean != req.project {
		return req, http.StatusNotFound
	}
	return req, 0
}

// decodeLFSBatch reads a batch request's body (at most 1 MiB).
func decodeLFSBatch(r io.Reader) (lfsBatchRequest, error) {
	var req lfsBatchRequest
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&req); err != nil {
		return req, fmt.Errorf("the batch request is not JSON: %w", err)
	}
	if req.Operation != "download" && req.Operation != "upload" {
		return req, fmt.Errorf("operation %q: want download or upload", req.Operation)
	}
	return req, nil
}

// serveLFS serves Git LFS's batch API and object transfers.
func (h *Host) serveLFS(w http.ResponseWriter, r *http.Request) {
	lr, code := parseLFSRequest(r.Method, r.URL.Path)
	switch {
	case code == http.StatusMethodNotAllowed:
		writeError(w, code, "405 Method Not Allowed")
		return
	case code != 0 || h.dir == "":
		writeError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	projectPath, oid := lr.project, lr.oid
	ctx := r.Context()
	p, err := h.store.ProjectByPath(ctx, projectPath)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.internalError(w, "loading project", err)
		return
	}
	access := gitNone
	if err == nil {
		if access, _, _, err = h.gitAuth(ctx, r, p); err != nil {
			h.internalError(w, "authenticating a Git LFS request", err)
			return
		}
	}
	upload := lr.upload
	if oid == "" {
		req, err := decodeLFSBatch(r.Body)
		if err != nil {
			lfsError(w, http.StatusUnprocessableEntity, err.Error())
			return
		}
		upload = req.Operation == "upload"
		if !h.lfsAllowed(w, r, access, upload) || p == nil {
			return
		}
		h.lfsBatch(w, r, p, req)
		return
	}
	if !h.lfsAllowed(w, r, access, upload) || p == nil {
		return
	}
	if upload {
		h.lfsUpload(w, r, p, oid, lr.size)
		return
	}
	f, err := os.Open(h.lfsObjectPath(p.ID, oid))
	if errors.Is(err, os.ErrNotExist) {
		writeError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	if err != nil {
		h.internalError(w, "opening a Git LFS object", err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", modTime(f), f)
}

// lfsAllowed answers 401, 404 or 403 as a git request would be answered
// (a project the caller may not see is not told apart from a missing
// one) and reports whether the request may go on.
func (h *Host) lfsAllowed(w http.ResponseWriter, r *http.Request, access gitAccess, upload bool) bool {
	if access != gitNone && (!upload || access >= gitWrite) {
		return true
	}
	if _, _, hasAuth := r.BasicAuth(); !hasAuth {
		w.Header().Set("WWW-Authenticate", `Basic realm="Berth"`)
		lfsError(w, http.StatusUnauthorized, "credentials needed")
		return false
	}
	if access == gitNone {
		lfsError(w, http.StatusNotFound, "project not found")
		return false
	}
	lfsError(w, http.StatusForbidden, "uploading Git LFS objects takes a developer")
	return false
}

type lfsBatchRequest struct {
	Operation string      `json:"operation"`
	Transfers []string    `json:"transfers"`
	Objects   []lfsObject `json:"objects"`
}

type lfsObject struct {
	OID  string `json:"oid"`
	Size int64  `json:"size"`
}

type lfsAction struct {
	Href      string            `json:"href"`
	Header    map[string]string `json:"header,omitempty"`
	ExpiresIn int               `json:"expires_in,omitempty"`
}

type lfsObjectError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type lfsResponseObject struct {
	OID           string               `json:"oid"`
	Size          int64                `json:"size"`
	Authenticated bool                 `json:"authenticated,omitempty"`
	Actions       map[string]lfsAction `json:"actions,omitempty"`
	Error         *lfsObjectError      `json:"error,omitempty"`
}

// lfsBatch answers a batch request: for each object, where to download
// it (or that it is missing), or where to upload it (nothing when it is
// there already). Actions carry the request's own Authorization, as
// GitLab's do, so git-lfs sends the same credentials.
func (h *Host) lfsBatch(w http.ResponseWriter, r *http.Request, p *store.Project, req lfsBatchRequest) {
	if len(req.Transfers) > 0 && !slices.Contains(req.Transfers, "basic") {
		lfsError(w, http.StatusUnprocessableEntity, "only the basic transfer is served")
		return
	}
	if len(req.Objects) > 1000 {
		lfsError(w, http.StatusUnprocessableEntity, "at most 1000 objects in one batch")
		return
	}
	base := strings.TrimSuffix(h.externalURL, "/") + "/" + p.Path + ".git/gitlab-lfs/objects/"
	var header map[string]string
	if a := r.Header.Get("Authorization"); a != "" {
		header = map[string]string{"Authorization": a}
	}
	out := struct {
		Transfer string              `json:"transfer"`
		Objects  []lfsResponseObject `json:"objects"`
	}{Transfer: "basic", Objects: []lfsResponseObject{}}
	for _, o := range req.Objects {
		out.Objects = append(out.Objects, h.lfsBatchObject(p, req.Operation, o, base, header))
	}
	w.Header().Set("Content-Type", lfsMediaType)
	_ = json.NewEncoder(w).Encode(out)
}

// lfsBatchObject is a batch answer's entry for one object.
func (h *Host) lfsBatchObject(p *store.Project, operation string, o lfsObject, base string, header map[string]string) lfsResponseObject {
	ro := lfsResponseObject{OID: o.OID, Size: o.Size, Authenticated: header != nil}
	if !lfsOIDRe.MatchString(o.OID) {
		ro.Error = &lfsObjectError{Code: http.StatusUnprocessableEntity, Message: "oid: want 64 lowercase hexadecimal digits (SHA-256)"}
		return ro
	}
	if o.Size < 0 || o.Size > MaxLFSObject {
		ro.Error = &lfsObjectError{Code: http.StatusUnprocessableEntity, Message: fmt.Sprintf("size %d: want 0 to %d bytes", o.Size, int64(MaxLFSObject))}
		return ro
	}
	st, err := os.Stat(h.lfsObjectPath(p.ID, o.OID))
	have := err == nil && st.Mode().IsRegular() && st.Size() == o.Size
	switch {
	case operation == "download" && !have:
		ro.Error = &lfsObjectError{Code: http.StatusNotFound, Message: "object not found"}
	case operation == "download":
		ro.Actions = map[string]lfsAction{"download": {Href: base + o.OID, Header: header, ExpiresIn: 3600}}
	case !have:
		ro.Actions = map[string]lfsAction{"upload": {Href: base + o.OID + "/" + strconv.FormatInt(o.Size, 10), Header: header, ExpiresIn: 3600}}
	}
	return ro
}

// lfsUpload keeps an uploaded object once its size and SHA-256 are those
// its path names. The objects' directory is an artifacts.Dir: the upload
// goes to a temporary file, synced, then renamed into place, so a reader
// never sees part of one; the body reader fails at its end when the
// object is not the one named, so a wrong object is never renamed.
func (h *Host) lfsUpload(w http.ResponseWriter, r *http.Request, p *store.Project, oid string, size int64) {
	if size > MaxLFSObject {
		writeError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
		return
	}
	if _, err := h.Repo(r.Context(), p); err != nil {
		h.internalError(w, "opening repository", err)
		return
	}
	objects, err := artifacts.NewDir(filepath.Join(h.RepoPath(p.ID), "lfs", "objects"))
	if err != nil {
		h.internalError(w, "storing a Git LFS object", err)
		return
	}
	body := &lfsBody{r: r.Body, sum: sha256.New(), oid: oid, size: size}
	_, err = objects.Put(r.Context(), oid[0:2]+"/"+oid[2:4]+"/"+oid, body, size)
	var bad *lfsBadBody
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, "400 Bad request - "+bad.msg)
	case errors.Is(err, artifacts.ErrTooLarge):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - the object has more than the %d bytes its path says", size))
	case err != nil:
		h.internalError(w, "storing a Git LFS object", err)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// lfsBody reads an uploaded object, and fails at its end when its size
// or SHA-256 are not those of its path; its failures are *lfsBadBody.
type lfsBody struct {
	r    io.Reader
	sum  hash.Hash
	n    int64
	oid  string
	size int64
}

// lfsBadBody is an upload's fault, not the storage's.
type lfsBadBody struct{ msg string }

func (e *lfsBadBody) Error() string { return e.msg }

func (b *lfsBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.sum.Write(p[:n])
	b.n += int64(n)
	switch {
	case err == io.EOF && b.n < b.size:
		return n, &lfsBadBody{fmt.Sprintf("the object has %d bytes, its path says %d", b.n, b.size)}
	case err == io.EOF && b.n == b.size && hex.EncodeToString(b.sum.Sum(nil)) != b.oid:
		return n, &lfsBadBody{"the object's SHA-256 is not its oid"}
	case err != nil && err != io.EOF:
		return n, &lfsBadBody{"reading the object: " + err.Error()}
	}
	return n, err
}

// lfsError writes Git LFS's error body.
func lfsError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", lfsMediaType)
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Message string `json:"message"`
	}{msg})
}

func modTime(f *os.File) time.Time {
	if st, err := f.Stat(); err == nil {
		return st.ModTime()
	}
	return time.Time{}
}
