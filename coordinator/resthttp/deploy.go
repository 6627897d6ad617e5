package resthttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
)

// deployRoutes registers GitLab's releases, environments, deployments and
// Pages endpoints (instance admins, the project's reporters; stopping an
// environment: developers), and the Pages sites themselves.
func (s *API) deployRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v4/projects/{project}/releases", s.projectMember(store.AccessReporter, s.handleListReleases))
	mux.HandleFunc("GET /api/v4/projects/{project}/releases/{tag}", s.projectMember(store.AccessReporter, s.handleGetRelease))
	mux.HandleFunc("GET /api/v4/projects/{project}/environments", s.projectMember(store.AccessReporter, s.handleListEnvironments))
	mux.HandleFunc("GET /api/v4/projects/{project}/environments/{environment}", s.projectMember(store.AccessReporter, s.handleGetEnvironment))
	mux.HandleFunc("POST /api/v4/projects/{project}/environments/{environment}/stop", s.projectMember(store.AccessDeveloper, s.handleStopEnvironment))
	mux.HandleFunc("GET /api/v4/projects/{project}/deployments", s.projectMember(store.AccessReporter, s.handleListDeployments))
	mux.HandleFunc("GET /api/v4/projects/{project}/deployments/{deployment}", s.projectMember(store.AccessReporter, s.handleGetDeployment))
	mux.HandleFunc("GET /api/v4/projects/{project}/pages", s.projectMember(store.AccessReporter, s.handleGetPages))
}

func (s *API) releaseJSON(p *store.Project, r *store.Release) restapi.ReleaseJSON {
	out := restapi.ReleaseJSON{TagName: r.TagName, Name: r.Name, Description: r.Description, CreatedAt: httpapi.RFC3339OrNil(r.CreatedAt),
		ReleasedAt: httpapi.RFC3339OrNil(r.ReleasedAt), UpcomingRelease: r.ReleasedAt.After(s.clock.Now())}
	out.Milestones = make([]struct {
		Title string `json:"title"`
	}, len(r.Milestones))
	for i, m := range r.Milestones {
		out.Milestones[i].Title = m
	}
	out.Commit.ID, out.Commit.ShortID = r.Sha, dispatch.ShortSha(r.Sha)
	out.TagPath = "/" + p.Path + "/-/tags/" + r.TagName
	out.Assets.Sources, out.Assets.Links = []map[string]any{}, []restapi.ReleaseLinkJSON{}
	for _, l := range r.Links {
		out.Assets.Links = append(out.Assets.Links, restapi.ReleaseLinkJSON{ID: l.ID, Name: l.Name, URL: l.URL, DirectAssetURL: l.URL,
			DirectAssetPath: l.DirectAssetPath, LinkType: l.LinkType})
	}
	out.Assets.Count = len(out.Assets.Links)
	out.Links.Self = fmt.Sprintf("%s/api/v4/projects/%d/releases/%s", s.baseURL, p.ID, url.PathEscape(r.TagName))
	return out
}

