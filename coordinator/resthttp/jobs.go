package resthttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// failureReason is a job's failure_reason as GitLab's API shows it: for
// a failed job only (a cancelled one keeps what its runner said, job_canceled,
// to itself).
func failureReason(j *store.Job) string {
	if j.Status != store.StatusFailed {
		return ""
	}
	return j.FailureReason
}

func (s *API) jobJSON(j *store.Job, arts []*store.Artifact) restapi.JobJSON {
	out := restapi.JobJSON{
		ID: j.ID, Name: j.Name, Stage: j.Stage, Status: string(j.Status), Ref: j.Ref, TagList: httpapi.OrEmpty(j.Tags),
		Priority: j.Priority, CreatedAt: httpapi.RFC3339OrNil(j.CreatedAt), StartedAt: httpapi.RFC3339OrNil(j.StartedAt),
		FinishedAt: httpapi.RFC3339OrNil(j.FinishedAt), ErasedAt: httpapi.RFC3339OrNil(j.ErasedAt),
		FailureReason: failureReason(j), Timeout: j.Timeout,
		Artifacts: []restapi.ArtifactJSON{},
	}
	out.Pipeline.ID, out.Pipeline.ProjectID, out.Pipeline.Ref, out.Project.ID = j.PipelineID, j.ProjectID, j.Ref, j.ProjectID
	out.AllowFailure = graph.NodeOf(j).AllowedToFail()
	out.ScheduledAt = httpapi.RFC3339OrNil(j.ScheduledAt)
	out.Retried = j.Retried
	out.PendingReason = s.dispatch.PendingReason(j)
	if j.Status == store.StatusFailed && j.ExitCode != 0 {
		ec := j.ExitCode
		out.ExitCode = &ec
	}
	if !j.StartedAt.IsZero() {
		q := j.StartedAt.Sub(j.QueuedSince()).Seconds()
		out.QueuedDuration = &q
		end := j.FinishedAt
		if end.IsZero() {
			end = s.clock.Now()
		}
		d := end.Sub(j.StartedAt).Seconds()
		out.Duration = &d
	} else if j.Status == store.StatusPending {
		q := s.clock.Now().Sub(j.QueuedSince()).Seconds()
		out.QueuedDuration = &q
	}
	if j.RunnerID != 0 {
		out.Runner = &struct {
			ID int64 `json:"id"`
		}{j.RunnerID}
	}
	if j.RunnerManagerID != 0 {
		out.RunnerManager = &struct {
			ID int64 `json:"id"`
		}{j.RunnerManagerID}
	}
	for _, a := range arts {
		out.Artifacts = append(out.Artifacts, restapi.ArtifactJSON{FileType: a.Type, Size: a.Size, Filename: a.Filename, FileFormat: a.Format, ExpireAt: httpapi.RFC3339OrNil(a.ExpireAt)})
		if a.Type == "archive" {
			out.ArtifactsExpireAt = httpapi.RFC3339OrNil(a.ExpireAt)
		}
	}
	return out
}

// projectJob loads a job addressed as /projects/:project/jobs/:id,
// answering 404 itself when either does not match.
func (s *API) projectJob(w http.ResponseWriter, r *http.Request) *store.Job {
	pid, err := strconv.ParseInt(r.PathValue("project"), 10, 64)
	if err != nil {
		// A URL-encoded project path.
		p, err := s.pipelines.Project(r.Context(), r.PathValue("project"))
		if err != nil {
			s.apiError(w, "loading project", err)
			return nil
		}
		pid = p.ID
	}
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return nil
	}
	j, err := s.store.GetJob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && j.ProjectID != pid) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Job Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading job", err)
		return nil
	}
	return j
}

func (s *API) writeJob(w http.ResponseWriter, r *http.Request, code int, j *store.Job) {
	arts, err := s.store.ListArtifacts(r.Context(), j.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing artifacts", err)
		return
	}
	httpapi.WriteJSON(w, code, s.jobJSON(j, arts))
}

func (s *API) handleGetJob(w http.ResponseWriter, r *http.Request) {
	if j := s.projectJob(w, r); j != nil {
		s.writeJob(w, r, http.StatusOK, j)
	}
}

// handleCurrentJob: GET /api/v4/job — the job of the job token
// (JOB-TOKEN header or ?job_token=), as GitLab's "current job" API, while
// the job runs. 401 without a token or with one that is not a running
// job's.
func (s *API) handleCurrentJob(w http.ResponseWriter, r *http.Request) {
	tok := r.Header.Get(runnerapi.HeaderJobToken)
	if tok == "" {
		tok = r.URL.Query().Get("job_token")
	}
	if tok == "" {
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	}
	j, _, err := s.dispatch.Authenticate(r.Context(), tok)
	switch {
	case errors.Is(err, dispatch.ErrBadToken), errors.Is(err, dispatch.ErrJobNotRunning), errors.Is(err, jobtoken.ErrExpired):
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	case err != nil:
		httpapi.InternalError(s.log, w, "authenticating job token", err)
		return
	}
	s.writeJob(w, r, http.StatusOK, j)
}

