package httpapi

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
)

// ServeSnapshot answers with snapshot a, decrypted through vault (nil:
// the coordinator has no key), or the error that stops it: 404 when its
// object is no longer stored, 500 when it cannot be opened. what names it
// in messages and logs ("the snapshot of job 7").
func ServeSnapshot(w http.ResponseWriter, r *http.Request, log *slog.Logger, vault *snapshots.Vault, a *store.Artifact, what string) {
	if vault == nil {
		WriteError(w, http.StatusInternalServerError, "500 Internal Server Error - this coordinator has no secrets key to decrypt snapshots with")
		return
	}
	ctx := r.Context()
	rc, err := vault.Open(ctx, a)
	if errors.Is(err, artifacts.ErrNotFound) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("404 Snapshot Not Found - %s is no longer stored", what))
		return
	}
	if snapshots.Unreadable(err) {
		log.Error("opening a snapshot", "snapshot", what, "err", err)
		WriteError(w, http.StatusInternalServerError, "500 Internal Server Error - "+err.Error())
		return
	}
	if err != nil {
		InternalError(log, w, "opening "+what, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	// The snapshot's size: should a chunk not open part way, the body
	// ends early and the client sees it cut short.
	h.Set("Content-Length", strconv.FormatInt(a.Size, 10))
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": a.Filename}))
	h.Set("Cache-Control", "private, no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(w, rc); err != nil && ctx.Err() == nil {
		log.Error("sending a snapshot", "snapshot", what, "err", err)
	}
}
