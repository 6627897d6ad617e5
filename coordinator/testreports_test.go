package coordinator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// TestPipelineTestReport: the JUnit reports jobs upload make the
// pipeline's test report and its summary (GitLab's endpoints): a suite
// per job, parallel jobs in one, a retried job's report replaced by its
// retry's, an unreadable report its suite's error.
func TestPipelineTestReport(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "g/p")
	e.pushFiles(t, "g/p", "main", map[string]string{".gitlab-ci.yml": `
unit:
  parallel: 2
  script: [go test]
  artifacts:
    reports:
      junit: report.xml
lint:
  script: [lint]
  artifacts:
    reports:
      junit: lint.xml
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "g%2Fp", "main")
	reports := map[string]string{
		"unit 1/2": `<testsuite name="a" time="1"><testcase classname="a" name="ok" time="1"/></testsuite>`,
		"unit 2/2": `<testsuite name="b" time="2"><testcase classname="b" name="bad" time="2"><failure>want 1</failure><system-out>[[ATTACHMENT|shot.png]]</system-out></testcase></testsuite>`,
		"lint":     `<testsuite`,
	}
	ids := map[string]int64{}
	for range 3 {
		job := e.takeWait(tok)
		ids[job.JobInfo.Name] = job.ID
		expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
		expectCode(t, "junit", uploadArtifact(e, job, "?artifact_type=junit&artifact_format=gzip", artifactstest.GzipFiles(reports[job.JobInfo.Name])), http.StatusCreated)
		state := "success"
		if job.JobInfo.Name == "unit 2/2" {
			state = "failed"
		}
		expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: state, ExitCode: map[string]int{"failed": 1}[state]}), http.StatusOK)
	}

	var rep restapi.TestReportJSON
	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/g%%2Fp/pipelines/%d/test_report", pl.ID), nil)
	expectCode(t, "test report", r, http.StatusOK)
	r.json(t, &rep)
	if rep.TotalCount != 2 || rep.SuccessCount != 1 || rep.FailedCount != 1 || rep.TotalTime != 3 || len(rep.TestSuites) != 2 {
		t.Fatalf("report %+v", rep)
	}
	unit, lint := rep.TestSuites[0], rep.TestSuites[1]
	if unit.Name != "unit" || unit.TotalCount != 2 || len(unit.TestCases) != 2 || unit.SuiteError != nil {
		t.Errorf("unit suite %+v", unit)
	}
	if bad := unit.TestCases[0]; bad.Status != "failed" || bad.Name != "bad" || bad.SystemOutput == nil ||
		!strings.HasPrefix(*bad.SystemOutput, "want 1") || !strings.HasSuffix(bad.AttachmentURL, fmt.Sprintf("/g/p/-/jobs/%d/artifacts/file/shot.png", ids["unit 2/2"])) {
		t.Errorf("failed case %+v", bad)
	}
	if lint.Name != "lint" || lint.SuiteError == nil || !strings.HasPrefix(*lint.SuiteError, "JUnit XML parsing failed") || len(lint.TestCases) != 0 {
		t.Errorf("lint suite %+v", lint)
	}

	// Retried, the failed job's report gives way to its retry's.
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/g%%2Fp/jobs/%d/retry", ids["unit 2/2"]), nil)
	expectCode(t, "retry", r, http.StatusCreated)
	job := e.takeWait(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "junit", uploadArtifact(e, job, "?artifact_type=junit&artifact_format=gzip", artifactstest.GzipFiles(`<testsuite name="b"><testcase classname="b" name="bad" time="0.5"/></testsuite>`)), http.StatusCreated)
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	var sum restapi.TestReportSummaryJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/g%%2Fp/pipelines/%d/test_report_summary", pl.ID), nil).json(t, &sum)
	if sum.Total.Count != 2 || sum.Total.Success != 2 || sum.Total.Failed != 0 || sum.Total.SuiteError == nil || len(sum.TestSuites) != 2 {
		t.Fatalf("summary %+v", sum)
	}
	if u := sum.TestSuites[0]; u.Name != "unit" || fmt.Sprint(u.BuildIDs) != fmt.Sprint([]int64{ids["unit 1/2"], job.ID}) || u.TotalTime != 1.5 {
		t.Errorf("unit summary %+v", u)
	}
}
