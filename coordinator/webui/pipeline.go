package webui

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/testreport"
)

type pipelinePage struct {
	pageBase
	Project    *store.Project
	Pipeline   *store.Pipeline
	URL        string
	View       string
	Stages     []*stage
	Jobs       []*jobView // latest jobs, by id
	Retried    int
	Graph      *needsGraph
	Downstream []*store.Pipeline
	Upstream   *store.Pipeline
	Version    string
	Variables  []string // pipeline variable keys (values never shown)
	Warnings   bool
	// CanAct: the reader may cancel and retry it.
	CanAct bool
	// Tests is the test report (view tests).
	Tests *testsView
}

// testsView is a pipeline's test report as the Tests view shows it.
type testsView struct {
	Suites []testSuiteView
	Total  testreport.Counts
	Time   float64
	// Failures are the failed and erroring cases, suite by suite.
	Failures []testFailure
}

type testSuiteView struct {
	Suite *testreport.Suite
	testreport.Counts
}

type testFailure struct {
	Suite string
	testreport.Case
}

// testsOf builds the Tests view from a pipeline's suites.
func testsOf(suites []*testreport.Suite) *testsView {
	v := &testsView{}
	v.Total, v.Time = testreport.Sum(suites)
	for _, s := range suites {
		v.Suites = append(v.Suites, testSuiteView{s, s.Count()})
		if s.Error != "" {
			continue
		}
		for _, tc := range s.Cases {
			if tc.Status == testreport.StatusFailed || tc.Status == testreport.StatusError {
				v.Failures = append(v.Failures, testFailure{s.Name, tc})
			}
		}
	}
	return v
}

// Cancelable and Retryable say which pipeline actions apply.
func (p *pipelinePage) Cancelable() bool { return !p.Pipeline.Status.Finished() }
func (p *pipelinePage) Retryable() bool {
	for _, j := range p.Jobs {
		if j.Status == store.StatusFailed || j.Status == store.StatusCanceled {
			return true
		}
	}
	return false
}

