package resthttp

import (
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
	out := restapi.TestReportJSON{TestCountsJSON: countsJSON(testreport.Sum(suites)), TestSuites: []restapi.TestSuiteJSON{}}
	var files string // where the web UI serves the jobs' artifact files
	for _, suite := range suites {
		sj := restapi.TestSuiteJSON{Name: suite.Name, TestCountsJSON: countsJSON(suite.Count(), suite.TotalTime),
			SuiteError: errorOrNil(suite.Error), TestCases: []restapi.TestCaseJSON{}}
		if suite.Error == "" {
			for _, tc := range suite.Cases {
				cj := restapi.TestCaseJSON{Status: tc.Status, Name: tc.Name, Classname: tc.Classname, File: tc.File,
					ExecutionTime: tc.ExecutionTime, SystemOutput: tc.SystemOutput}
				if tc.Attachment != "" {
					if files == "" {
						p, err := s.store.GetProject(r.Context(), pl.ProjectID)
						if err != nil {
							httpapi.InternalError(s.log, w, "loading project", err)
							return
						}
						files = s.baseURL + "/" + p.Path + "/-/jobs/"
					}
					cj.AttachmentURL = fmt.Sprintf("%s%d/artifacts/file/%s", files, tc.JobID, tc.Attachment)
				}
				sj.TestCases = append(sj.TestCases, cj)
			}
		}
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
	c, t := testreport.Sum(suites)
	out := restapi.TestReportSummaryJSON{TestSuites: []restapi.TestSuiteSummaryJSON{},
		Total: restapi.TestTotalJSON{Time: t, Count: c.Total, Success: c.Success, Failed: c.Failed, Skipped: c.Skipped, Error: c.Error}}
	for _, suite := range suites {
		out.TestSuites = append(out.TestSuites, restapi.TestSuiteSummaryJSON{Name: suite.Name,
			TestCountsJSON: countsJSON(suite.Count(), suite.TotalTime), BuildIDs: suite.JobIDs, SuiteError: errorOrNil(suite.Error)})
		if out.Total.SuiteError == nil {
			out.Total.SuiteError = errorOrNil(suite.Error)
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// countsJSON is counts and a time as the API shows them.
func countsJSON(c testreport.Counts, t float64) restapi.TestCountsJSON {
	return restapi.TestCountsJSON{TotalTime: t, TotalCount: c.Total, SuccessCount: c.Success, FailedCount: c.Failed,
		SkippedCount: c.Skipped, ErrorCount: c.Error}
}

func errorOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
