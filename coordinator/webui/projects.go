package webui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
)

type projectRow struct {
	Project *store.Project
	Latest  *store.Pipeline
}

type projectsPage struct {
	pageBase
	Projects []projectRow
}

func (u *UI) handleProjects(w http.ResponseWriter, r *http.Request) {
	ps, err := u.st.ListProjects(r.Context())
	if err != nil {
		u.internal(w, r, "listing projects", err)
		return
	}
	page := &projectsPage{pageBase: pageBase{Title: "Projects", Nav: "projects"}}
	for _, p := range ps {
		row := projectRow{Project: p}
		if latest, err := u.st.ListPipelines(r.Context(), store.PipelineFilter{ProjectID: p.ID, Newest: true, Limit: 1}); err != nil {
			u.internal(w, r, "listing pipelines", err)
			return
		} else if len(latest) > 0 {
			row.Latest = latest[0]
		}
		page.Projects = append(page.Projects, row)
	}
	u.render(w, r, http.StatusOK, "projects", page)
}

// projectRoute serves the pages under /PROJECT/-/.
func (u *UI) projectRoute(w http.ResponseWriter, r *http.Request, projectPath, rest string) {
	p, err := u.st.ProjectByPath(r.Context(), projectPath)
	if errors.Is(err, store.ErrNotFound) {
		u.notFound(w, r, "project")
		return
	}
	if err != nil {
		u.internal(w, r, "loading project", err)
		return
	}
	parts := strings.SplitN(rest, "/", 4)
	post := r.Method == http.MethodPost
	switch {
	case len(parts) == 1 && parts[0] == "pipelines" && isRead(r):
		u.handlePipelines(w, r, p)
		return
	case len(parts) >= 2 && parts[0] == "pipelines":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil || id <= 0 {
			break
		}
		pl, err := u.st.GetPipeline(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) || err == nil && pl.ProjectID != p.ID {
			u.notFound(w, r, "pipeline")
			return
		}
		if err != nil {
			u.internal(w, r, "loading pipeline", err)
			return
		}
		switch {
		case len(parts) == 2 && isRead(r):
			u.handlePipeline(w, r, p, pl)
			return
		case len(parts) == 3 && parts[2] == "events" && isRead(r):
			u.handlePipelineEvents(w, r, pl)
			return
		case len(parts) == 3 && post && (parts[2] == "cancel" || parts[2] == "retry"):
			u.handlePipelineAction(w, r, p, pl, parts[2])
			return
		}
	case len(parts) >= 2 && parts[0] == "jobs":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil || id <= 0 {
			break
		}
		j, err := u.st.GetJob(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) || err == nil && j.ProjectID != p.ID {
			u.notFound(w, r, "job")
			return
		}
		if err != nil {
			u.internal(w, r, "loading job", err)
			return
		}
		switch {
		case len(parts) == 2 && isRead(r):
			u.handleJob(w, r, p, j)
			return
		case len(parts) == 3 && parts[2] == "raw" && isRead(r):
			u.handleRawLog(w, r, j)
			return
		case len(parts) == 3 && parts[2] == "log" && isRead(r):
			u.handleLogEvents(w, r, j)
			return
		case len(parts) == 3 && post && (parts[2] == "cancel" || parts[2] == "retry" || parts[2] == "play"):
			u.handleJobAction(w, r, p, j, parts[2])
			return
		case len(parts) >= 4 && parts[2] == "artifacts" && isRead(r):
			u.handleArtifacts(w, r, p, j, parts[3])
			return
		}
	}
	u.notFound(w, r, "page")
}

// pipelineQuery is a pipeline list's filter, from the query string.
type pipelineQuery struct {
	Status store.Status
	Ref    string
	Sha    string
	Page   int
}

const pipelinesPerPage = 20

