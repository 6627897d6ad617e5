package runnerhttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/dotenv"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
)

var artifactFormats = map[string]bool{"zip": true, "gzip": true, "raw": true, "zipzstd": true, "tarzstd": true}

// ParseExpireIn parses an artifact expire_in value: a GitLab human
// duration, or "never" (zero: never expires).
func ParseExpireIn(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" || strings.EqualFold(v, "never") {
		return 0, nil
	}
	d, err := ci.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("expire_in %q: %w", v, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("expire_in %q: must be positive", v)
	}
	return d, nil
}

// handleUploadArtifact: POST /jobs/:id/artifacts, multipart with one file
// part named "file", streamed to storage. A VM snapshot (artifact_type
// berth_snapshot, a failed job's, or berth_snapshot_<point>, a snapshot
// point's) is encrypted on its way (package snapshots), and refused when
// the coordinator has no key for it; another berth_snapshot_ type is
// refused.
func (s *API) handleUploadArtifact(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	j := s.authJob(w, r, id, jobTokenFrom(r, ""), jobtoken.ScopeArtifactsWrite)
	if j == nil {
		return
	}
	q := r.URL.Query()
	typ := q.Get("artifact_type")
	if typ == "" {
		typ = "archive"
	}
	if !validArtifactType(typ) {
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - artifact_type %q is not valid", typ))
		return
	}
	if err := snapshots.CheckType(typ); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	maxSize := s.cfg.MaxArtifactSize
	if snapshots.IsSnapshotType(typ) {
		if s.snapshots == nil {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - artifact_type "+typ+
				" is refused: this coordinator has no secrets key to encrypt VM snapshots with")
			return
		}
		maxSize = s.cfg.MaxSnapshotSize
	}
	format := q.Get("artifact_format")
	if format == "" {
		format = "zip"
	}
	if !artifactFormats[format] {
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - artifact_format %q is not valid", format))
		return
	}
	expireIn, err := ParseExpireIn(q.Get("expire_in"))
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	if r.ContentLength > maxSize {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - want a multipart/form-data body: "+err.Error())
		return
	}
	ctx := r.Context()
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - file is missing")
			return
		}
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - reading multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		filename := path.Base(strings.ReplaceAll(part.FileName(), "\\", "/"))
		if filename == "." || filename == "/" || filename == "" {
			filename = "artifacts." + format
		}
		var body io.Reader = part
		if typ == "dotenv" {
			// Checked before it is stored, as GitLab does: an invalid
			// report fails the upload.
			data, err := readDotenvUpload(part, format)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
				return
			}
			body = bytes.NewReader(data)
		}
		key := fmt.Sprintf("%d/%s-%s", j.ID, typ, randomHex(8))
		size, err := s.putArtifact(ctx, key, typ, j.ID, body, maxSize)
		if errors.Is(err, artifacts.ErrTooLarge) {
			httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			httpapi.InternalError(s.log, w, "storing artifact", err)
			return
		}
		now := s.clock.Now().UTC()
		a := &store.Artifact{JobID: j.ID, Type: typ, Format: format, Filename: filename, Size: size, StorageKey: key, CreatedAt: now}
		if snapshots.IsSnapshotType(typ) && s.cfg.MaxSnapshotAge > 0 && (expireIn <= 0 || expireIn > s.cfg.MaxSnapshotAge) {
			expireIn = s.cfg.MaxSnapshotAge
		}
		if expireIn > 0 {
			a.ExpireAt = now.Add(expireIn)
		}
		replaced, err := s.store.PutArtifact(ctx, a)
		if err != nil {
			_ = s.artifacts.Delete(ctx, key)
			httpapi.InternalError(s.log, w, "recording artifact", err)
			return
		}
		if replaced != nil {
			if err := s.artifacts.Delete(ctx, replaced.StorageKey); err != nil && !errors.Is(err, artifacts.ErrNotFound) {
				s.log.Warn("deleting replaced artifact", "job_id", j.ID, "err", err)
			}
		}
		httpapi.WriteJSON(w, http.StatusCreated, map[string]any{"id": j.ID, "file_type": typ, "size": size})
		return
	}
}

// putArtifact stores the bytes of job jobID's artifact of type typ
// under key, reading at most max bytes of r, and returns the size to
// record. A VM snapshot (of any snapshot type) is stored encrypted, and its size recorded is
// the snapshot's (what an admin downloads), not that of the slightly
// larger object stored (snapshots.SealedSize).
func (s *API) putArtifact(ctx context.Context, key, typ string, jobID int64, r io.Reader, max int64) (int64, error) {
	if snapshots.IsSnapshotType(typ) {
		return s.snapshots.Put(ctx, key, jobID, r, max)
	}
	return s.artifacts.Put(ctx, key, r, max)
}

