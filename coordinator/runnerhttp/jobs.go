package runnerhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/dotenv"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// handleJobRequest: POST /jobs/request, the long poll.
func (s *API) handleJobRequest(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.JobRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	rn, ok := s.runnerOrFail(w, r, req.Token)
	if !ok {
		return
	}
	a, err := s.requestJob(r.Context(), rn, &req)
	switch {
	case errors.Is(err, errOrphaned):
		httpapi.WriteError(w, http.StatusUnprocessableEntity, "422 Unprocessable Entity - runner is orphaned")
	case errors.Is(err, dispatch.ErrLostRaces):
		httpapi.WriteError(w, http.StatusConflict, "409 Conflict - job was already taken")
	case err != nil:
		httpapi.InternalError(s.log, w, "assigning job", err)
	case a.payload == nil:
		w.Header().Set(runnerapi.HeaderLastUpdate, a.lastUpdate)
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set(runnerapi.HeaderLastUpdate, a.lastUpdate)
		httpapi.WriteJSON(w, http.StatusCreated, a.payload)
	}
}

// jobAnswer is what a jobs/request gets: a job's payload (nil: none) and
// the runner's queue version (X-GitLab-Last-Update).
type jobAnswer struct {
	payload    *runnerapi.JobResponse
	lastUpdate string
}

// requestJob is one jobs/request of runner rn (its token authenticated),
// whichever way it came: POST /jobs/request or GitLab's Job Router. Errors:
// errOrphaned, dispatch.ErrLostRaces, or the store's.
func (s *API) requestJob(ctx context.Context, rn *store.Runner, req *runnerapi.JobRequest) (jobAnswer, error) {
	managerID, view, err := s.checkIn(ctx, rn, req.SystemID, req.Info)
	if err != nil {
		return jobAnswer{}, err
	}
	if rn.Paused {
		return jobAnswer{lastUpdate: s.queue.Version(view)}, nil
	}
	var hold time.Duration
	// A replica's queue versions are its own: behind a load balancer the
	// runner's last_update may come from another replica, so there any
	// last_update means "has looked before" and the poll is held (Take
	// answers at once when a job is there).
	if req.LastUpdate != "" && (req.LastUpdate == s.queue.Version(view) || s.cfg.Replicated) {
		hold = s.cfg.LongPollTimeout
	}
	h, payload, err := s.handOut(ctx, rn, view, managerID, hold)
	if err != nil {
		return jobAnswer{}, err
	}
	a := jobAnswer{lastUpdate: s.queue.Version(view)}
	if h != nil && (req.Info == nil || !req.Info.Features.TwoPhaseJobCommit) {
		// A runner without two-phase commit (gitlab-runner before 18.5)
		// never acknowledges: as on GitLab, its job runs from the hand-out.
		// Left pending, it would show pending while it runs, be cancelled
		// as a job nobody runs, and be handed out again at the ack timeout.
		_, err := s.acknowledge(ctx, h.Job, s.clock.Now().UTC())
		if errors.Is(err, errNotWaiting) {
			return a, nil // cancelled in the meantime: no job
		}
		if err != nil {
			if rerr := s.dispatch.Release(context.WithoutCancel(ctx), h); rerr != nil {
				s.log.Error("releasing a job whose start failed", "job_id", h.Job.ID, "err", rerr)
			}
			return jobAnswer{}, fmt.Errorf("starting job %d: %w", h.Job.ID, err)
		}
	}
	if h != nil {
		a.payload = payload
	}
	return a, nil
}

// errOrphaned: a project runner whose projects are all gone asks for jobs.
var errOrphaned = errors.New("runner is orphaned")

