package coordinator

import (
	"bytes"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// TestInputBounds covers the small defects of issue 9 (defect 8): each
// case failed before its fix.
func TestInputBounds(t *testing.T) {
	e := newEnv(t, Config{})
	for i := range 3 {
		e.createRunner(restapi.CreateRunnerRequest{Description: "r" + strconv.Itoa(i)})
	}

	// A page number that overflowed answered the first page.
	r := e.adminDo("GET", "/api/v4/runners/all?page="+strconv.FormatInt(math.MaxInt64, 10), nil)
	expectCode(t, "runners, huge page", r, http.StatusOK)
	var list []restapi.RunnerJSON
	r.json(t, &list)
	if len(list) != 0 {
		t.Errorf("page 2^63-1 lists %d runners, want none", len(list))
	}
	r = e.adminDo("GET", "/api/v4/runners/all?per_page=2&page=2", nil)
	r.json(t, &list)
	if len(list) != 1 || r.header.Get("X-Total") != "3" {
		t.Errorf("second page of two: %d runners, X-Total %q", len(list), r.header.Get("X-Total"))
	}

	// A job timeout of 2^63-1 seconds was accepted and handed to runners.
	spec := simpleSpec("long")
	spec.Timeout = math.MaxInt
	r = e.adminDo("POST", "/api/v4/berth/jobs", spec)
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "timeout") {
		t.Errorf("timeout 2^63-1: %d %s, want 400 naming timeout", r.code, r.body)
	}
	spec.Timeout = dispatch.MaxJobTimeout
	expectCode(t, "timeout of one month", e.adminDo("POST", "/api/v4/berth/jobs", spec), http.StatusCreated)

	// Data after the JSON value was ignored.
	r = e.do("POST", "/api/v4/runners/verify", []byte(`{"token":"x"}garbage`), map[string]string{"Content-Type": "application/json"})
	if r.code != http.StatusBadRequest {
		t.Errorf("JSON with trailing garbage: %d %s, want 400", r.code, r.body)
	}
	r = e.do("POST", "/api/v4/runners/verify", []byte("{\"token\":\"x\"}\n \n"), map[string]string{"Content-Type": "application/json"})
	if r.code == http.StatusBadRequest {
		t.Errorf("JSON with trailing blanks refused: %s", r.body)
	}

	// A form body over the limit answered 400.
	e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: "p"})
	big := append([]byte("key=A&value="), bytes.Repeat([]byte("x"), httpapi.MaxJSONBody+10)...)
	r = e.do("POST", "/api/v4/projects/p/variables", big, map[string]string{
		"Content-Type": "application/x-www-form-urlencoded", runnerapi.HeaderPrivateToken: e.admin})
	if r.code != http.StatusRequestEntityTooLarge {
		t.Errorf("form body over the limit: %d, want 413", r.code)
	}
	big = append([]byte(`{"key":"A","value":"`), bytes.Repeat([]byte("x"), httpapi.MaxJSONBody+10)...)
	r = e.do("POST", "/api/v4/projects/p/variables", big, map[string]string{
		"Content-Type": "application/json", runnerapi.HeaderPrivateToken: e.admin})
	if r.code != http.StatusRequestEntityTooLarge {
		t.Errorf("JSON body over the limit: %d, want 413", r.code)
	}
}

// TestTraceSizeLimit: a job holding its own token could PATCH any amount
// of log past the runner's output_limit and fill the coordinator's disk
// (issue 9, defect 5). Past MaxTraceSize the job fails with
// trace_size_exceeded and the PATCH answers 403, as GitLab does.
func TestTraceSizeLimit(t *testing.T) {
	e := newEnv(t, Config{MaxTraceSize: 1000})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("noisy"))
	job := e.take(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "first 600 bytes", e.patch(job, "0-599", bytes.Repeat([]byte("a"), 600)), http.StatusAccepted)
	r := e.patch(job, "600-1199", bytes.Repeat([]byte("b"), 600))
	if r.code != http.StatusForbidden || !strings.Contains(string(r.body), "size limit") {
		t.Fatalf("patch past the limit: %d %s, want 403", r.code, r.body)
	}
	j := e.job(job.ID)
	if j.Status != "failed" || j.FailureReason != runnerapi.TraceSizeExceeded {
		t.Errorf("job %s (%s), want failed with trace_size_exceeded", j.Status, j.FailureReason)
	}
	expectCode(t, "patch after the job failed", e.patch(job, "600-609", bytes.Repeat([]byte("c"), 10)), http.StatusForbidden)
	r = e.adminDo("GET", "/-/metrics", nil)
	if !strings.Contains(string(r.body), "berth_coordinator_trace_patches_rejected_total 1") {
		t.Errorf("metrics lack the rejected patch:\n%s", r.body)
	}
}