// readDotenvUpload reads an uploaded dotenv report and checks it.
func readDotenvUpload(r io.Reader, format string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, dotenv.MaxSize))
	if err != nil {
		return nil, fmt.Errorf("reading multipart body: %w", err)
	}
	if len(data) >= dotenv.MaxSize {
		return nil, fmt.Errorf("Dotenv Artifact Too Big. Maximum Allowable Size: %d", dotenv.MaxSize)
	}
	if _, err := dotenv.Parse(data, format); err != nil {
		return nil, err
	}
	return data, nil
}

func validArtifactType(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// handleDownloadArtifact: GET /jobs/:id/artifacts. A job token may read
// the artifacts of its own job and of the jobs it depends on, while it
// runs; the admin token may read any. It sends the archive and nothing
// else: never a VM snapshot (admins fetch those, decrypted, from the REST
// API).
func (s *API) handleDownloadArtifact(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	ctx := r.Context()
	c, ok := s.artifactReader(w, r)
	if !ok {
		return
	}
	if c != nil && !c.MayRead(id) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return
	}
	if _, err := s.store.GetJob(ctx, id); errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	} else if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return
	}
	s.serveArchive(w, r, id)
}

// handleDownloadRefArtifacts: GET
// /api/v4/projects/:id/jobs/artifacts/:ref_name/download?job=NAME — the
// artifacts archive of the latest successful job of that name on the ref
// (GitLab's), for the admin token or a job token whose project may read
// the project (the include:project rule, as needs:project).
func (s *API) handleDownloadRefArtifacts(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.URL.Query().Get("job")
	if name == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - job is missing")
		return
	}
	var fromID int64
	c, ok := s.artifactReader(w, r)
	if !ok {
		return
	}
	if c != nil {
		fromID = c.ProjectID
	}
	ref := r.PathValue("ref")
	var proj *store.Project
	var err error
	if id, perr := strconv.ParseInt(r.PathValue("project"), 10, 64); perr == nil {
		proj, err = s.store.GetProject(ctx, id)
	} else {
		proj, err = s.store.ProjectByPath(ctx, r.PathValue("project"))
	}
	notFound := "404 Not found - no successful job " + strconv.Quote(name) + " on " + ref
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Project Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading project", err)
		return
	}
	if fromID == 0 {
		fromID = proj.ID // the admin reads any project
	}
	j, err := s.pipelines.LatestSucceededJob(ctx, fromID, proj, ref, name)
	if err != nil {
		httpapi.InternalError(s.log, w, "finding the latest job", err)
		return
	}
	if j == nil {
		httpapi.WriteError(w, http.StatusNotFound, notFound)
		return
	}
	s.serveArchive(w, r, j.ID)
}

// artifactReader authenticates a download of artifacts: the admin token
// (nil claims), or a running job's token that may read artifacts (its
// claims, for the caller to check what it may read). It answers 401 or 403
// itself when it returns false.
func (s *API) artifactReader(w http.ResponseWriter, r *http.Request) (*jobtoken.Claims, bool) {
	if httpapi.IsAdmin(r, s.store) {
		return nil, true
	}
	tok := jobTokenFrom(r, "")
	if tok == "" {
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return nil, false
	}
	_, c, err := s.dispatch.Authenticate(r.Context(), tok)
	if err != nil && !errors.Is(err, dispatch.ErrBadToken) && !errors.Is(err, dispatch.ErrJobNotRunning) {
		httpapi.InternalError(s.log, w, "authenticating job token", err)
		return nil, false
	}
	if err != nil || !c.Allows(jobtoken.ScopeArtifactsRead) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
		return nil, false
	}
	return c, true
}

// serveArchive sends job id's artifacts archive, or 404.
func (s *API) serveArchive(w http.ResponseWriter, r *http.Request, id int64) {
	ctx := r.Context()
	arts, err := s.store.ListArtifacts(ctx, id)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing artifacts", err)
		return
	}
	var a *store.Artifact
	for _, x := range arts {
		if x.Type == "archive" {
			a = x
		}
	}
	if a == nil {
		httpapi.WriteError(w, http.StatusNotFound, "404 Artifact Not Found")
		return
	}
	rc, size, err := s.artifacts.Open(ctx, a.StorageKey)
	if errors.Is(err, artifacts.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Artifact Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "opening artifact", err)
		return
	}
	defer rc.Close()
	ct := "application/octet-stream"
	if a.Format == "zip" {
		ct = "application/zip"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": a.Filename}))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil && ctx.Err() == nil {
		s.log.Warn("sending artifact", "job_id", id, "err", err)
	}
}