// checkIn is what every ask for jobs does first, on jobs/request and on
// the push channel: it refuses an orphaned runner (errOrphaned), records
// the runner manager's contact, and notes the isolation levels it offers,
// which pick the runner's view of the queue: managers of one token
// offering different levels match different jobs and have queue versions
// of their own.
func (s *API) checkIn(ctx context.Context, rn *store.Runner, systemID string, info *runnerapi.Info) (int64, *queue.Runner, error) {
	if rn.Type == store.ProjectType && len(rn.ProjectIDs) == 0 {
		return 0, nil, errOrphaned
	}
	managerID, err := s.runners.TouchManager(ctx, rn, systemID, info)
	if err != nil {
		return 0, nil, err
	}
	return managerID, s.runners.NoteOffer(rn, systemID, info), nil
}

// handOut hands the next job of view to the manager, waiting up to hold,
// and builds its payload; nil when no job came or ctx ended. A job whose
// payload cannot be built, or whose asker is gone, goes back to the queue
// at once instead of waiting for the ack timeout.
func (s *API) handOut(ctx context.Context, rn *store.Runner, view *queue.Runner, managerID int64, hold time.Duration) (*dispatch.HandOut, *runnerapi.JobResponse, error) {
	h, err := s.dispatch.HandOut(ctx, rn, view, managerID, hold)
	if err != nil || h == nil {
		return nil, nil, err
	}
	if ctx.Err() != nil {
		// The asker went away (a long poll's runner, a push stream's
		// room) while its job was handed out — a job placed at its
		// creation comes even then: it goes back now, not at the ack
		// timeout.
		if err := s.dispatch.Release(ctx, h); err != nil {
			s.log.Error("releasing a job whose asker went away", "job_id", h.Job.ID, "err", err)
		}
		return nil, nil, nil
	}
	payload, err := s.payload(ctx, h, rn)
	if err == nil {
		return h, payload, nil
	}
	if de := (*dropError)(nil); errors.As(err, &de) {
		s.drop(ctx, h.Job, de)
		return nil, nil, nil
	}
	if rerr := s.dispatch.Release(ctx, h); rerr != nil {
		s.log.Error("releasing a job whose payload failed", "job_id", h.Job.ID, "err", rerr)
	}
	return nil, nil, fmt.Errorf("building the payload of job %d: %w", h.Job.ID, err)
}

// dropError is why a job is failed at hand-out instead of being handed
// out, as GitLab's pre-assign checks drop a build: reason is its failure
// reason, msg goes to its log.
type dropError struct{ reason, msg string }

func (e *dropError) Error() string { return e.msg }

// drop fails a job that was just assigned, for a reason that would fail it
// on any runner; the runner asks again.
func (s *API) drop(ctx context.Context, j *store.Job, de *dropError) {
	ctx = context.WithoutCancel(ctx)
	now := s.clock.Now().UTC()
	if _, err := s.dispatch.Transition(ctx, j.ID, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusFailed, FailureReason: de.reason, FinishedAt: now, UpdatedAt: now}); err != nil {
		s.log.Error("failing a job at hand-out", "job_id", j.ID, "reason", de.reason, "err", err)
		return
	}
	s.logs.AddLine(ctx, j.ID, "ERROR: Job failed: "+de.msg+"\n")
	s.log.Info("job failed at hand-out", "job_id", j.ID, "reason", de.reason, "message", de.msg)
}

