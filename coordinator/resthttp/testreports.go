package resthttp

import (
	"context"
	"fmt"
	"net/http"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/testreport"
)

// testSuites reads the test suites of the path's pipeline, answering
// itself when it cannot.
func (s *API) testSuites(w http.ResponseWriter, r *http.Request) (*store.Pipeline, []*testreport.Suite, bool) {
	pl := s.pipeline(w, r)
	if pl == nil {
		return nil, nil, false
	}
	suites, err := testreport.OfPipeline(r.Context(), s.store, s.artifacts, pl.ID, s.clock.Now())
	if err != nil {
		httpapi.InternalError(s.log, w, "reading test reports", err)
		return nil, nil, false
	}
	return pl, suites, true
}

// handleTestReport: GET /projects/:id/pipelines/:pipeline_id/test_report
// (reporters) is GitLab's pipeline test report: the suites with their
// cases.
func (s *API) handleTestReport(w http.ResponseWriter, r *http.Request) {
	pl, suites, ok := s.testSuites(w, r)
	if !ok {
		return
	}
	out := restapi.TestReportJSON{TestSuites: []restapi.TestSuiteJSON{}}
	for _, suite := range suites {
		counts := countsJSON(suite)
		sj := restapi.TestSuiteJSON{Name: suite.Name, TestCountsJSON: counts, SuiteError: errorOrNil(suite.Error), TestCases: []restapi.TestCaseJSON{}}
		if suite.Error == "" {
			for _, tc := range suite.Cases {
				cj := restapi.TestCaseJSON{Status: tc.Status, Name: tc.Name, Classname: tc.Classname, File: tc.File,
					ExecutionTime: tc.ExecutionTime, SystemOutput: tc.SystemOutput}
				if tc.Attachment != "" {
					cj.AttachmentURL = s.attachmentURL(r.Context(), pl, tc.JobID, tc.Attachment)
				}
				sj.TestCases = append(sj.TestCases, cj)
			}
		}
		out.Add(counts)
		out.TestSuites = append(out.TestSuites, sj)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handleTestReportSummary: GET …/pipelines/:pipeline_id/test_report_summary
// (reporters): the suites' counts and the jobs they come from.
func (s *API) handleTestReportSummary(w http.ResponseWriter, r *http.Request) {
	_, suites, ok := s.testSuites(w, r)
	if !ok {
		return
	}
	out := restapi.TestReportSummaryJSON{TestSuites: []restapi.TestSuiteSummaryJSON{}}
	for _, suite := range suites {
		c := countsJSON(suite)
		out.TestSuites = append(out.TestSuites, restapi.TestSuiteSummaryJSON{Name: suite.Name, TestCountsJSON: c,
			BuildIDs: suite.JobIDs, SuiteError: errorOrNil(suite.Error)})
		out.Total.Time += c.TotalTime
		out.Total.Count += c.TotalCount
		out.Total.Success += c.SuccessCount
		out.Total.Failed += c.FailedCount
		out.Total.Skipped += c.SkippedCount
		out.Total.Error += c.ErrorCount
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

// countsJSON is a suite's time and counts.
func countsJSON(s *testreport.Suite) restapi.TestCountsJSON {
	c := s.Count()
	return restapi.TestCountsJSON{TotalTime: s.TotalTime, TotalCount: c.Total, SuccessCount: c.Success, FailedCount: c.Failed,
		SkippedCount: c.Skipped, ErrorCount: c.Error}
}

func errorOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
