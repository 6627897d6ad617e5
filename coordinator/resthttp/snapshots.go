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
// a project's admins — instance admins (the admin token, an admin user's)
// and the project's maintainers and owners — list and fetch its
// snapshots: a snapshot holds all its job had in memory, secrets
// included.
func (s *API) snapshotRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v4/snapshots", s.authed(s.handleListSnapshots))
	mux.HandleFunc("GET /api/v4/jobs/{id}/snapshot", s.authed(s.handleGetSnapshot))
}

// handleListSnapshots: GET /snapshots[?project_id=N] lists the snapshots
// that have not expired, of one project when asked, newest first.
//
// An instance admin sees every project's; anyone else the snapshots of
// the projects they maintain (403 for a user who maintains none, or who
// names a project they do not maintain).
func (s *API) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	who := principalOf(r)
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
	var mine map[int64]bool // the projects who maintains; nil: all
	if !who.Admin() {
		var err error
		if mine, err = who.AdminProjects(ctx, s.store); err != nil {
			httpapi.InternalError(s.log, w, "loading a user's projects", err)
			return
		}
		switch {
		case projectID != 0 && !mine[projectID]:
			httpapi.NotAllowed(w, who, store.AccessMaintainer, fmt.Sprintf("project %d", projectID))
			return
		case len(mine) == 0:
			httpapi.NotAllowed(w, who, store.AccessMaintainer, "any project")
			return
		}
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
		if (projectID != 0 && j.ProjectID != projectID) || (mine != nil && !mine[j.ProjectID]) {
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
// decrypted, to an admin of the job's project (403 for anyone else).
// Its Content-Length is the snapshot's size: should a chunk not open part
// way (the object was altered in the storage), the body ends early and
// the client sees it cut short.
func (s *API) handleGetSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	ctx := r.Context()
	j, err := s.store.GetJob(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Job Not Found")
		return
	} else if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return
	}
	if !s.mayAccess(w, r, j.ProjectID, store.AccessMaintainer) {
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