// payload builds the job payload handed to a runner; isolation is the
// level the job was matched at.
func (s *API) payload(ctx context.Context, h *dispatch.HandOut, rn *store.Runner) (*runnerapi.JobResponse, error) {
	// The runner's token does everything the runner does for the job; the
	// one the job's script and its git fetches see (CI_JOB_TOKEN, the
	// repository URL, the dependencies' downloads) only reads.
	j, jobToken, scriptToken, isolation, now := h.Job, h.Token, h.ScriptToken, h.Isolation, h.Job.AssignedAt
	var spec dispatch.JobSpec
	if err := json.Unmarshal(j.Spec, &spec); err != nil {
		return nil, fmt.Errorf("decoding spec of job %d: %w", j.ID, err)
	}
	// The dependencies' artifacts, read once: their archives are the
	// payload's dependencies, their dotenv reports variables.
	depArtifacts, err := store.ArtifactsOf(ctx, s.store, j.Dependencies)
	if err != nil {
		return nil, fmt.Errorf("dependencies of job %d: %w", j.ID, err)
	}
	// The dependencies' dotenv reports: after the job's YAML variables,
	// before the project's and the pipeline's (GitLab's order).
	denv, err := dotenv.Variables(ctx, s.artifacts, s.log, depArtifacts, j.Dependencies, now)
	if err != nil {
		return nil, fmt.Errorf("dotenv variables of job %d: %w", j.ID, err)
	}
	spec.Variables = dotenv.Insert(spec.Variables, spec.HighVariables, denv)
	timeout := spec.Timeout
	if rn.MaximumTimeout > 0 && rn.MaximumTimeout < timeout {
		timeout = rn.MaximumTimeout
	}
	repoURL := ""
	if spec.RepoURL != "" {
		u, err := url.Parse(spec.RepoURL)
		if err != nil {
			return nil, fmt.Errorf("repo_url of job %d: %w", j.ID, err)
		}
		u.User = url.UserPassword("gitlab-ci-token", scriptToken)
		repoURL = u.String()
	}
	var protected *bool
	if spec.Ref != "" {
		p := spec.Protected
		protected = &p
	}
	refType := spec.RefType
	if refType == "" && spec.Ref != "" {
		refType = "branch"
	}
	refspecs := spec.Refspecs
	if refspecs == nil {
		refspecs = []string{}
	}
	projectName := spec.ProjectName
	if projectName == "" {
		projectName = "project-" + strconv.FormatInt(spec.ProjectID, 10)
	}
	p := &runnerapi.JobResponse{
		ID:            j.ID,
		Token:         jobToken,
		AllowGitFetch: spec.AllowGitFetch,
		JobInfo: runnerapi.JobInfo{
			Name: j.Name, Stage: j.Stage, ProjectID: j.ProjectID, ProjectName: projectName,
			ProjectFullPath: spec.ProjectFullPath, PipelineID: j.PipelineID, NamespaceID: spec.NamespaceID,
			RootNamespaceID: spec.RootNamespaceID, QueueSize: int64(s.queue.Len()),
			TimeInQueueSeconds: now.Sub(j.QueuedSince()).Seconds(),
		},
		GitInfo: runnerapi.GitInfo{
			RepoURL: repoURL, RepoObjectFormat: "sha1", Ref: spec.Ref, Sha: spec.Sha, BeforeSha: spec.BeforeSha,
			RefType: refType, Refspecs: refspecs, Depth: spec.Depth, Protected: protected,
		},
		RunnerInfo:  runnerapi.RunnerInfo{Timeout: timeout},
		Variables:   dispatch.PredefinedVariables(s.baseURL, j, &spec, scriptToken, repoURL, rn, timeout),
		Steps:       spec.Steps,
		Hooks:       spec.Hooks,
		Image:       spec.Image,
		Services:    httpapi.OrEmpty(spec.Services),
		Artifacts:   httpapi.OrEmpty(spec.Artifacts),
		Cache:       httpapi.OrEmpty(spec.Cache),
		Credentials: httpapi.OrEmpty(spec.Credentials),
		Features: runnerapi.JobFeatures{
			TraceSections:     true,
			TokenMaskPrefixes: token.MaskPrefixes,
			FailureReasons:    runnerapi.RunnerFailureReasons,
			Tracing:           s.tracer.JobTracing(j),
		},
	}
	// As GitLab: the ID tokens come with the predefined variables, before
	// the project's and the pipeline's, and their aud is expanded with
	// all of them.
	tokens, err := s.idTokenVariables(ctx, j, &spec, rn, append(slices.Clone(p.Variables), spec.Variables...), timeout, now)
	if err != nil {
		return nil, err
	}
	p.Variables = append(p.Variables, tokens...)
	p.Variables = append(p.Variables, spec.Variables...)
	if p.Secrets, err = payloadSecrets(&spec, p.Variables); err != nil {
		return nil, fmt.Errorf("secrets of job %d: %w", j.ID, err)
	}
	if d, ok := gitDepth(p.Variables); ok {
		p.GitInfo.Depth = d
	}
	if spec.RepoURL != "" && spec.ProjectID == j.ProjectID {
		p.GitInfo.RefsDigest = s.git.RefsDigest(j.ProjectID, refspecs, p.GitInfo.Depth, spec.Sha)
	}
	if j.Isolation != "" || isolation != executor.IsolationNone {
		// The runner (and the job's script) learns the level the job
		// runs at, whether it came from the keyword, the variable or the
		// project's minimum: one BERTH_ISOLATION, last.
		p.Variables = slices.DeleteFunc(p.Variables, func(v runnerapi.Variable) bool { return v.Key == runnerapi.IsolationVariable })
		p.Variables = append(p.Variables, runnerapi.Variable{Key: runnerapi.IsolationVariable, Value: string(isolation), Public: true})
	}
	p.Dependencies = []runnerapi.Dependency{}
	// The job's dependencies, not the spec's: a pipeline resolves them
	// when the job is enqueued (Enqueue stores the spec's).
	for _, depID := range j.Dependencies {
		dep, err := s.store.GetJob(ctx, depID)
		if errors.Is(err, store.ErrNotFound) {
			continue // a dependency that no longer exists has no artifacts
		}
		if err != nil {
			return nil, fmt.Errorf("loading dependency %d of job %d: %w", depID, j.ID, err)
		}
		d := runnerapi.Dependency{ID: dep.ID, Name: dep.Name, Token: scriptToken}
		for _, a := range depArtifacts[dep.ID] {
			if a.Type == "archive" {
				d.ArtifactsFile = &runnerapi.ArtifactsFile{Filename: a.Filename, Size: a.Size}
			}
		}
		p.Dependencies = append(p.Dependencies, d)
	}
	return p, nil
}

