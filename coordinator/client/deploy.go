package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthci/berth/coordinator/restapi"
)

// listAll follows the pages of a GitLab list endpoint.
func listAll[T any](ctx context.Context, c *Client, path string, q url.Values) ([]T, error) {
	if q == nil {
		q = url.Values{}
	}
	q.Set("per_page", "100")
	var all []T
	for page := 1; ; page++ {
		q.Set("page", strconv.Itoa(page))
		var out []T
		h, err := c.doHeader(ctx, http.MethodGet, path+"?"+q.Encode(), nil, &out, nil)
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
		if h.Get("X-Next-Page") == "" || len(out) == 0 {
			return all, nil
		}
	}
}

func projectPath(project string) string { return "/api/v4/projects/" + url.PathEscape(project) }

// ListReleases lists a project's releases (id or full path), newest first.
func (c *Client) ListReleases(ctx context.Context, project string) ([]restapi.ReleaseJSON, error) {
	return listAll[restapi.ReleaseJSON](ctx, c, projectPath(project)+"/releases", nil)
}

// ListEnvironments lists a project's environments; states (available or
// stopped) filters when not empty.
func (c *Client) ListEnvironments(ctx context.Context, project, states string) ([]restapi.EnvironmentJSON, error) {
	q := url.Values{}
	if states != "" {
		q.Set("states", states)
	}
	return listAll[restapi.EnvironmentJSON](ctx, c, projectPath(project)+"/environments", q)
}

// ListDeployments lists a project's deployments, oldest first; environment
// and status filter when not empty.
func (c *Client) ListDeployments(ctx context.Context, project, environment, status string) ([]restapi.DeploymentJSON, error) {
	q := url.Values{}
	if environment != "" {
		q.Set("environment", environment)
	}
	if status != "" {
		q.Set("status", status)
	}
	return listAll[restapi.DeploymentJSON](ctx, c, projectPath(project)+"/deployments", q)
}
