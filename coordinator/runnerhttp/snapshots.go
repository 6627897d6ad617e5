package runnerhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
)

// handleGetSnapshotPoint: GET /jobs/:id/berth_snapshots/:point?job=NAME
// (Berth-only) streams, decrypted, the bundle of snapshot point point
// that job NAME of job id's pipeline took, for job id to resume. Of
// several jobs so named (retries), the latest that has it. Only the
// runner's token of job id while it runs may read it (scopes job and
// artifacts:read; not the script's CI_JOB_TOKEN): the bundle holds all
// that job had in memory. A job of another pipeline is told there is
// none, as is a job of no pipeline.
func (s *API) handleGetSnapshotPoint(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	tok := jobTokenFrom(r, "")
	if tok == "" {
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	}
	j := s.authJob(w, r, id, tok, jobtoken.ScopeJob, jobtoken.ScopeArtifactsRead)
	if j == nil {
		return
	}
	point := r.PathValue("point")
	if !snapshots.IsPoint(point) {
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - snapshot point %q is not one of %s",
			point, strings.Join(snapshots.Points, ", ")))
		return
	}
	name := r.URL.Query().Get("job")
	if name == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - the job parameter, the name of the job whose snapshot to resume, is missing")
		return
	}
	notFound := fmt.Sprintf("404 Snapshot Not Found - job %q of this pipeline has no %s snapshot: it took none, or it expired", name, point)
	if j.PipelineID == 0 {
		// ListJobs would not filter on a zero pipeline.
		httpapi.WriteError(w, http.StatusNotFound, fmt.Sprintf("404 Snapshot Not Found - job %d is of no pipeline", id))
		return
	}
	ctx := r.Context()
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: j.PipelineID})
	if err != nil {
		httpapi.InternalError(s.log, w, "listing the pipeline's jobs", err)
		return
	}
	typ, now := snapshots.PointType(point), s.clock.Now()
	named := false
	var a *store.Artifact
	// ListJobs orders by ID: the latest attempt last.
	for i := len(jobs) - 1; i >= 0 && a == nil; i-- {
		x := jobs[i]
		if x.Name != name || x.ID == j.ID || x.PipelineID != j.PipelineID {
			continue
		}
		named = true
		arts, err := s.store.ListArtifacts(ctx, x.ID)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing artifacts", err)
			return
		}
		for _, y := range arts {
			if y.Type == typ && snapshots.Available(y, now) {
				a = y
			}
		}
	}
	if !named {
		httpapi.WriteError(w, http.StatusNotFound, fmt.Sprintf("404 Job Not Found - this pipeline has no other job named %q", name))
		return
	}
	if a == nil {
		httpapi.WriteError(w, http.StatusNotFound, notFound)
		return
	}
	httpapi.ServeSnapshot(w, r, s.log, s.snapshots, a, fmt.Sprintf("the %s snapshot of job %d", point, a.JobID))
}
