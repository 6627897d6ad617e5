package resthttp

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
)

func (s *API) basicPipelineJSON(p *store.Pipeline) restapi.PipelineBasicJSON {
	return restapi.PipelineBasicJSON{ID: p.ID, IID: p.IID, ProjectID: p.ProjectID, Sha: p.Sha, Ref: p.Ref, Status: string(p.Status),
		Source: p.Source, CreatedAt: httpapi.RFC3339OrNil(p.CreatedAt), UpdatedAt: httpapi.RFC3339OrNil(p.UpdatedAt),
		WebURL: fmt.Sprintf("%s/api/v4/projects/%d/pipelines/%d", s.baseURL, p.ProjectID, p.ID)}
}

func (s *API) bridgeJSON(pl *store.Pipeline, j *store.Job, ds *store.Pipeline) restapi.BridgeJSON {
	out := restapi.BridgeJSON{ID: j.ID, Name: j.Name, Stage: j.Stage, Status: string(j.Status), Ref: j.Ref, Tag: pl.Tag,
		AllowFailure: graph.NodeOf(j).AllowedToFail(), CreatedAt: httpapi.RFC3339OrNil(j.CreatedAt), StartedAt: httpapi.RFC3339OrNil(j.StartedAt),
		FinishedAt: httpapi.RFC3339OrNil(j.FinishedAt), FailureReason: failureReason(j), Retried: j.Retried,
		WebURL:   fmt.Sprintf("%s/api/v4/berth/jobs/%d", s.baseURL, j.ID),
		Pipeline: s.basicPipelineJSON(pl)}
	if !j.StartedAt.IsZero() {
		q := j.StartedAt.Sub(j.QueuedSince()).Seconds()
		out.QueuedDuration = &q
		end := j.FinishedAt
		if end.IsZero() {
			end = s.clock.Now()
		}
		d := end.Sub(j.StartedAt).Seconds()
		out.Duration = &d
	}
	if ds != nil {
		d := s.basicPipelineJSON(ds)
		out.DownstreamPipeline = &d
	}
	return out
}

// handlePipelineBridges: GET /projects/:id/pipelines/:pipeline_id/bridges
// (scope, include_retried, pagination as the jobs list).
func (s *API) handlePipelineBridges(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	scopes, ok := jobScopes(w, r)
	if !ok {
		return
	}
	jobs, err := s.store.ListJobs(r.Context(), store.JobFilter{PipelineID: pl.ID, Statuses: scopes})
	if err != nil {
		httpapi.InternalError(s.log, w, "listing bridges", err)
		return
	}
	retried := r.URL.Query().Get("include_retried") == "true"
	jobs = slices.DeleteFunc(jobs, func(j *store.Job) bool { return !graph.IsBridge(j) || (j.Retried && !retried) })
	pg, ok := httpapi.Paginate(w, r, len(jobs))
	if !ok {
		return
	}
	downstream, err := s.pipelines.DownstreamPipelines(r.Context(), pl.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing downstream pipelines", err)
		return
	}
	bySource := map[int64]*store.Pipeline{}
	for _, d := range downstream {
		bySource[d.SourceJobID] = d
	}
	out := []restapi.BridgeJSON{}
	for _, j := range jobs[pg.From:pg.To] {
		out = append(out, s.bridgeJSON(pl, j, bySource[j.ID]))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}
