// Package client is a small client for the coordinator's admin API (the
// GitLab-shaped and Berth-only endpoints that take the admin token), used
// by the berth CLI and by tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// Client talks to one coordinator with one admin token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
	// Cell, when not 0, names the cell to act on for a berth router in
	// front of cells (the X-Berth-Cell header; docs/cells.md).
	Cell int64
}

// HeaderCell names the cell of a request for a berth router.
const HeaderCell = "X-Berth-Cell"

// New returns a client for the coordinator at baseURL.
func New(baseURL, adminToken string) *Client {
	return &Client{BaseURL: strings.TrimSuffix(baseURL, "/"), Token: adminToken, HTTP: http.DefaultClient}
}

// APIError is a non-2xx answer.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	_, err := c.doHeader(ctx, method, path, in, out, nil)
	return err
}

// doHeader is do with extra request headers; it returns the response
// headers.
func (c *Client) doHeader(ctx context.Context, method, path string, in, out any, header map[string]string) (http.Header, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set(runnerapi.HeaderPrivateToken, c.Token)
	if c.Cell != 0 {
		req.Header.Set(HeaderCell, strconv.FormatInt(c.Cell, 10))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e runnerapi.ErrorResponse
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Message != nil {
			msg = fmt.Sprint(e.Message)
			if m, ok := e.Message.(map[string]any); ok {
				msg = formatMessage(m)
			}
		}
		return resp.Header, fmt.Errorf("%s %s: %w", method, path, &APIError{Status: resp.StatusCode, Message: msg})
	}
	if out == nil {
		return resp.Header, nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err = io.Copy(w, resp.Body)
		return resp.Header, err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.Header, fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
	}
	return resp.Header, nil
}

