package webui_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/runnerapi"
)

const twoStages = `
stages: [build, test]
build:
  stage: build
  script: [make]
test:
  stage: test
  needs: [build]
  script: [make test]
lint:
  stage: test
  script: [lint]
`

func TestPagesRender(t *testing.T) {
	e := newEnv(t, webui.Config{})
	p, pl := e.project("group/app", map[string]string{".gitlab-ci.yml": twoStages})
	b := e.browser()
	b.signIn(e.admin)
	for _, tc := range []struct{ path, want string }{
		{"/", "group/app"},
		{"/group/app/-/pipelines", "#" + itoa(pl.ID)},
		{"/group/app/-/pipelines?status=running&ref=main", "Pipelines"},
		{"/group/app/-/pipelines/" + itoa(pl.ID), "build"},
		{"/group/app/-/pipelines/" + itoa(pl.ID) + "?view=needs", "<svg"},
		{"/group/app/-/pipelines/" + itoa(pl.ID) + "?view=jobs", "lint"},
		{"/-/runners", "Runners"},
		{"/-/fleet", "Fleet and queue"},
	} {
		pg := b.get(tc.path)
		if pg.code != http.StatusOK || !strings.Contains(pg.body, tc.want) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%.3000s", tc.path, pg.code, tc.want, pg.body)
		}
	}
	if pg := b.get("/group/app"); pg.code != http.StatusSeeOther || pg.header.Get("Location") != "/group/app/-/pipelines" {
		t.Errorf("project page: %d %s", pg.code, pg.header.Get("Location"))
	}
	if pg := b.get("/-/pipelines/" + itoa(pl.ID)); pg.header.Get("Location") != "/group/app/-/pipelines/"+itoa(pl.ID) {
		t.Errorf("pipeline by id: %d %s", pg.code, pg.header.Get("Location"))
	}
	if pg := b.get("/group/app/-/pipelines?status=bogus"); pg.code != http.StatusBadRequest || !strings.Contains(pg.body, "status") {
		t.Errorf("bad filter: %d", pg.code)
	}
	if pg := b.get("/nope/-/pipelines"); pg.code != http.StatusNotFound {
		t.Errorf("missing project: %d", pg.code)
	}
	_ = p
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestPipelinesPageShowsSchedules: a project's schedules stand above the
// first page of its pipelines with their timing, the next run ahead, and
// their last pipeline; a paused one says so; filtered lists leave them out.
func TestPipelinesPageShowsSchedules(t *testing.T) {
	e := newEnv(t, webui.Config{})
	p, _ := e.project("group/app", map[string]string{".gitlab-ci.yml": twoStages})
	b := e.browser()
	b.signIn(e.admin)
	if pg := b.get("/group/app/-/pipelines"); strings.Contains(pg.body, "Schedules") {
		t.Error("a project without schedules shows a Schedules section")
	}
	eng := e.srv.Pipelines()
	nightly := &store.PipelineSchedule{ProjectID: p.ID, Description: "nightly <build>", Ref: "main", Cron: "0 2 * * *", CronTimezone: "Europe/Berlin", Active: true}
	paused := &store.PipelineSchedule{ProjectID: p.ID, Description: "weekly", Ref: "main", Cron: "@weekly", CronTimezone: "UTC"}
	for _, ps := range []*store.PipelineSchedule{nightly, paused} {
		if err := eng.CreateSchedule(t.Context(), ps); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := eng.PlaySchedule(t.Context(), nightly)
	if err != nil {
		t.Fatal(err)
	}
	pg := b.get("/group/app/-/pipelines")
	for _, want := range []string{"Schedules", "nightly &lt;build&gt;", "0 2 * * *", "Europe/Berlin", `datetime="` + nightly.NextRunAt.Format(time.RFC3339), "/group/app/-/pipelines/" + itoa(pl.ID), `weekly <span class="muted">(paused)</span>`} {
		if !strings.Contains(pg.body, want) {
			t.Errorf("pipelines page lacks %q:\n%.4000s", want, pg.body)
		}
	}
	if !strings.Contains(pg.body, ">in ") {
		t.Errorf("the next run is not shown ahead:\n%.4000s", pg.body)
	}
	if pg := b.get("/group/app/-/pipelines?status=failed"); strings.Contains(pg.body, "Schedules") {
		t.Error("a filtered list shows the schedules")
	}
}

// TestPipelineTestsView: the pipeline page's Tests view shows the JUnit
// reports' counts, the suites and the failed cases with their output,
// escaped.
func TestPipelineTestsView(t *testing.T) {
	e := newEnv(t, webui.Config{})
	_, pl := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	b := e.browser()
	b.signIn(e.admin)
	url := "/g/p/-/pipelines/" + itoa(pl.ID)
	if pg := b.get(url + "?view=tests"); pg.code != http.StatusOK || !strings.Contains(pg.body, "No test reports") {
		t.Fatalf("tests view before any report: %d\n%.3000s", pg.code, pg.body)
	}
	job := e.take(e.runner("r"), "s_1")
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "junit.xml")
	_, _ = fw.Write([]byte(`<testsuite name="unit" time="3"><testcase classname="pkg" name="TestOK" time="1"/>` +
		`<testcase classname="pkg" name="TestBad" time="2"><failure>want &lt;script&gt;1</failure><system-out>[[ATTACHMENT|shots/bad.png]]</system-out></testcase></testsuite>`))
	_ = mw.Close()
	code, rb := e.api("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_type=junit&artifact_format=raw", job.ID), body.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
	if code != http.StatusCreated {
		t.Fatalf("uploading a junit report: %d %s", code, rb)
	}
	if code := e.update(job, "failed"); code != http.StatusOK {
		t.Fatalf("finishing the job: %d", code)
	}
	pg := b.get(url + "?view=tests")
	for _, want := range []string{"2 tests · 1 passed", "1 failed</span>", "3.00 s", fmt.Sprintf(`<td>build <a class="muted" href="/g/p/-/jobs/%d">#%d</a>`, job.ID, job.ID), "TestBad", "want &lt;script&gt;1",
		fmt.Sprintf(`href="/g/p/-/jobs/%d/artifacts/file/shots/bad.png"`, job.ID), `aria-current="page">Tests<`} {
		if !strings.Contains(pg.body, want) {
			t.Errorf("tests view lacks %q:\n%.5000s", want, pg.body)
		}
	}
	if strings.Contains(pg.body, "<script>1") {
		t.Error("a test's output reached the page unescaped")
	}
	if strings.Contains(pg.body, "TestOK") {
		t.Error("a passed test is listed among the failures")
	}
}