// gitDepth is the depth a job's GIT_DEPTH variable asks for, the one that
// counts if it is set at several levels, read as GitLab reads it (Ruby's
// to_i); 0 or less is a full clone. gitlab-runner takes the depth from
// git_info.depth alone, which GitLab fills from the variable.
func gitDepth(vars []runnerapi.Variable) (int, bool) {
	for i := len(vars) - 1; i >= 0; i-- {
		if vars[i].Key != "GIT_DEPTH" {
			continue
		}
		switch n := ci.RubyToI(vars[i].Value); {
		case n.Sign() <= 0:
			return 0, true
		case !n.IsInt64() || n.Int64() > math.MaxInt32:
			return math.MaxInt32, true
		default:
			return int(n.Int64()), true
		}
	}
	return 0, false
}

// jobStatusHeaders sets the headers GitLab puts on job update and trace
// responses.
func (s *API) jobStatusHeaders(w http.ResponseWriter, st store.Status) {
	w.Header().Set(runnerapi.HeaderJobStatus, string(st))
	w.Header().Set(runnerapi.HeaderTraceUpdateInterval, strconv.Itoa(int(s.cfg.TraceUpdateInterval/time.Second)))
}

// knownFailureReasons are the reasons stored as sent; others become
// unknown_failure.
var knownFailureReasons = map[string]bool{
	runnerapi.ScriptFailure: true, runnerapi.RunnerSystemFailure: true, runnerapi.JobExecutionTimeout: true,
	runnerapi.ImagePullFailure: true, runnerapi.UnknownFailure: true, runnerapi.RunnerConfigurationError: true,
	runnerapi.RunnerExternalDependencyFailure: true, runnerapi.RunnerInterrupted: true, runnerapi.JobCanceled: true,
}

// MaxTraceResets bounds how often a final update may ask the runner to
// re-send the whole trace before the coordinator accepts it as it is.
const MaxTraceResets = 3

