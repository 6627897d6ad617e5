package resthttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
)

// snapshotRoutes registers failed jobs' VM snapshots (Berth-only). Only
// admins, with the admin token or an admin user's, list and fetch them:
// a snapshot holds all its job had in memory, secrets included.
func (s *API) snapshotRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v4/snapshots", s.adminRole(s.handleListSnapshots))
	mux.HandleFunc("GET /api/v4/jobs/{id}/snapshot", s.adminRole(s.handleGetSnapshot))
}

// adminRole wraps a handler for the admin token or an admin user's token.
func (s *API) adminRole(h http.HandlerFunc) http.HandlerFunc {
	return httpapi.RequireAdminRole(s.store, s.log, h)
}

// handleListSnapshots: GET /snapshots[?project_id=N] lists the snapshots
// that have not expired, of one project when asked, newest first.
func (s *API) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var projectID int64
	if v := r.URL.Query().Get("project_id"); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - project_id %q is not a project's id", v))
			return
		}
		if _, err := s.store.GetProject(ctx, id); errors.Is(err, store.ErrNotFound) {
			httpapi.WriteError(w, http.StatusNotFound, "404 Project Not Found")
			return
		} else if err != nil {
			httpapi.InternalError(s.log, w, "loading project", err)
			return
		}
		projectID = id
	}
	arts, err := s.store.ArtifactsOfType(ctx, snapshots.ArtifactType)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing snapshots", err)
		return
	}
	now := s.clock.Now()
	paths := map[int64]string{} // project paths by id
	out := []restapi.SnapshotJSON{}
	for _, a := range arts {
		if !snapshots.Available(a, now) {
			continue
		}
		j, err := s.store.GetJob(ctx, a.JobID)
		if err != nil {
			httpapi.InternalError(s.log, w, "loading the job of a snapshot", err)
			return
		}
		if projectID != 0 && j.ProjectID != projectID {
			continue
		}
		path, err := s.projectPath(ctx, paths, j.ProjectID)
		if err != nil {
			httpapi.InternalError(s.log, w, "loading the project of a snapshot", err)
			return
		}
		out = append(out, restapi.SnapshotJSON{JobID: j.ID, JobName: j.Name, ProjectID: j.ProjectID, ProjectPath: path,
			PipelineID: j.PipelineID, Size: a.Size, CreatedAt: a.CreatedAt, ExpireAt: a.ExpireAt})
	}
	slices.SortFunc(out, func(a, b restapi.SnapshotJSON) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(b.JobID, a.JobID))
	})
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// projectPath is a project's path, remembered in paths; "" for a job
// enqueued without a project of this coordinator.
func (s *API) projectPath(ctx context.Context, paths map[int64]string, id int64) (string, error) {
	if p, ok := paths[id]; ok {
		return p, nil
	}
	p, err := s.store.GetProject(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		paths[id] = ""
		return "", nil
	}
	if err != nil {
		return "", err
	}
	paths[id] = p.Path
	return p.Path, nil
}

// handleGetSnapshot: GET /jobs/:id/snapshot streams the job's snapshot,
// decrypted. Its Content-Length is the snapshot's size: should a chunk
// not open part way (the object was altered in the storage), the body
// ends early and the client sees it cut short.
func (s *API) handleGetSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	ctx := r.Context()
	if _, err := s.store.GetJob(ctx, id); errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Job Not Found")
		return
	} else if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return
	}
	arts, err := s.store.ListArtifacts(ctx, id)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing artifacts", err)
		return
	}
	now := s.clock.Now()
	// The failed job's snapshot, not its snapshot points (which the
	// pipeline's later jobs read through the Runner API).
	i := slices.IndexFunc(arts, func(a *store.Artifact) bool { return a.Type == snapshots.ArtifactType && snapshots.Available(a, now) })
	if i < 0 {
		httpapi.WriteError(w, http.StatusNotFound, fmt.Sprintf("404 Snapshot Not Found - job %d has no snapshot: none was uploaded, or it expired", id))
		return
	}
	httpapi.ServeSnapshot(w, r, s.log, s.snapshots, arts[i], fmt.Sprintf("the snapshot of job %d", id))
}
