package network

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/berthci/berth/runnerapi"
)

// ErrNoFleetReports: the coordinator does not take fleet reports (GitLab,
// or a Berth before them).
var ErrNoFleetReports = errors.New("the coordinator takes no fleet reports")

// ReportFleet sends the runner manager's fleet to Berth's coordinator (PUT
// /api/v4/berth/runners/fleet with the runner token, a Berth extension the
// web UI shows). It fails with ErrNoFleetReports where the endpoint does
// not exist.
func (c *Client) ReportFleet(ctx context.Context, rc RunnerCredentials, f runnerapi.Fleet) error {
	const op = "PUT berth/runners/fleet"
	rq := c.runnerRequest("PUT", "berth/runners/fleet", rc, f, false)
	rq.luKey = ""
	r, err := c.do(ctx, rq)
	if err != nil {
		return err
	}
	switch r.code {
	case http.StatusNoContent, http.StatusOK, http.StatusAccepted:
		return nil
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return fmt.Errorf("%s: %w", op, ErrNoFleetReports)
	}
	return statusError(op, r)
}
