package webui

import (
	"archive/zip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
)

// Artifacts: a job's files are downloaded whole (/artifacts/download, or
// ?type= for a report), or, for the zip archive, browsed
// (/artifacts/browse/DIR) and downloaded one file at a time
// (/artifacts/file/PATH). Files are always sent as attachments of type
// application/octet-stream, never shown inline: an artifact is whatever
// a job wrote, and must not run as a page of the UI. Neither the job's
// log (its pages show it) nor a failed job's VM snapshot (a secret, which
// only admins fetch, from the REST API) is an artifact here.

// spoolLimit bounds an archive copied to a temporary file to be read as
// a zip (object storage gives a stream, a zip needs random access).
const spoolLimit = 1 << 30

type artifactEntry struct {
	Name  string // the entry's base name
	Path  string // full path in the archive
	Dir   bool
	Size  int64
	Count int // files below a directory
}

type artifactsPage struct {
	pageBase
	Project *store.Project
	Job     *store.Job
	JobURL  string
	Dir     string
	Parent  string
	Entries []artifactEntry
	Archive *store.Artifact
	Error   string
}

func (u *UI) handleArtifacts(w http.ResponseWriter, r *http.Request, p *store.Project, j *store.Job, rest string) {
	arts, err := u.st.ListArtifacts(r.Context(), j.ID)
	if err != nil {
		u.internal(w, r, "listing artifacts", err)
		return
	}
	byType := map[string]*store.Artifact{}
	for _, a := range arts {
		if shownArtifact(a.Type) {
			byType[a.Type] = a
		}
	}
	jobURL := fmt.Sprintf("/%s/-/jobs/%d", p.Path, j.ID)
	what, sub, _ := strings.Cut(rest, "/")
	switch what {
	case "download":
		typ := r.URL.Query().Get("type")
		if typ == "" {
			typ = "archive"
		}
		a := byType[typ]
		if a == nil {
			u.notFound(w, r, "artifact")
			return
		}
		u.sendArtifact(w, r, a)
	case "browse", "file":
		a := byType["archive"]
		if a == nil || (a.Format != "" && a.Format != "zip") {
			u.notFound(w, r, "browsable artifact archive")
			return
		}
		clean, ok := cleanEntryPath(sub)
		if !ok {
			u.fail(w, r, http.StatusBadRequest, "That is not a path in the archive.")
			return
		}
		zr, closeZip, err := u.openZip(r.Context(), a)
		if err != nil {
			u.internal(w, r, "opening artifact archive", err)
			return
		}
		defer closeZip()
		if what == "file" {
			u.sendZipFile(w, r, zr, clean)
			return
		}
		entries, found := listZipDir(zr.File, clean)
		if !found {
			u.notFound(w, r, "directory in the archive")
			return
		}
		page := &artifactsPage{pageBase: pageBase{Title: fmt.Sprintf("Artifacts of %s (#%d)", j.Name, j.ID), Nav: "projects",
			Crumbs: []crumb{{p.Path, "/" + p.Path + "/-/pipelines"}, {fmt.Sprintf("%s #%d", j.Name, j.ID), jobURL}, {"Artifacts", ""}}},
			Project: p, Job: j, JobURL: jobURL, Dir: clean, Entries: entries, Archive: a}
		if clean != "" {
			page.Parent = path.Dir(clean)
			if page.Parent == "." {
				page.Parent = ""
			}
		}
		u.render(w, r, http.StatusOK, "artifacts", page)
	default:
		u.notFound(w, r, "page")
	}
}

// shownArtifact reports whether the UI lists and serves artifacts of a
// type.
func shownArtifact(typ string) bool { return typ != "trace" && !snapshots.IsSnapshotType(typ) }

// attachment sets the headers of a download named name.
func attachment(w http.ResponseWriter, name string, size int64) {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	if size >= 0 {
		h.Set("Content-Length", fmt.Sprint(size))
	}
	h.Set("Cache-Control", "private, no-store")
}