// handleUpdateJob: PUT /jobs/:id — ack, keep-alive and final state.
func (s *API) handleUpdateJob(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	var req runnerapi.UpdateJobRequest
	if !httpapi.DecodeJSON(w, r, &req) {
		return
	}
	j := s.authJob(w, r, id, jobTokenFrom(r, req.Token), jobtoken.ScopeJob)
	if j == nil {
		return
	}
	ctx := r.Context()
	now := s.clock.Now().UTC()
	switch req.State {
	case runnerapi.StatePending:
		// Keep-alive during preparation (two-phase commit).
		if err := s.store.TouchJob(ctx, j.ID, now); err != nil && !errors.Is(err, store.ErrConflict) {
			httpapi.InternalError(s.log, w, "touching job", err)
			return
		}
		s.jobStatusHeaders(w, j.Status)
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{})
	case runnerapi.StateRunning:
		if j.Status == store.StatusPending {
			nj, err := s.acknowledge(ctx, j, now)
			if errors.Is(err, errNotWaiting) {
				httpapi.WriteError(w, http.StatusConflict, "409 Conflict - job is no longer waiting for this runner")
				return
			}
			if err != nil {
				httpapi.InternalError(s.log, w, "acknowledging job", err)
				return
			}
			j = nj
		} else if err := s.store.TouchJob(ctx, j.ID, now); err != nil && !errors.Is(err, store.ErrConflict) {
			httpapi.InternalError(s.log, w, "touching job", err)
			return
		}
		s.jobStatusHeaders(w, j.Status)
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{})
	case runnerapi.StateSuccess, runnerapi.StateFailed:
		s.finishJob(w, r, j, &req, now)
	default:
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - state %q is not valid", req.State))
	}
}

// errNotWaiting: an acknowledged job no longer waits for its runner.
var errNotWaiting = errors.New("job is no longer waiting for this runner")

// acknowledge records a runner's acknowledgement of j, handed out and
// pending (its copy authenticated by the runner's job token): running
// from now, if the store still has it handed out with that token — a
// copy may be stale, and a late acknowledgement must not start the job
// another runner was given since. A job this hand-out's acknowledgement
// made running already is returned as it is. It fails with errNotWaiting
// when the job went elsewhere or ended, returning it as the store has it
// when it could be read.
func (s *API) acknowledge(ctx context.Context, j *store.Job, now time.Time) (*store.Job, error) {
	nj, err := s.dispatch.Transition(ctx, j.ID, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusRunning, StartedAt: now, UpdatedAt: now, IfTokenDigest: j.TokenDigest})
	if errors.Is(err, store.ErrConflict) {
		// This replica's copy may be stale: another replica may have
		// recorded this very ack and died before telling (the runner then
		// asks again here). The store decides.
		cur, rerr := s.dispatch.Reload(ctx, j.ID)
		if rerr != nil || cur.TokenDigest != j.TokenDigest || !dispatch.TokenActive(cur) || cur.Status == store.StatusPending {
			return cur, errNotWaiting
		}
		return cur, nil
	}
	return nj, err
}

