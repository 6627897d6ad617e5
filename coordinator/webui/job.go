package webui

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/store"
)

// logWindow is how much of a log's end a job page shows (the raw log has
// all of it).
const logWindow = 1 << 20

type jobPage struct {
	pageBase
	Project   *store.Project
	Job       *jobView
	Pipeline  *store.Pipeline
	Runner    *store.Runner
	Artifacts []*store.Artifact
	URL       string
	// Log is the rendered log; LogFrom and LogOffset are where it starts
	// and ends in the log's bytes (the stream goes on from LogOffset).
	Log       template.HTML
	LogFrom   int64
	LogOffset int64
	LogSize   int64
	Truncated bool
	Pending   string
	// CanAct: the reader may cancel, retry or play it.
	CanAct     bool
	Latest     *store.Job // the job that replaced a retried one
	Downstream *store.Pipeline
	Queued     string
	// LogHidden: the log is a debug trace the reader may not read.
	LogHidden bool
}

// Finished, Cancelable, Retryable and Playable say which actions apply,
// as GitLab offers them.
func (p *jobPage) Finished() bool { return p.Job.Status.Finished() }
func (p *jobPage) Cancelable() bool {
	switch p.Job.Status {
	case store.StatusCreated, store.StatusPending, store.StatusRunning, store.StatusScheduled, store.StatusWaitingForResource:
		return true
	}
	return false
}
func (p *jobPage) Retryable() bool {
	return !p.Job.Retried && (p.Job.Status == store.StatusSuccess || p.Job.Status == store.StatusFailed || p.Job.Status == store.StatusCanceled)
}
func (p *jobPage) Playable() bool {
	return p.Job.Status == store.StatusManual || p.Job.Status == store.StatusScheduled
}

func (u *UI) handleJob(w http.ResponseWriter, r *http.Request, p *store.Project, j *store.Job) {
	ctx := r.Context()
	v := viewOf(j)
	page := &jobPage{pageBase: pageBase{Title: fmt.Sprintf("%s (#%d) · %s", j.Name, j.ID, p.Path), Nav: "projects"},
		Project: p, Job: v, URL: fmt.Sprintf("/%s/-/jobs/%d", p.Path, j.ID)}
	page.Crumbs = []crumb{{p.Path, "/" + p.Path + "/-/pipelines"}}
	var err error
	if page.CanAct, err = u.canActIn(r, p.ID, j.Protected); err != nil {
		u.internal(w, r, "checking a membership", err)
		return
	}
	if j.PipelineID != 0 {
		pl, err := u.st.GetPipeline(ctx, j.PipelineID)
		if err != nil {
			u.internal(w, r, "loading pipeline", err)
			return
		}
		page.Pipeline = pl
		page.Crumbs = append(page.Crumbs, crumb{fmt.Sprintf("Pipeline #%d", pl.ID), fmt.Sprintf("/%s/-/pipelines/%d", p.Path, pl.ID)})
		if j.Retried {
			jobs, err := u.st.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
			if err != nil {
				u.internal(w, r, "listing jobs", err)
				return
			}
			for _, o := range jobs {
				if o.Name == j.Name && !o.Retried {
					page.Latest = o
				}
			}
		}
		if v.Bridge {
			if d, err := u.opts.Pipelines.DownstreamOf(ctx, j.ID); err == nil {
				page.Downstream = d
			}
		}
	}
	page.Crumbs = append(page.Crumbs, crumb{fmt.Sprintf("%s #%d", j.Name, j.ID), ""})
	if j.RunnerID != 0 {
		if rn, err := u.st.GetRunner(ctx, j.RunnerID); err == nil {
			page.Runner = rn
		}
	}
	arts, err := u.st.ListArtifacts(ctx, j.ID)
	if err != nil {
		u.internal(w, r, "listing artifacts", err)
		return
	}
	for _, a := range arts {
		if shownArtifact(a.Type) {
			page.Artifacts = append(page.Artifacts, a)
		}
	}
	page.Pending = u.opts.Dispatch.PendingReason(j)
	if j.Status == store.StatusPending {
		page.Queued = formatDuration(u.clock.Now().Sub(j.QueuedSince()))
	}
	may, err := u.mayReadLog(r, j)
	if err != nil {
		u.internal(w, r, "checking a membership", err)
		return
	}
	page.LogHidden = !may
	if may {
		if err := u.renderLog(r, page); err != nil {
			u.internal(w, r, "reading job log", err)
			return
		}
	}
	u.render(w, r, http.StatusOK, "job", page)
}

