package resthttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/testreport"
)

// testSuites reads the JUnit reports of a pipeline's latest jobs (not
// retried ones, as GitLab's latest_test_report_builds), a suite per job
// name (parallel jobs share theirs), in job order. An expired or erased
// report is left out; one that cannot be read is its suite's error.
func (s *API) testSuites(ctx context.Context, pl *store.Pipeline) ([]*testreport.Suite, error) {
	jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	var suites []*testreport.Suite
	byName := map[string]*testreport.Suite{}
	for _, j := range jobs {
		if j.Retried || graph.IsBridge(j) {
			continue
		}
		arts, err := s.store.ListArtifacts(ctx, j.ID)
		if err != nil {
			return nil, fmt.Errorf("artifacts of job %d: %w", j.ID, err)
		}
		for _, a := range arts {
			if a.Type != "junit" || !a.ExpireAt.IsZero() && !a.ExpireAt.After(now) {
				continue
			}
			data, err := s.readReport(ctx, a)
			if errors.Is(err, artifacts.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			name := testreport.SuiteName(j.Name)
			suite := byName[name]
			if suite == nil {
				suite = &testreport.Suite{Name: name}
				byName[name] = suite
				suites = append(suites, suite)
			}
			if n := len(suite.JobIDs); n == 0 || suite.JobIDs[n-1] != j.ID {
				suite.JobIDs = append(suite.JobIDs, j.ID)
			}
			if data == nil {
				suite.Error = fmt.Sprintf("JUnit data parsing failed: the report of job %d is larger than %d bytes", j.ID, testreport.MaxText)
				continue
			}
			from := len(suite.Cases)
			testreport.ReadArtifact(suite, data, a.Format)
			for i := from; i < len(suite.Cases); i++ {
				suite.Cases[i].JobID = j.ID
			}
		}
	}
	for _, suite := range suites {
		suite.Done()
	}
	return suites, nil
}

// readReport reads a stored report; nil (and no error) when it is larger
// than a report may be.
func (s *API) readReport(ctx context.Context, a *store.Artifact) ([]byte, error) {
	rc, _, err := s.artifacts.Open(ctx, a.StorageKey)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, testreport.MaxText+1))
	if err != nil {
		return nil, fmt.Errorf("reading the JUnit report of job %d: %w", a.JobID, err)
	}
	if len(data) > testreport.MaxText {
		return nil, nil
	}
	return data, nil
}

// handleTestReport: GET /projects/:id/pipelines/:pipeline_id/test_report
// (reporters) is GitLab's pipeline test report: the suites with their
// cases.
func (s *API) handleTestReport(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	suites, err := s.testSuites(r.Context(), pl)
	if err != nil {
		httpapi.InternalError(s.log, w, "reading test reports", err)
		return
	}
	out := restapi.TestReportJSON{TestSuites: []restapi.TestSuiteJSON{}}
	for _, suite := range suites {
		c := suite.Count()
		sj := restapi.TestSuiteJSON{Name: suite.Name, TotalTime: suite.TotalTime, TotalCount: c.Total, SuccessCount: c.Success,
			FailedCount: c.Failed, SkippedCount: c.Skipped, ErrorCount: c.Error, SuiteError: errorOrNil(suite.Error), TestCases: []restapi.TestCaseJSON{}}
		if suite.Error == "" {
			for _, tc := range suite.Cases {
				cj := restapi.TestCaseJSON{Status: tc.Status, Name: tc.Name, Classname: tc.Classname, File: tc.File,
					ExecutionTime: tc.ExecutionTime, SystemOutput: tc.SystemOutput, StackTrace: tc.StackTrace}
				if tc.Attachment != "" {
					cj.AttachmentURL = s.attachmentURL(r.Context(), pl, tc.JobID, tc.Attachment)
				}
				sj.TestCases = append(sj.TestCases, cj)
			}
		}
		out.TotalTime += suite.TotalTime
		out.TotalCount += c.Total
		out.SuccessCount += c.Success
		out.FailedCount += c.Failed
		out.SkippedCount += c.Skipped
		out.ErrorCount += c.Error
		out.TestSuites = append(out.TestSuites, sj)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handleTestReportSummary: GET …/pipelines/:pipeline_id/test_report_summary
// (reporters): the suites' counts and the jobs they come from.
func (s *API) handleTestReportSummary(w http.ResponseWriter, r *http.Request) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return
	}
	suites, err := s.testSuites(r.Context(), pl)
	if err != nil {
		httpapi.InternalError(s.log, w, "reading test reports", err)
		return
	}
	out := restapi.TestReportSummaryJSON{TestSuites: []restapi.TestSuiteSummaryJSON{}}
	for _, suite := range suites {
		c := suite.Count()
		out.TestSuites = append(out.TestSuites, restapi.TestSuiteSummaryJSON{Name: suite.Name, TotalTime: suite.TotalTime,
			TotalCount: c.Total, SuccessCount: c.Success, FailedCount: c.Failed, SkippedCount: c.Skipped, ErrorCount: c.Error,
			BuildIDs: suite.JobIDs, SuiteError: errorOrNil(suite.Error)})
		out.Total.Time += suite.TotalTime
		out.Total.Count += c.Total
		out.Total.Success += c.Success
		out.Total.Failed += c.Failed
		out.Total.Skipped += c.Skipped
		out.Total.Error += c.Error
		if out.Total.SuiteError == nil {
			out.Total.SuiteError = errorOrNil(suite.Error)
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// attachmentURL is where the web UI serves a file of a job's artifacts.
func (s *API) attachmentURL(ctx context.Context, pl *store.Pipeline, jobID int64, path string) string {
	p, err := s.store.GetProject(ctx, pl.ProjectID)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s/%s/-/jobs/%d/artifacts/file/%s", s.baseURL, p.Path, jobID, path)
}

func errorOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
