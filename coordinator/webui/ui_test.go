package webui_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/webui"
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