// formatMessage flattens GitLab's {"base": ["..."], "key": ["..."]}
// error messages to one line per message.
func formatMessage(m map[string]any) string {
	var lines []string
	for k, v := range m {
		list, _ := v.([]any)
		for _, x := range list {
			if k == "base" {
				lines = append(lines, fmt.Sprint(x))
			} else {
				lines = append(lines, k+" "+fmt.Sprint(x))
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// CreateRunner creates a runner (POST /user/runners) and returns its id and
// authentication token.
func (c *Client) CreateRunner(ctx context.Context, req restapi.CreateRunnerRequest) (*runnerapi.RunnerTokenResponse, error) {
	var out runnerapi.RunnerTokenResponse
	return &out, c.do(ctx, http.MethodPost, "/api/v4/user/runners", req, &out)
}

// ListRunners lists all runners (GET /runners/all, every page).
func (c *Client) ListRunners(ctx context.Context) ([]restapi.RunnerJSON, error) {
	const per = 100
	var all []restapi.RunnerJSON
	for page := 1; ; page++ {
		var out []restapi.RunnerJSON
		if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/runners/all?per_page=%d&page=%d", per, page), nil, &out); err != nil {
			return nil, err
		}
		all = append(all, out...)
		if len(out) < per {
			return all, nil
		}
	}
}

// ResetRegistrationToken mints the instance registration token, or with
// scope "groups"/"projects" and an id, that group's or project's.
func (c *Client) ResetRegistrationToken(ctx context.Context, scope string, id int64) (string, error) {
	path := "/api/v4/runners/reset_registration_token"
	if scope != "" {
		path = fmt.Sprintf("/api/v4/%s/%d/runners/reset_registration_token", scope, id)
	}
	var out runnerapi.RunnerTokenResponse
	err := c.do(ctx, http.MethodPost, path, nil, &out)
	return out.Token, err
}

// Enqueue queues a job (POST /berth/jobs).
func (c *Client) Enqueue(ctx context.Context, spec dispatch.JobSpec) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodPost, "/api/v4/berth/jobs", spec, &out)
}

// Job fetches a job.
func (c *Client) Job(ctx context.Context, project, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/jobs/%d", project, id), nil, &out)
}

// CancelJob cancels a job.
func (c *Client) CancelJob(ctx context.Context, project, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/cancel", project, id), nil, &out)
}

// Trace writes a job's trace to w.
func (c *Client) Trace(ctx context.Context, project, id int64, w io.Writer) error {
	return c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/trace", project, id), nil, w)
}

// Queue fetches the queue insight.
func (c *Client) Queue(ctx context.Context) (*restapi.QueueStats, error) {
	var out restapi.QueueStats
	return &out, c.do(ctx, http.MethodGet, "/api/v4/berth/queue", nil, &out)
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// CurrentUser is whom the client's token belongs to (GET /user).
func (c *Client) CurrentUser(ctx context.Context) (*restapi.CurrentUserJSON, error) {
	var out restapi.CurrentUserJSON
	return &out, c.do(ctx, http.MethodGet, "/api/v4/user", nil, &out)
}

// IsConflict reports whether err is a 409 answer.
func IsConflict(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusConflict
}

// CreateProject creates a project (POST /projects).
func (c *Client) CreateProject(ctx context.Context, req restapi.CreateProjectRequest) (*restapi.ProjectJSON, error) {
	var out restapi.ProjectJSON
	return &out, c.do(ctx, http.MethodPost, "/api/v4/projects", req, &out)
}

// UpdateProject changes a project's settings (PUT /projects/:id); fields
// left nil in req are not changed.
func (c *Client) UpdateProject(ctx context.Context, idOrPath string, req restapi.UpdateProjectRequest) (*restapi.ProjectJSON, error) {
	var out restapi.ProjectJSON
	return &out, c.do(ctx, http.MethodPut, "/api/v4/projects/"+url.PathEscape(idOrPath), req, &out)
}

// Project finds a project by id or full path (GET /projects/:id).
func (c *Client) Project(ctx context.Context, idOrPath string) (*restapi.ProjectJSON, error) {
	var out restapi.ProjectJSON
	return &out, c.do(ctx, http.MethodGet, "/api/v4/projects/"+url.PathEscape(idOrPath), nil, &out)
}

// CreatePipeline starts a pipeline for a ref (POST /projects/:id/pipeline).
func (c *Client) CreatePipeline(ctx context.Context, project int64, req restapi.CreatePipelineRequest) (*restapi.PipelineJSON, error) {
	var out restapi.PipelineJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/pipeline", project), req, &out)
}

// Pipeline fetches a pipeline by id alone (Berth's GET /berth/pipelines/:id).
func (c *Client) Pipeline(ctx context.Context, id int64) (*restapi.PipelineJSON, error) {
	var out restapi.PipelineJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/berth/pipelines/%d", id), nil, &out)
}

// TestReport is a pipeline's test report, from its jobs' JUnit reports.
func (c *Client) TestReport(ctx context.Context, project, pipeline int64) (*restapi.TestReportJSON, error) {
	var out restapi.TestReportJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/test_report", project, pipeline), nil, &out)
}

// PipelineJobs lists every job of a pipeline, retried ones included,
// following the pages.
func (c *Client) PipelineJobs(ctx context.Context, project, pipeline int64) ([]restapi.JobJSON, error) {
	var all []restapi.JobJSON
	for page := 1; ; page++ {
		var out []restapi.JobJSON
		h, err := c.doHeader(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/jobs?include_retried=true&per_page=100&page=%d", project, pipeline, page), nil, &out, nil)
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
		if h.Get("X-Next-Page") == "" || len(out) == 0 {
			return all, nil
		}
	}
}

// PipelineBridges lists a pipeline's trigger jobs with their downstream
// pipelines, retried ones included.
func (c *Client) PipelineBridges(ctx context.Context, project, pipeline int64) ([]restapi.BridgeJSON, error) {
	var all []restapi.BridgeJSON
	for page := 1; ; page++ {
		var out []restapi.BridgeJSON
		h, err := c.doHeader(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/bridges?include_retried=true&per_page=100&page=%d", project, pipeline, page), nil, &out, nil)
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
		if h.Get("X-Next-Page") == "" || len(out) == 0 {
			return all, nil
		}
	}
}

// CancelPipeline cancels a pipeline.
func (c *Client) CancelPipeline(ctx context.Context, project, id int64) (*restapi.PipelineJSON, error) {
	var out restapi.PipelineJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/cancel", project, id), nil, &out)
}

// DeletePipeline deletes a pipeline, its jobs and all they stored
// (DELETE /projects/:id/pipelines/:pipeline_id; an admin's token or an
// owner's of the project).
func (c *Client) DeletePipeline(ctx context.Context, idOrPath string, id int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/api/v4/projects/%s/pipelines/%d", url.PathEscape(idOrPath), id), nil, nil)
}

// RetryPipeline retries a pipeline's failed and canceled jobs.
func (c *Client) RetryPipeline(ctx context.Context, project, id int64) (*restapi.PipelineJSON, error) {
	var out restapi.PipelineJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/pipelines/%d/retry", project, id), nil, &out)
}

// JobByID fetches a job by id alone (Berth's GET /berth/jobs/:id).
func (c *Client) JobByID(ctx context.Context, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/berth/jobs/%d", id), nil, &out)
}

// PlayJob plays a manual or scheduled job.
func (c *Client) PlayJob(ctx context.Context, project, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/play", project, id), nil, &out)
}

// RetryJob retries a finished job and returns the new one.
func (c *Client) RetryJob(ctx context.Context, project, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/retry", project, id), nil, &out)
}

// EraseJob erases a finished job's artifacts (its VM snapshot included)
// and log, and returns the job, erased_at set; a 403 answer for a job
// not finished or already erased.
func (c *Client) EraseJob(ctx context.Context, project, id int64) (*restapi.JobJSON, error) {
	var out restapi.JobJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/erase", project, id), nil, &out)
}

// DeleteJobArtifacts deletes a job's artifacts (its VM snapshot
// included), whatever its status; its log stays.
func (c *Client) DeleteJobArtifacts(ctx context.Context, project, id int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/artifacts", project, id), nil, nil)
}

// TraceFrom writes a job's trace from byte offset on to w and returns the
// number of bytes written and the job's status (Job-Status header).
func (c *Client) TraceFrom(ctx context.Context, project, id, offset int64, w io.Writer) (int64, string, error) {
	cw := &countWriter{w: w}
	h, err := c.doHeader(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/trace", project, id), nil, cw,
		map[string]string{"Range": "bytes=" + strconv.FormatInt(offset, 10) + "-"})
	status := ""
	if h != nil {
		status = h.Get(runnerapi.HeaderJobStatus)
	}
	return cw.n, status, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// CreateUser creates a web UI user (POST /berth/users); the answer holds
// its token, shown only this once.
func (c *Client) CreateUser(ctx context.Context, req restapi.CreateUserRequest) (*restapi.UserJSON, error) {
	var out restapi.UserJSON
	return &out, c.do(ctx, http.MethodPost, "/api/v4/berth/users", req, &out)
}

// ListUsers lists the web UI users (GET /berth/users).
func (c *Client) ListUsers(ctx context.Context) ([]restapi.UserJSON, error) {
	var out []restapi.UserJSON
	return out, c.do(ctx, http.MethodGet, "/api/v4/berth/users", nil, &out)
}

// DeleteUser deletes a web UI user and ends its sessions.
func (c *Client) DeleteUser(ctx context.Context, id int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/api/v4/berth/users/%d", id), nil, nil)
}

// ProjectMembers lists a project's members (GET /projects/:id/members;
// an admin's token, or a maintainer's of the project).
func (c *Client) ProjectMembers(ctx context.Context, idOrPath string) ([]restapi.MemberJSON, error) {
	var out []restapi.MemberJSON
	for page := 1; ; page++ {
		var part []restapi.MemberJSON
		path := fmt.Sprintf("/api/v4/projects/%s/members?per_page=100&page=%d", url.PathEscape(idOrPath), page)
		if err := c.do(ctx, http.MethodGet, path, nil, &part); err != nil {
			return nil, err
		}
		out = append(out, part...)
		if len(part) < 100 {
			return out, nil
		}
	}
}

// AddProjectMember makes a user a member of a project (POST
// /projects/:id/members, admin).
func (c *Client) AddProjectMember(ctx context.Context, idOrPath string, req restapi.MemberRequest) (*restapi.MemberJSON, error) {
	var out restapi.MemberJSON
	return &out, c.do(ctx, http.MethodPost, "/api/v4/projects/"+url.PathEscape(idOrPath)+"/members", req, &out)
}

// UpdateProjectMember changes a member's access level (PUT
// /projects/:id/members/:user_id, admin).
func (c *Client) UpdateProjectMember(ctx context.Context, idOrPath string, userID int64, level int) (*restapi.MemberJSON, error) {
	var out restapi.MemberJSON
	return &out, c.do(ctx, http.MethodPut, fmt.Sprintf("/api/v4/projects/%s/members/%d", url.PathEscape(idOrPath), userID),
		restapi.MemberRequest{AccessLevel: level}, &out)
}

// RemoveProjectMember removes a member (DELETE
// /projects/:id/members/:user_id, admin).
func (c *Client) RemoveProjectMember(ctx context.Context, idOrPath string, userID int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/api/v4/projects/%s/members/%d", url.PathEscape(idOrPath), userID), nil, nil)
}

// Snapshots lists the VM snapshots of failed jobs that have not expired,
// newest first (GET /snapshots): of one project when projectID is not 0.
// It needs an admin's token.
func (c *Client) Snapshots(ctx context.Context, projectID int64) ([]restapi.SnapshotJSON, error) {
	path := "/api/v4/snapshots"
	if projectID != 0 {
		path += "?project_id=" + strconv.FormatInt(projectID, 10)
	}
	var out []restapi.SnapshotJSON
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// Snapshot writes the VM snapshot of failed job jobID, decrypted, to w
// (GET /jobs/:id/snapshot) and returns its size. A snapshot that ends
// early (the coordinator found it altered part way) is an error: what w
// got is then not the whole bundle. It needs an admin's token.
func (c *Client) Snapshot(ctx context.Context, jobID int64, w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	path := fmt.Sprintf("/api/v4/jobs/%d/snapshot", jobID)
	_, err := c.doHeader(ctx, http.MethodGet, path, nil, cw, nil)
	var apiErr *APIError
	if err != nil && !errors.As(err, &apiErr) && cw.n > 0 {
		err = fmt.Errorf("GET %s: after %d bytes: %w", path, cw.n, err)
	}
	return cw.n, err
}