// parsePipelineQuery reads ?status=&ref=&sha=&page=. Every value is
// checked: a status GitLab names (passed is success), a ref of at most 255
// printable characters, a hex commit (prefix) of at most 40, a page from 1
// to 10000.
func parsePipelineQuery(q url.Values) (pipelineQuery, error) {
	out := pipelineQuery{Page: 1}
	if s := q.Get("status"); s != "" {
		if s == "passed" {
			s = string(store.StatusSuccess)
		}
		if !store.Status(s).Valid() {
			return out, fmt.Errorf("status %q: want one of success, failed, running, pending, canceled, skipped, manual, created", s)
		}
		out.Status = store.Status(s)
	}
	if ref := q.Get("ref"); ref != "" {
		if len(ref) > 255 || strings.IndexFunc(ref, func(c rune) bool { return c < 0x20 || c == 0x7f || c == '\uFFFD' }) >= 0 {
			return out, errors.New("ref: at most 255 printable characters")
		}
		out.Ref = ref
	}
	if sha := q.Get("sha"); sha != "" {
		if len(sha) > 40 || strings.Trim(strings.ToLower(sha), "0123456789abcdef") != "" {
			return out, errors.New("sha: a commit id in hex (at most 40 digits)")
		}
		out.Sha = strings.ToLower(sha)
	}
	if pg := q.Get("page"); pg != "" {
		n, err := strconv.Atoi(pg)
		if err != nil || n < 1 || n > 10000 {
			return out, errors.New("page: a number from 1 to 10000")
		}
		out.Page = n
	}
	return out, nil
}