// finishJob handles a final update: the trace it announces must be
// complete (else 202, or 412 to have it re-sent) before the state is
// stored.
func (s *API) finishJob(w http.ResponseWriter, r *http.Request, j *store.Job, req *runnerapi.UpdateJobRequest, now time.Time) {
	ctx := r.Context()
	checksum, size, announced := "", int64(0), false
	if req.Output != nil {
		checksum, size, announced = req.Output.Checksum, req.Output.Bytesize, true
	} else if req.Checksum != "" {
		checksum = req.Checksum
	}
	if announced || checksum != "" {
		ti, err := s.store.TraceInfo(ctx, j.ID)
		if err != nil {
			httpapi.InternalError(s.log, w, "reading trace info", err)
			return
		}
		stored := fmt.Sprintf("crc32:%08x", ti.CRC32)
		s.mu.Lock()
		first, waiting := s.finalWait[j.ID]
		if !waiting {
			first = now
		}
		s.mu.Unlock()
		switch {
		case announced && size > ti.Size && now.Sub(first) < s.cfg.FinalTraceWait:
			s.mu.Lock()
			s.finalWait[j.ID] = first
			s.mu.Unlock()
			s.jobStatusHeaders(w, j.Status)
			httpapi.WriteJSON(w, http.StatusAccepted, map[string]any{})
			return
		case (announced && size != ti.Size) || (checksum != "" && checksum != stored):
			s.mu.Lock()
			n := s.traceReset[j.ID]
			if n < MaxTraceResets {
				s.traceReset[j.ID] = n + 1
			}
			s.mu.Unlock()
			if n < MaxTraceResets {
				s.jobStatusHeaders(w, j.Status)
				httpapi.WriteError(w, http.StatusPreconditionFailed, "412 Precondition Failed - trace validation failed")
				return
			}
			s.log.Warn("accepting job with a trace that does not match the runner's checksum",
				"job_id", j.ID, "stored_size", ti.Size, "runner_size", size)
		}
	}
	upd := store.JobUpdate{FinishedAt: now, UpdatedAt: now}
	if req.State == runnerapi.StateSuccess {
		upd.Status = store.StatusSuccess
	} else {
		upd.Status = store.StatusFailed
		upd.FailureReason = req.FailureReason
		if upd.FailureReason == "" {
			upd.FailureReason = runnerapi.ScriptFailure
		}
		if !knownFailureReasons[upd.FailureReason] {
			upd.FailureReason = runnerapi.UnknownFailure
		}
		upd.ExitCode = req.ExitCode
	}
	if j.Status == store.StatusCanceling {
		upd.Status = store.StatusCanceled
		if upd.FailureReason == "" {
			upd.FailureReason = runnerapi.JobCanceled
		}
	}
	if j.StartedAt.IsZero() {
		upd.StartedAt = now
	}
	g := graph.Decode(j.Graph)
	if upd.Status == store.StatusSuccess && g.Release != nil {
		// The release is the job's last step (GitLab's release-cli step):
		// when it cannot be made, the job fails.
		if _, err := s.pipelines.CreateJobRelease(ctx, j, g.Release); err != nil {
			var re *pipelines.ReleaseError
			msg := "an internal error; see the coordinator's log"
			if errors.As(err, &re) {
				msg = re.Error()
			} else {
				s.log.Error("creating a release", "job_id", j.ID, "err", err)
			}
			s.logs.AddLine(ctx, j.ID, "\nERROR: Berth could not create the release: "+msg+"\n")
			upd.Status, upd.FailureReason, upd.ExitCode = store.StatusFailed, runnerapi.ScriptFailure, 1
		}
	}
	nj, err := s.dispatch.Transition(ctx, j.ID, []store.Status{store.StatusPending, store.StatusRunning, store.StatusCanceling}, upd)
	if errors.Is(err, store.ErrConflict) {
		cur, gerr := s.store.GetJob(ctx, j.ID)
		if gerr == nil {
			s.jobStatusHeaders(w, cur.Status)
		}
		httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "finishing job", err)
		return
	}
	if nj.Status == store.StatusSuccess && g.Pages != nil {
		s.pages.DeployLater(nj, g.Pages)
	}
	s.jobStatusHeaders(w, nj.Status)
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{})
}

// maxTracePatch bounds one trace PATCH body (runners send at most 1 MiB).
const maxTracePatch = 4 << 20

