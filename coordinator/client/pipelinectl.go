package client

// Pipeline schedules and trigger tokens.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berthci/berth/coordinator/restapi"
)

// ScheduleRequest creates or changes a pipeline schedule: fields left nil
// are not sent (on create, the coordinator's defaults: zone UTC, active).
type ScheduleRequest struct {
	Description  *string `json:"description,omitempty"`
	Ref          *string `json:"ref,omitempty"`
	Cron         *string `json:"cron,omitempty"`
	CronTimezone *string `json:"cron_timezone,omitempty"`
	Active       *bool   `json:"active,omitempty"`
}

// ListSchedules lists a project's pipeline schedules; scope (active or
// inactive) filters when not empty.
func (c *Client) ListSchedules(ctx context.Context, project, scope string) ([]restapi.PipelineScheduleJSON, error) {
	q := url.Values{}
	if scope != "" {
		q["scope"] = []string{scope}
	}
	return listAll[restapi.PipelineScheduleJSON](ctx, c, projectPath(project)+"/pipeline_schedules", q)
}

// Schedule returns one schedule with its last pipeline and, to those who
// may read them, its variables.
func (c *Client) Schedule(ctx context.Context, project string, id int64) (*restapi.PipelineScheduleJSON, error) {
	var out restapi.PipelineScheduleJSON
	return &out, c.do(ctx, http.MethodGet, fmt.Sprintf("%s/pipeline_schedules/%d", projectPath(project), id), nil, &out)
}

// CreateSchedule creates a schedule owned by the token's user.
func (c *Client) CreateSchedule(ctx context.Context, project string, req ScheduleRequest) (*restapi.PipelineScheduleJSON, error) {
	var out restapi.PipelineScheduleJSON
	return &out, c.do(ctx, http.MethodPost, projectPath(project)+"/pipeline_schedules", req, &out)
}

// UpdateSchedule changes the fields req sets.
func (c *Client) UpdateSchedule(ctx context.Context, project string, id int64, req ScheduleRequest) (*restapi.PipelineScheduleJSON, error) {
	var out restapi.PipelineScheduleJSON
	return &out, c.do(ctx, http.MethodPut, fmt.Sprintf("%s/pipeline_schedules/%d", projectPath(project), id), req, &out)
}

// SetScheduleVariable adds a variable to a schedule, or changes its value
// and type if the schedule has it.
func (c *Client) SetScheduleVariable(ctx context.Context, project string, id int64, v restapi.ScheduleVariableJSON) error {
	path := fmt.Sprintf("%s/pipeline_schedules/%d/variables", projectPath(project), id)
	err := c.do(ctx, http.MethodPut, path+"/"+url.PathEscape(v.Key), v, nil)
	if IsNotFound(err) {
		err = c.do(ctx, http.MethodPost, path, v, nil)
	}
	return err
}

// PlaySchedule runs a schedule now.
func (c *Client) PlaySchedule(ctx context.Context, project string, id int64) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("%s/pipeline_schedules/%d/play", projectPath(project), id), nil, nil)
}

// DeleteSchedule deletes a schedule (not its pipelines).
func (c *Client) DeleteSchedule(ctx context.Context, project string, id int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("%s/pipeline_schedules/%d", projectPath(project), id), nil, nil)
}

// ListTriggers lists a project's pipeline trigger tokens (their first
// characters only).
func (c *Client) ListTriggers(ctx context.Context, project string) ([]restapi.PipelineTriggerJSON, error) {
	return listAll[restapi.PipelineTriggerJSON](ctx, c, projectPath(project)+"/triggers", nil)
}

// CreateTrigger creates a trigger token; the answer holds the whole token,
// shown this once. expiresAt (a date or an RFC 3339 time) may be empty.
func (c *Client) CreateTrigger(ctx context.Context, project, description, expiresAt string) (*restapi.PipelineTriggerJSON, error) {
	req := map[string]string{"description": description}
	if expiresAt != "" {
		req["expires_at"] = expiresAt
	}
	var out restapi.PipelineTriggerJSON
	return &out, c.do(ctx, http.MethodPost, projectPath(project)+"/triggers", req, &out)
}

// DeleteTrigger deletes a trigger token.
func (c *Client) DeleteTrigger(ctx context.Context, project string, id int64) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("%s/triggers/%d", projectPath(project), id), nil, nil)
}