// URL is the list's URL with the filter and another page.
func (q pipelineQuery) URL(base string, page int) string {
	v := url.Values{}
	if q.Status != "" {
		v.Set("status", string(q.Status))
	}
	if q.Ref != "" {
		v.Set("ref", q.Ref)
	}
	if q.Sha != "" {
		v.Set("sha", q.Sha)
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	if len(v) == 0 {
		return base
	}
	return base + "?" + v.Encode()
}

type stageDot struct {
	Name   string
	Status store.Status
}

type pipelineRow struct {
	Pipeline *store.Pipeline
	Stages   []stageDot
	Duration time.Duration
	Running  bool
}

type pipelinesPage struct {
	pageBase
	Project  *store.Project
	Query    pipelineQuery
	Error    string
	Rows     []pipelineRow
	ListURL  string
	PrevURL  string
	NextURL  string
	Statuses []store.Status
	// Schedules are the project's pipeline schedules, shown above the
	// first page of an unfiltered list.
	Schedules []scheduleRow
}

// scheduleRow is a pipeline schedule with its newest pipeline.
type scheduleRow struct {
	*store.PipelineSchedule
	Last *store.Pipeline
}

func (u *UI) handlePipelines(w http.ResponseWriter, r *http.Request, p *store.Project) {
	base := "/" + p.Path + "/-/pipelines"
	page := &pipelinesPage{pageBase: pageBase{Title: "Pipelines · " + p.Path, Nav: "projects",
		Crumbs: []crumb{{p.Path, base}, {"Pipelines", ""}}}, Project: p, ListURL: base,
		Statuses: []store.Status{store.StatusRunning, store.StatusPending, store.StatusSuccess, store.StatusFailed,
			store.StatusCanceled, store.StatusSkipped, store.StatusManual, store.StatusCreated}}
	q, err := parsePipelineQuery(r.URL.Query())
	page.Query = q
	if err != nil {
		page.Error = err.Error()
		u.render(w, r, http.StatusBadRequest, "pipelines", page)
		return
	}
	f := store.PipelineFilter{ProjectID: p.ID, Ref: q.Ref, Newest: true, Limit: pipelinesPerPage + 1,
		Offset: (q.Page - 1) * pipelinesPerPage}
	if q.Status != "" {
		f.Statuses = []store.Status{q.Status}
	}
	if len(q.Sha) == 40 {
		f.Sha = q.Sha
	}
	pls, err := u.st.ListPipelines(r.Context(), f)
	if err != nil {
		u.internal(w, r, "listing pipelines", err)
		return
	}
	if q.Sha != "" && len(q.Sha) < 40 {
		// A prefix: filtered here (a page may then hold fewer rows).
		kept := pls[:0]
		for _, pl := range pls {
			if strings.HasPrefix(pl.Sha, q.Sha) {
				kept = append(kept, pl)
			}
		}
		pls = kept
	}
	if len(pls) > pipelinesPerPage {
		pls = pls[:pipelinesPerPage]
		page.NextURL = q.URL(base, q.Page+1)
	}
	if q.Page > 1 {
		page.PrevURL = q.URL(base, q.Page-1)
	}
	if q.Page == 1 && q.Status == "" && q.Ref == "" && q.Sha == "" {
		scheds, err := u.st.ListPipelineSchedules(r.Context(), p.ID)
		if err != nil {
			u.internal(w, r, "listing pipeline schedules", err)
			return
		}
		for _, ps := range scheds {
			row := scheduleRow{PipelineSchedule: ps}
			if ps.LastPipelineID != 0 {
				if row.Last, err = u.st.GetPipeline(r.Context(), ps.LastPipelineID); err != nil && !errors.Is(err, store.ErrNotFound) {
					u.internal(w, r, "loading a schedule's pipeline", err)
					return
				}
			}
			page.Schedules = append(page.Schedules, row)
		}
	}
	now := u.clock.Now()
	for _, pl := range pls {
		jobs, err := u.st.ListJobs(r.Context(), store.JobFilter{PipelineID: pl.ID})
		if err != nil {
			u.internal(w, r, "listing jobs", err)
			return
		}
		row := pipelineRow{Pipeline: pl, Running: !pl.Status.Finished()}
		for _, s := range stagesOf(jobs) {
			row.Stages = append(row.Stages, stageDot{Name: s.Name, Status: s.Status})
		}
		row.Duration = pipelineDuration(pl, now)
		page.Rows = append(page.Rows, row)
	}
	u.render(w, r, http.StatusOK, "pipelines", page)
}

// pipelineDuration is how long a pipeline has run (so far).
func pipelineDuration(pl *store.Pipeline, now time.Time) time.Duration {
	if pl.StartedAt.IsZero() {
		return 0
	}
	end := pl.FinishedAt
	if end.IsZero() {
		end = now
	}
	return end.Sub(pl.StartedAt)
}

// stage is a pipeline's stage with its latest jobs.
type stage struct {
	Name   string
	Index  int
	Status store.Status
	Jobs   []*jobView
}

// jobView is a job as the pipeline pages show it.
type jobView struct {
	*store.Job
	Graph        graph.Job
	AllowFailure bool
	Needs        []string
	Bridge       bool
}

// Duration is how long the job has run (so far).
func (j *jobView) Duration(now time.Time) time.Duration { return jobDuration(j.Job, now) }

func jobDuration(j *store.Job, now time.Time) time.Duration {
	if j.StartedAt.IsZero() {
		return 0
	}
	end := j.FinishedAt
	if end.IsZero() {
		end = now
	}
	return end.Sub(j.StartedAt)
}

func viewOf(j *store.Job) *jobView {
	g := graph.Decode(j.Graph)
	v := &jobView{Job: j, Graph: g, Bridge: g.Bridge != nil}
	n := &graph.Node{Status: j.Status, ExitCode: j.ExitCode, Graph: g}
	v.AllowFailure = n.AllowedToFail()
	for _, need := range g.Needs {
		v.Needs = append(v.Needs, need.Job)
	}
	return v
}

// stagesOf groups a pipeline's latest jobs (not retried) by stage, in
// stage order, each with its composite status.
func stagesOf(jobs []*store.Job) []*stage {
	byName := map[string]*stage{}
	var out []*stage
	nodes := map[*stage][]*graph.Node{}
	for _, j := range jobs {
		if j.Retried {
			continue
		}
		v := viewOf(j)
		s := byName[j.Stage]
		if s == nil {
			s = &stage{Name: j.Stage, Index: v.Graph.StageIndex}
			byName[j.Stage] = s
			out = append(out, s)
		}
		s.Jobs = append(s.Jobs, v)
		nodes[s] = append(nodes[s], &graph.Node{ID: j.ID, Name: j.Name, Status: j.Status, ExitCode: j.ExitCode, Graph: v.Graph})
	}
	for _, s := range out {
		s.Status, _ = graph.CompositeStatus(nodes[s])
	}
	// By index, then by first appearance.
	slices.SortStableFunc(out, func(a, b *stage) int { return a.Index - b.Index })
	return out
}