// handleAppendTrace: PATCH /jobs/:id/trace.
func (s *API) handleAppendTrace(w http.ResponseWriter, r *http.Request) {
	id, ok := httpapi.PathID(w, r, "id")
	if !ok {
		return
	}
	j := s.authJob(w, r, id, jobTokenFrom(r, ""), jobtoken.ScopeTrace)
	if j == nil {
		return
	}
	ctx := r.Context()
	cr := r.Header.Get(runnerapi.HeaderContentRange)
	if cr == "" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - Content-Range header is missing")
		return
	}
	start, end, err := ParseContentRange(cr)
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - "+err.Error())
		return
	}
	if end >= s.cfg.MaxTraceSize {
		s.traceTooLarge(w, r, j, end+1)
		return
	}
	body, err := httpapi.ReadLimited(r, maxTracePatch)
	if err != nil {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
		return
	}
	if int64(len(body)) != end-start+1 {
		httpapi.WriteError(w, http.StatusBadRequest, fmt.Sprintf("400 Bad request - Content-Range %s does not match a body of %d bytes", cr, len(body)))
		return
	}
	if start == 0 {
		s.mu.Lock()
		reset := s.traceReset[j.ID] > 0
		s.mu.Unlock()
		if reset {
			if err := s.logs.Reset(ctx, j.ID); err != nil {
				httpapi.InternalError(s.log, w, "resetting trace", err)
				return
			}
		}
	}
	// GitLab's runners say so when the log is a debug trace (CI_DEBUG_TRACE):
	// from then on only the project's developers read it.
	if debug, _ := strconv.ParseBool(r.URL.Query().Get("debug_trace")); debug && !j.DebugTrace {
		if err := s.store.MarkDebugTrace(ctx, j.ID); err != nil {
			httpapi.InternalError(s.log, w, "marking the log a debug trace", err)
			return
		}
		// This replica's copy of the job learns it too, so the job's
		// next patches do not write it again.
		_, _ = s.dispatch.Reload(ctx, j.ID)
	}
	size, err := s.logs.Append(ctx, j.ID, start, body)
	var rerr *store.RangeError
	if errors.As(err, &rerr) {
		w.Header().Set(runnerapi.HeaderRange, fmt.Sprintf("0-%d", rerr.Size))
		s.jobStatusHeaders(w, j.Status)
		httpapi.WriteError(w, http.StatusRequestedRangeNotSatisfiable, "416 Range Not Satisfiable")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "appending trace", err)
		return
	}
	// An in-process watcher (berth run) reads the log when it grows.
	s.pipelines.Notify(j.PipelineID)
	if err := s.store.TouchJob(ctx, j.ID, s.clock.Now().UTC()); err != nil && !errors.Is(err, store.ErrConflict) {
		httpapi.InternalError(s.log, w, "touching job", err)
		return
	}
	s.metrics.trace.Add(float64(len(body)))
	w.Header().Set(runnerapi.HeaderRange, fmt.Sprintf("0-%d", size))
	s.jobStatusHeaders(w, j.Status)
	w.WriteHeader(http.StatusAccepted)
}

// traceTooLarge fails a job whose log would grow past MaxTraceSize with
// trace_size_exceeded and answers 403, as GitLab does: the runner aborts
// the job, and the coordinator's disk is bounded whatever a job holding
// its own token sends.
func (s *API) traceTooLarge(w http.ResponseWriter, r *http.Request, j *store.Job, size int64) {
	s.metrics.traceRejected.Inc()
	now := s.clock.Now().UTC()
	_, err := s.dispatch.Transition(r.Context(), j.ID, []store.Status{store.StatusRunning, store.StatusCanceling},
		store.JobUpdate{Status: store.StatusFailed, FailureReason: runnerapi.TraceSizeExceeded, FinishedAt: now, UpdatedAt: now})
	switch {
	case err == nil:
		s.log.Warn("job log over the size limit: job failed", "job_id", j.ID, "size", size, "limit", s.cfg.MaxTraceSize)
	case !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound):
		httpapi.InternalError(s.log, w, "failing a job over the log size limit", err)
		return
	}
	httpapi.WriteError(w, http.StatusForbidden, "403 Forbidden - Job log size limit exceeded")
}