func (u *UI) sendArtifact(w http.ResponseWriter, r *http.Request, a *store.Artifact) {
	rc, size, err := u.opts.Artifacts.Open(r.Context(), a.StorageKey)
	if errors.Is(err, artifacts.ErrNotFound) {
		u.fail(w, r, http.StatusGone, "The artifact's bytes are gone (expired).")
		return
	}
	if err != nil {
		u.internal(w, r, "opening artifact", err)
		return
	}
	defer rc.Close()
	name := a.Filename
	if name == "" {
		name = "artifacts." + a.Format
	}
	attachment(w, path.Base(name), size)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(w, rc); err != nil {
		u.log.Warn("sending artifact", "artifact_id", a.ID, "err", err)
	}
}

// openZip opens an archive artifact as a zip: directly when the storage
// gives random access, else through a temporary file.
func (u *UI) openZip(ctx context.Context, a *store.Artifact) (*zip.Reader, func(), error) {
	rc, size, err := u.opts.Artifacts.Open(ctx, a.StorageKey)
	if err != nil {
		return nil, nil, err
	}
	if ra, ok := rc.(io.ReaderAt); ok {
		zr, err := zip.NewReader(ra, size)
		if err != nil {
			rc.Close()
			return nil, nil, fmt.Errorf("reading zip: %w", err)
		}
		return zr, func() { rc.Close() }, nil
	}
	defer rc.Close()
	if size > spoolLimit {
		return nil, nil, fmt.Errorf("archive of %d bytes is too large to browse", size)
	}
	f, err := os.CreateTemp("", "berth-artifact-*.zip")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { f.Close(); os.Remove(f.Name()) }
	n, err := io.Copy(f, io.LimitReader(rc, spoolLimit))
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	zr, err := zip.NewReader(f, n)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("reading zip: %w", err)
	}
	return zr, cleanup, nil
}

func (u *UI) sendZipFile(w http.ResponseWriter, r *http.Request, zr *zip.Reader, name string) {
	for _, f := range zr.File {
		if clean, ok := cleanEntryPath(f.Name); !ok || clean != name || f.FileInfo().IsDir() {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			u.fail(w, r, http.StatusUnprocessableEntity, "That file of the archive cannot be read: "+err.Error())
			return
		}
		defer rc.Close()
		attachment(w, path.Base(name), int64(f.UncompressedSize64))
		if r.Method == http.MethodHead {
			return
		}
		if _, err := io.Copy(w, rc); err != nil {
			u.log.Warn("sending a file of an artifact archive", "err", err)
		}
		return
	}
	u.notFound(w, r, "file in the archive")
}

// cleanEntryPath makes a path in an archive (from a URL or a zip entry)
// canonical: slash-separated, relative, no ".." or empty parts, at most
// 4096 bytes; "" is the root.
func cleanEntryPath(p string) (string, bool) {
	if len(p) > 4096 || strings.ContainsAny(p, "\\\x00") {
		return "", false
	}
	p = strings.Trim(p, "/")
	if p == "" {
		return "", true
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return "", false
		}
	}
	return p, true
}

// listZipDir lists the entries directly in dir ("" the root), directories
// first, each by name. found is false when nothing is in dir.
func listZipDir(files []*zip.File, dir string) ([]artifactEntry, bool) {
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	dirs := map[string]*artifactEntry{}
	var out []artifactEntry
	found := dir == ""
	for _, f := range files {
		name, ok := cleanEntryPath(f.Name)
		if !ok || name == "" || !strings.HasPrefix(name, prefix) {
			continue
		}
		found = true
		rest := strings.TrimPrefix(name, prefix)
		if rest == "" {
			continue // the directory's own entry
		}
		if first, _, sub := strings.Cut(rest, "/"); sub || f.FileInfo().IsDir() {
			d := dirs[first]
			if d == nil {
				d = &artifactEntry{Name: first, Path: prefix + first, Dir: true}
				dirs[first] = d
			}
			if sub && !f.FileInfo().IsDir() {
				d.Count++
			}
			continue
		}
		out = append(out, artifactEntry{Name: rest, Path: name, Size: int64(f.UncompressedSize64)})
	}
	for _, d := range dirs {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b artifactEntry) int {
		if a.Dir != b.Dir {
			if a.Dir {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, found
}