func (s *API) handleListReleases(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	rs, err := s.store.ListReleases(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing releases", err)
		return
	}
	q := r.URL.Query()
	switch q.Get("order_by") {
	case "", "released_at":
	case "created_at":
		slices.SortStableFunc(rs, func(a, b *store.Release) int { return b.CreatedAt.Compare(a.CreatedAt) })
	default:
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - order_by does not have a valid value")
		return
	}
	if !sortList(w, q.Get("sort"), "desc", rs) {
		return
	}
	page, ok := httpapi.Paginate(w, r, len(rs))
	if !ok {
		return
	}
	out := []restapi.ReleaseJSON{}
	for _, rel := range rs[page.From:page.To] {
		out = append(out, s.releaseJSON(p, rel))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handleGetRelease(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	rel, err := s.store.GetRelease(r.Context(), p.ID, r.PathValue("tag"))
	if errors.Is(err, store.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading release", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.releaseJSON(p, rel))
}

func environmentJSON(e *store.Environment) restapi.EnvironmentJSON {
	out := restapi.EnvironmentJSON{ID: e.ID, Name: e.Name, Slug: e.Slug, State: e.State, Tier: e.Tier,
		CreatedAt: httpapi.RFC3339OrNil(e.CreatedAt), UpdatedAt: httpapi.RFC3339OrNil(e.UpdatedAt), AutoStopAt: httpapi.RFC3339OrNil(e.AutoStopAt)}
	if e.ExternalURL != "" {
		u := e.ExternalURL
		out.ExternalURL = &u
	}
	return out
}

// deploymentJSON renders d with its environment and job (looked up in
// the maps, loaded when missing).
func (s *API) deploymentJSON(ctx context.Context, d *store.Deployment, envs map[int64]*store.Environment) (restapi.DeploymentJSON, error) {
	out := restapi.DeploymentJSON{ID: d.ID, IID: d.IID, Ref: d.Ref, Sha: d.Sha, Status: d.Status, CreatedAt: httpapi.RFC3339OrNil(d.CreatedAt),
		UpdatedAt: httpapi.RFC3339OrNil(d.UpdatedAt), FinishedAt: httpapi.RFC3339OrNil(d.FinishedAt)}
	if e := envs[d.EnvironmentID]; e != nil {
		ej := environmentJSON(e)
		out.Environment = &ej
	}
	j, err := s.store.GetJob(ctx, d.JobID)
	if err == nil {
		jj := s.jobJSON(j, nil)
		out.Deployable = &jj
	} else if !errors.Is(err, store.ErrNotFound) {
		return out, err
	}
	return out, nil
}

func (s *API) handleListEnvironments(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	envs, err := s.store.ListEnvironments(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing environments", err)
		return
	}
	q := r.URL.Query()
	name, search, states := q.Get("name"), q.Get("search"), q.Get("states")
	if states != "" && states != store.EnvironmentAvailable && states != store.EnvironmentStopped {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - states does not have a valid value")
		return
	}
	envs = slices.DeleteFunc(envs, func(e *store.Environment) bool {
		return (name != "" && e.Name != name) || (search != "" && !strings.Contains(e.Name, search)) || (states != "" && e.State != states)
	})
	page, ok := httpapi.Paginate(w, r, len(envs))
	if !ok {
		return
	}
	out := []restapi.EnvironmentJSON{}
	for _, e := range envs[page.From:page.To] {
		out = append(out, environmentJSON(e))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// environment loads the {environment} of the request's project,
// answering 404 itself.
func (s *API) environment(w http.ResponseWriter, r *http.Request, p *store.Project) *store.Environment {
	id, ok := httpapi.PathID(w, r, "environment")
	if !ok {
		return nil
	}
	e, err := s.store.GetEnvironment(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && e.ProjectID != p.ID) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Environment Not Found")
		return nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading environment", err)
		return nil
	}
	return e
}

func (s *API) handleGetEnvironment(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	e := s.environment(w, r, p)
	if e == nil {
		return
	}
	out := environmentJSON(e)
	last, err := s.pipelines.LastDeployment(r.Context(), e.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "loading last deployment", err)
		return
	}
	if last != nil {
		dj, err := s.deploymentJSON(r.Context(), last, nil)
		if err != nil {
			httpapi.InternalError(s.log, w, "loading last deployment", err)
			return
		}
		out.LastDeployment = &dj
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handleStopEnvironment(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	e := s.environment(w, r, p)
	if e == nil {
		return
	}
	ne, err := s.pipelines.StopEnvironment(r.Context(), e.ID)
	if err != nil {
		s.apiError(w, "stopping environment", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, environmentJSON(ne))
}

// deploymentOrder are the order_by values of GET /deployments.
var deploymentOrder = map[string]func(a, b *store.Deployment) int{
	"id":          func(a, b *store.Deployment) int { return cmpInt(a.ID, b.ID) },
	"iid":         func(a, b *store.Deployment) int { return cmpInt(a.IID, b.IID) },
	"created_at":  func(a, b *store.Deployment) int { return a.CreatedAt.Compare(b.CreatedAt) },
	"updated_at":  func(a, b *store.Deployment) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
	"finished_at": func(a, b *store.Deployment) int { return a.FinishedAt.Compare(b.FinishedAt) },
	"ref":         func(a, b *store.Deployment) int { return strings.Compare(a.Ref, b.Ref) },
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var deploymentStatuses = []string{"created", "running", "success", "failed", "canceled", "skipped", "blocked"}

func (s *API) handleListDeployments(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	ctx := r.Context()
	q := r.URL.Query()
	f := store.DeploymentFilter{ProjectID: p.ID}
	if st := q.Get("status"); st != "" {
		if !slices.Contains(deploymentStatuses, st) {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - status does not have a valid value")
			return
		}
		f.Statuses = []string{st}
	}
	envList, err := s.store.ListEnvironments(ctx, p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing environments", err)
		return
	}
	envs := map[int64]*store.Environment{}
	for _, e := range envList {
		envs[e.ID] = e
	}
	if name := q.Get("environment"); name != "" {
		f.EnvironmentID = -1 // none matches unless the environment exists
		for _, e := range envList {
			if e.Name == name {
				f.EnvironmentID = e.ID
			}
		}
	}
	orderBy := q.Get("order_by")
	if orderBy == "" {
		orderBy = "id"
	}
	cmp, ok := deploymentOrder[orderBy]
	if !ok {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - order_by does not have a valid value")
		return
	}
	var ds []*store.Deployment
	if f.EnvironmentID != -1 {
		if ds, err = s.store.ListDeployments(ctx, f); err != nil {
			httpapi.InternalError(s.log, w, "listing deployments", err)
			return
		}
	}
	slices.SortStableFunc(ds, func(a, b *store.Deployment) int {
		if c := cmp(a, b); c != 0 {
			return c
		}
		return cmpInt(a.ID, b.ID)
	})
	if !sortList(w, q.Get("sort"), "asc", ds) {
		return
	}
	page, ok := httpapi.Paginate(w, r, len(ds))
	if !ok {
		return
	}
	out := []restapi.DeploymentJSON{}
	for _, d := range ds[page.From:page.To] {
		dj, err := s.deploymentJSON(ctx, d, envs)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing deployments", err)
			return
		}
		out = append(out, dj)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *API) handleGetDeployment(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	id, ok := httpapi.PathID(w, r, "deployment")
	if !ok {
		return
	}
	ctx := r.Context()
	ds, err := s.store.ListDeployments(ctx, store.DeploymentFilter{ProjectID: p.ID})
	if err != nil {
		httpapi.InternalError(s.log, w, "loading deployment", err)
		return
	}
	for _, d := range ds {
		if d.ID != id {
			continue
		}
		e, err := s.store.GetEnvironment(ctx, d.EnvironmentID)
		if err != nil {
			httpapi.InternalError(s.log, w, "loading deployment", err)
			return
		}
		dj, err := s.deploymentJSON(ctx, d, map[int64]*store.Environment{e.ID: e})
		if err != nil {
			httpapi.InternalError(s.log, w, "loading deployment", err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, dj)
		return
	}
	httpapi.WriteError(w, http.StatusNotFound, "404 Deployment Not Found")
}

func (s *API) handleGetPages(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	ds, err := s.store.ListPagesDeployments(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing Pages deployments", err)
		return
	}
	if len(ds) == 0 {
		httpapi.WriteError(w, http.StatusNotFound, "404 Not Found")
		return
	}
	// The main site first, then the path prefixes in order: what a
	// reader expects, whichever job finished first.
	slices.SortStableFunc(ds, func(a, b *store.PagesDeployment) int { return strings.Compare(a.PathPrefix, b.PathPrefix) })
	out := restapi.PagesJSON{URL: s.pages.URL(p.Path, "") + "/", Deployments: []restapi.PagesDeploymentJSON{}}
	for _, d := range ds {
		root := "public"
		if j, err := s.store.GetJob(r.Context(), d.JobID); err == nil {
			if g := graph.Decode(j.Graph).Pages; g != nil {
				root = g.Publish
			}
		}
		out.Deployments = append(out.Deployments, restapi.PagesDeploymentJSON{CreatedAt: httpapi.RFC3339OrNil(d.CreatedAt),
			URL: s.pages.URL(p.Path, d.PathPrefix) + "/", PathPrefix: d.PathPrefix, RootDirectory: root,
			ExpiresAt: httpapi.RFC3339OrNil(d.ExpireAt), JobID: d.JobID, FileCount: d.FileCount, Size: d.Size})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// sortList applies a list API's sort parameter (asc or desc; "" is def)
// to list, which is in def order; anything else is GitLab's 400, written
// to w, and false.
func sortList[T any](w http.ResponseWriter, sort, def string, list []T) bool {
	switch sort {
	case "", def:
	case "asc", "desc":
		slices.Reverse(list)
	default:
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - sort does not have a valid value")
		return false
	}
	return true
}