// fingerprint identifies what a pipeline page shows of a state: the
// pipeline's status and each job's, so an event stream tells a page to
// refresh only when that changed (not when a log grew).
func fingerprint(st pipelines.PipelineState) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%d|", st.Pipeline.Status, st.Pipeline.UpdatedAt.UnixMicro())
	for _, j := range st.Jobs {
		fmt.Fprintf(h, "%d:%s:%t:%d,", j.ID, j.Status, j.Retried, j.StartedAt.UnixMicro())
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func (u *UI) handlePipeline(w http.ResponseWriter, r *http.Request, p *store.Project, pl *store.Pipeline) {
	st, err := u.opts.Pipelines.PipelineState(r.Context(), pl.ID)
	if err != nil {
		u.internal(w, r, "reading pipeline", err)
		return
	}
	view := r.URL.Query().Get("view")
	switch view {
	case "", "stages":
		view = "stages"
	case "needs", "jobs", "tests":
	default:
		u.fail(w, r, http.StatusBadRequest, "view: want stages, needs, jobs or tests")
		return
	}
	url := fmt.Sprintf("/%s/-/pipelines/%d", p.Path, pl.ID)
	page := &pipelinePage{pageBase: pageBase{Title: fmt.Sprintf("Pipeline #%d · %s", pl.ID, p.Path), Nav: "projects",
		Crumbs: []crumb{{p.Path, "/" + p.Path + "/-/pipelines"}, {"Pipelines", "/" + p.Path + "/-/pipelines"}, {fmt.Sprintf("#%d", pl.ID), ""}}},
		Project: p, Pipeline: st.Pipeline, URL: url, View: view, Version: fingerprint(st)}
	for _, v := range st.Pipeline.Variables {
		page.Variables = append(page.Variables, v.Key)
	}
	if page.CanAct, err = u.canActIn(r, p.ID, st.Pipeline.Protected); err != nil {
		u.internal(w, r, "checking a membership", err)
		return
	}
	page.Stages = stagesOf(st.Jobs)
	for _, s := range page.Stages {
		page.Jobs = append(page.Jobs, s.Jobs...)
		for _, j := range s.Jobs {
			if j.AllowFailure && (j.Status == store.StatusFailed || j.Status == store.StatusCanceled) {
				page.Warnings = true
			}
		}
	}
	for _, j := range st.Jobs {
		if j.Retried {
			page.Retried++
		}
	}
	if view == "jobs" {
		// The table lists jobs by id, as they were created.
		slices.SortFunc(page.Jobs, func(a, b *jobView) int { return cmp.Compare(a.ID, b.ID) })
	}
	if view == "needs" {
		page.Graph = layoutNeeds(page.Stages, "/"+p.Path)
	}
	if view == "tests" {
		suites, err := testreport.OfPipeline(r.Context(), u.st, u.opts.Artifacts, pl.ID, u.clock.Now())
		if err != nil {
			u.internal(w, r, "reading test reports", err)
			return
		}
		page.Tests = testsOf(suites)
	}
	if ds, err := u.opts.Pipelines.DownstreamPipelines(r.Context(), pl.ID); err == nil {
		page.Downstream = ds
	}
	if pl.UpstreamPipelineID != 0 {
		if up, err := u.st.GetPipeline(r.Context(), pl.UpstreamPipelineID); err == nil {
			page.Upstream = up
		}
	}
	u.render(w, r, http.StatusOK, "pipeline", page)
}

// handlePipelineAction cancels or retries a pipeline (admins and the
// project's developers, maintainers on a protected ref).
func (u *UI) handlePipelineAction(w http.ResponseWriter, r *http.Request, p *store.Project, pl *store.Pipeline, action string) {
	if !u.mayAct(w, r, p, pl.Protected) {
		return
	}
	var err error
	switch action {
	case "cancel":
		_, err = u.opts.Pipelines.CancelPipeline(r.Context(), pl.ID)
	case "retry":
		_, err = u.opts.Pipelines.RetryPipeline(r.Context(), pl.ID)
	}
	if errors.Is(err, pipelines.ErrNotAllowed) {
		u.fail(w, r, http.StatusConflict, "Pipeline #"+fmt.Sprint(pl.ID)+" cannot be "+map[string]string{"cancel": "canceled", "retry": "retried"}[action]+" now: "+err.Error())
		return
	}
	if err != nil {
		u.internal(w, r, action+" pipeline", err)
		return
	}
	u.log.Info("pipeline "+action+" from the web UI", "pipeline_id", pl.ID, "user", principalOf(r.Context()).Name)
	http.Redirect(w, r, fmt.Sprintf("/%s/-/pipelines/%d", p.Path, pl.ID), http.StatusSeeOther)
}

// mayAct answers 403 itself for a principal who may only look at a
// pipeline or job of project p (canActIn).
func (u *UI) mayAct(w http.ResponseWriter, r *http.Request, p *store.Project, protected bool) bool {
	ok, err := u.canActIn(r, p.ID, protected)
	if err != nil {
		u.internal(w, r, "checking a membership", err)
		return false
	}
	if !ok {
		what := "a developer"
		if protected {
			what = "a maintainer (the ref is protected)"
		}
		u.fail(w, r, http.StatusForbidden, "You may look, not act: acting here takes an admin or "+what+" of "+p.Path+". An admin may make you one (berth members).")
	}
	return ok
}

// needsGraph is a pipeline laid out by its needs: a column per depth,
// drawn as SVG (the jobs table and each job's "needs" say the same in
// words).
type needsGraph struct {
	Width, Height int
	Nodes         []graphNode
	Edges         []graphEdge
	Columns       int
}

type graphNode struct {
	X, Y   int
	Job    *jobView
	Label  string
	URL    string
	Needs  string
	Status store.Status
}

type graphEdge struct{ Path string }

const (
	nodeW, nodeH = 190, 34
	gapX, gapY   = 56, 10
)

// layoutNeeds places each job in a column: a job with needs one right of
// the deepest job it needs, a job without needs right of every job of the
// earlier stages (it waits for them).
func layoutNeeds(stages []*stage, projectURL string) *needsGraph {
	byName := map[string]*jobView{}
	for _, s := range stages {
		for _, j := range s.Jobs {
			byName[j.Name] = j
		}
	}
	layer := map[*jobView]int{}
	var depth func(j *jobView, seen int) int
	prevMax := -1 // deepest column of the stages so far
	depth = func(j *jobView, seen int) int {
		if l, ok := layer[j]; ok {
			return l
		}
		if !j.Graph.DAG || seen > len(byName) {
			return prevMax + 1
		}
		l := 0
		for _, n := range j.Needs {
			if dep := byName[n]; dep != nil && dep != j {
				l = max(l, depth(dep, seen+1)+1)
			}
		}
		layer[j] = l
		return l
	}
	for _, s := range stages {
		stageMax := prevMax
		for _, j := range s.Jobs {
			l := depth(j, 0)
			layer[j] = l
			stageMax = max(stageMax, l)
		}
		prevMax = stageMax
	}
	g := &needsGraph{}
	rows := map[int]int{}
	pos := map[*jobView]graphNode{}
	for _, s := range stages {
		for _, j := range s.Jobs {
			l := layer[j]
			n := graphNode{X: 8 + l*(nodeW+gapX), Y: 8 + rows[l]*(nodeH+gapY), Job: j, Label: truncate(j.Name, 24),
				URL: fmt.Sprintf("%s/-/jobs/%d", projectURL, j.ID), Status: j.Status, Needs: strings.Join(j.Needs, ", ")}
			rows[l]++
			pos[j] = n
			g.Nodes = append(g.Nodes, n)
			g.Width = max(g.Width, n.X+nodeW+8)
			g.Height = max(g.Height, n.Y+nodeH+8)
			g.Columns = max(g.Columns, l+1)
		}
	}
	for _, n := range g.Nodes {
		for _, need := range n.Job.Needs {
			from, ok := pos[byName[need]]
			if !ok {
				continue
			}
			x1, y1 := from.X+nodeW, from.Y+nodeH/2
			x2, y2 := n.X, n.Y+nodeH/2
			mid := (x1 + x2) / 2
			g.Edges = append(g.Edges, graphEdge{Path: fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, y1, mid, y1, mid, y2, x2, y2)})
		}
	}
	return g
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
