// Package client is a small client for the coordinator's admin API (the
// GitLab-shaped and Berth-only endpoints that take the admin token), used
// by the berth CLI and by tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/runnerapi"
)

// Client talks to one coordinator with one admin token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

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
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set(runnerapi.HeaderPrivateToken, c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e runnerapi.ErrorResponse
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Message != nil {
			msg = fmt.Sprint(e.Message)
		}
		return fmt.Errorf("%s %s: %w", method, path, &APIError{Status: resp.StatusCode, Message: msg})
	}
	if out == nil {
		return nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err = io.Copy(w, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
	}
	return nil
}

// CreateRunner creates a runner (POST /user/runners) and returns its id and
// authentication token.
func (c *Client) CreateRunner(ctx context.Context, req coordinator.CreateRunnerRequest) (*runnerapi.RunnerTokenResponse, error) {
	var out runnerapi.RunnerTokenResponse
	return &out, c.do(ctx, http.MethodPost, "/api/v4/user/runners", req, &out)
}

// ListRunners lists all runners (GET /runners/all).
func (c *Client) ListRunners(ctx context.Context) ([]coordinator.RunnerJSON, error) {
	var out []coordinator.RunnerJSON
	return out, c.do(ctx, http.MethodGet, "/api/v4/runners/all", nil, &out)
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
func (c *Client) Enqueue(ctx context.Context, spec coordinator.JobSpec) (*coordinator.JobJSON, error) {
	var out coordinator.JobJSON
	return &out, c.do(ctx, http.MethodPost, "/api/v4/berth/jobs", spec, &out)
}

// Job fetches a job.
func (c *Client) Job(ctx context.Context, project, id int64) (*coordinator.JobJSON, error) {
	var out coordinator.JobJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/jobs/%d", project, id), nil, &out)
}

// CancelJob cancels a job.
func (c *Client) CancelJob(ctx context.Context, project, id int64) (*coordinator.JobJSON, error) {
	var out coordinator.JobJSON
	return &out, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/cancel", project, id), nil, &out)
}

// Trace writes a job's trace to w.
func (c *Client) Trace(ctx context.Context, project, id int64, w io.Writer) error {
	return c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v4/projects/%d/jobs/%d/trace", project, id), nil, w)
}

// Queue fetches the queue insight.
func (c *Client) Queue(ctx context.Context) (*coordinator.QueueStats, error) {
	var out coordinator.QueueStats
	return &out, c.do(ctx, http.MethodGet, "/api/v4/berth/queue", nil, &out)
}