// handleEnqueue: POST /api/v4/berth/jobs (admin) takes a dispatch.JobSpec.
func (s *API) handleEnqueue(w http.ResponseWriter, r *http.Request) {
	var spec dispatch.JobSpec
	if !httpapi.DecodeJSON(w, r, &spec) {
		return
	}
	if err := spec.Validate(); err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	j, err := s.dispatch.Enqueue(r.Context(), spec)
	if err != nil {
		httpapi.InternalError(s.log, w, "enqueueing job", err)
		return
	}
	s.writeJob(w, r, http.StatusCreated, j)
}

// handleCancelJob: POST /projects/:project/jobs/:id/cancel (201 + job, as
// GitLab answers even when the job is not cancelable).
func (s *API) handleCancelJob(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil || !s.mayAccess(w, r, j.ProjectID, store.ActAccess(j.Protected)) {
		return
	}
	nj, err := s.pipelines.CancelJob(r.Context(), j)
	if err != nil {
		httpapi.InternalError(s.log, w, "canceling job", err)
		return
	}
	s.writeJob(w, r, http.StatusCreated, nj)
}

// handleEraseJob: POST /projects/:project/jobs/:id/erase erases a
// finished job's artifacts (its snapshot included) and log: 201 + job,
// erased_at set. 403 "Job is not erasable!", as GitLab, for a job not
// finished or with nothing left to erase.
func (s *API) handleEraseJob(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil {
		return
	}
	nj, err := s.pipelines.EraseJob(r.Context(), j.ID)
	if errors.Is(err, pipelines.ErrNotAllowed) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Job is not erasable!")
		return
	}
	if err != nil {
		s.apiError(w, "erasing job", err)
		return
	}
	s.writeJob(w, r, http.StatusCreated, nj)
}

// handleDeleteJobArtifacts: DELETE /projects/:project/jobs/:id/artifacts
// deletes a job's artifacts (its snapshot included), whatever its
// status, as GitLab: 204, also when it had none.
func (s *API) handleDeleteJobArtifacts(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil {
		return
	}
	if err := s.pipelines.DeleteJobArtifacts(r.Context(), j.ID); err != nil {
		s.apiError(w, "deleting job artifacts", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleGetTrace: GET /projects/:project/jobs/:id/trace (plain text).
func (s *API) handleGetTrace(w http.ResponseWriter, r *http.Request) {
	j := s.projectJob(w, r)
	if j == nil {
		return
	}
	if a := r.Context().Value(accessKey{}).(*access); !a.who.Admin() && a.level < store.AccessDeveloper && dispatch.DebugMode(j) {
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - "+dispatch.DebugTraceForbidden)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set(runnerapi.HeaderJobStatus, string(j.Status))
	// Berth: "Range: bytes=N-" reads from offset N (berth jobs log -f).
	var offset int64
	if rg := r.Header.Get("Range"); strings.HasPrefix(rg, "bytes=") && strings.HasSuffix(rg, "-") {
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"), 10, 64)
		if err != nil || n < 0 {
			httpapi.WriteError(w, http.StatusRequestedRangeNotSatisfiable, "416 Range Not Satisfiable")
			return
		}
		ti, err := s.store.TraceInfo(r.Context(), j.ID)
		if err != nil {
			httpapi.InternalError(s.log, w, "reading trace info", err)
			return
		}
		if n > ti.Size {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", ti.Size))
			httpapi.WriteError(w, http.StatusRequestedRangeNotSatisfiable, "416 Range Not Satisfiable")
			return
		}
		offset = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, max(ti.Size-1, n), ti.Size))
		w.WriteHeader(http.StatusPartialContent)
	} else if wait := s.dispatch.IsolationWaitOf(j); wait != nil {
		// Shown, never stored: the runner's trace starts at offset 0
		// once a runner takes the job. Ranged reads (which follow the
		// stored trace by offset) do not get it.
		_, _ = io.WriteString(w, wait.LogLine())
	}
	if _, err := s.logs.Read(r.Context(), j.ID, offset, w); err != nil {
		s.log.Error("reading trace", "job_id", j.ID, "err", err)
	}
}

// handleQueueStats: GET /api/v4/berth/queue. With the admin token it
// shows the whole backlog; with a runner token (RUNNER-TOKEN header) only
// the jobs that runner may run — what its autoscaler needs — at the
// isolation levels of ?isolation_levels=a,b (as info.isolation_levels),
// else at the strongest level its managers offered recently, else none.
func (s *API) handleQueueStats(w http.ResponseWriter, r *http.Request) {
	var view *queue.Runner
	switch {
	case httpapi.AdminToken(r) != "":
		if !httpapi.IsAdmin(r, s.store) {
			httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden")
			return
		}
	case r.Header.Get(runnerapi.HeaderRunnerToken) != "":
		rn, ok := s.runnerOrFail(w, r)
		if !ok {
			return
		}
		view = s.runners.QueueView(rn, s.insightIsolation(r, rn))
	default:
		httpapi.WriteError(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	}
	stats := s.dispatch.Queue().Stats(s.clock.Now(), view)
	out := restapi.QueueStats{Waiting: s.dispatch.Queue().Waiting(), TagSets: []restapi.TagSetStats{}}
	for _, st := range stats {
		out.Queued += st.Queued
		out.TagSets = append(out.TagSets, restapi.TagSetStats{Tags: st.Tags, Queued: st.Queued, OldestWaitSeconds: st.OldestWait.Seconds()})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}