// renderLog renders the end of a job's log into page: the last logWindow
// bytes from a line's start, its complete lines (the stream renders the
// rest as it comes), all of it once the job is finished.
func (u *UI) renderLog(r *http.Request, page *jobPage) error {
	j := page.Job.Job
	ti, err := u.st.TraceInfo(r.Context(), j.ID)
	if err != nil {
		return err
	}
	from := int64(0)
	if ti.Size > logWindow {
		from = ti.Size - logWindow
		page.Truncated = true
	}
	var buf bytes.Buffer
	if _, err := u.opts.Logs.Read(r.Context(), j.ID, from, &buf); err != nil {
		var re *store.RangeError
		if !errors.As(err, &re) {
			return err
		}
	}
	data := buf.Bytes()
	if from > 0 {
		// Start at a line.
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			from += int64(i + 1)
			data = data[i+1:]
		}
	}
	lr := newLogRenderer(from == 0)
	ops := lr.Write(data)
	offset := from + int64(len(data)) - int64(len(lr.partial))
	if j.Status.Finished() {
		ops = append(ops, lr.Flush()...)
		offset = from + int64(len(data))
	}
	var b strings.Builder
	writeLogHTML(&b, ops)
	page.Log, page.LogFrom, page.LogOffset, page.LogSize = template.HTML(b.String()), from, offset, from+int64(len(data))
	return nil
}

// mayReadLog reports whether the request's principal may read the job's
// log: anyone signed in, but a debug trace (dispatch.DebugMode) only an
// admin or the project's developers and above, as in GitLab.
func (u *UI) mayReadLog(r *http.Request, j *store.Job) (bool, error) {
	if !dispatch.DebugMode(j) {
		return true, nil
	}
	p := principalOf(r.Context())
	switch {
	case p == nil || p.UserID == 0 && !p.CanAct():
		return false, nil
	case p.CanAct():
		return true, nil
	}
	l, err := store.AccessOf(r.Context(), u.st, &store.User{ID: p.UserID, Role: p.Role}, j.ProjectID)
	return l >= store.AccessDeveloper, err
}

// refuseLog answers 403 to a reader who may not read a job's log (or 500
// when that could not be checked); it reports whether it answered.
func (u *UI) refuseLog(w http.ResponseWriter, r *http.Request, j *store.Job) bool {
	may, err := u.mayReadLog(r, j)
	switch {
	case err != nil:
		u.log.Error("checking a membership", "job_id", j.ID, "err", err)
		http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
		return true
	case !may:
		http.Error(w, "403 Forbidden: "+dispatch.DebugTraceForbidden, http.StatusForbidden)
		return true
	}
	return false
}

// handleRawLog serves the whole log as plain text.
func (u *UI) handleRawLog(w http.ResponseWriter, r *http.Request, j *store.Job) {
	if u.refuseLog(w, r, j) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	if _, err := u.opts.Logs.Read(r.Context(), j.ID, 0, w); err != nil {
		u.log.Error("reading job log", "job_id", j.ID, "err", err)
	}
}

// handleJobAction cancels, retries or plays a job (admins and the
// project's developers, maintainers on a protected ref) and leads to the
// job that results.
func (u *UI) handleJobAction(w http.ResponseWriter, r *http.Request, p *store.Project, j *store.Job, action string) {
	if !u.mayAct(w, r, p, j.Protected) {
		return
	}
	ctx := r.Context()
	var (
		nj  *store.Job
		err error
	)
	switch action {
	case "cancel":
		nj, err = u.opts.Pipelines.CancelJob(ctx, j)
	case "retry":
		nj, err = u.opts.Pipelines.RetryJob(ctx, j.ID)
	case "play":
		nj, err = u.opts.Pipelines.PlayJob(ctx, j.ID)
	}
	if errors.Is(err, pipelines.ErrNotAllowed) {
		u.fail(w, r, http.StatusConflict, fmt.Sprintf("Job %s (#%d) cannot be %s now: it is %s.", j.Name, j.ID,
			map[string]string{"cancel": "canceled", "retry": "retried", "play": "started"}[action], statusLabel(j.Status)))
		return
	}
	if err != nil {
		u.internal(w, r, action+" job", err)
		return
	}
	u.log.Info("job "+action+" from the web UI", "job_id", j.ID, "now", nj.ID, "user", principalOf(ctx).Name)
	http.Redirect(w, r, fmt.Sprintf("/%s/-/jobs/%d", p.Path, nj.ID), http.StatusSeeOther)
}

// cappedWriter keeps at most max bytes and then refuses more.
type cappedWriter struct {
	buf bytes.Buffer
	max int
}

var errFull = errors.New("enough for now")

func (c *cappedWriter) Write(p []byte) (int, error) {
	room := c.max - c.buf.Len()
	if room <= 0 {
		return 0, errFull
	}
	if len(p) > room {
		c.buf.Write(p[:room])
		return room, errFull
	}
	return c.buf.Write(p)
}

var _ io.Writer = (*cappedWriter)(nil)

// isBridge tells a trigger job.
func isBridge(j *store.Job) bool { return graph.IsBridge(j) }
