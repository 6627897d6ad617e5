package webui_test

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/runnerapi"
)

type logEvent struct {
	Ops []struct {
		Op       string `json:"op"`
		HTML     string `json:"html"`
		Section  string `json:"section"`
		Duration string `json:"duration"`
	} `json:"ops"`
	Offset int64 `json:"offset"`
}

// A job's log streams as it grows: the page renders what is there, the
// stream sends what follows, with its status changes, and ends with the
// job.
func TestLogStreams(t *testing.T) {
	e := newEnv(t, webui.Config{})
	e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	job := e.take(e.runner("r"), "s_1")
	off := e.appendLog(job, 0, "section_start:1700000000:prepare\r\x1b[0K\x1b[36;1mPreparing\x1b[0;m\nfirst \x1b[32mgreen\x1b[0m line\npartial")
	b := e.browser()
	b.signIn(e.admin)
	jobURL := "/g/p/-/jobs/" + itoa(job.ID)
	pg := b.get(jobURL)
	if !strings.Contains(pg.body, `<span class="term-fg-2">green</span>`) || strings.Contains(pg.body, "partial") {
		t.Fatalf("job page log:\n%.4000s", pg.body)
	}
	streamURL := extract(t, pg.body, `data-stream="`, `"`)
	streamURL = strings.ReplaceAll(streamURL, "&amp;", "&")
	go func() {
		time.Sleep(300 * time.Millisecond)
		off = e.appendLog(job, off, " line\nsecond line\n")
		time.Sleep(300 * time.Millisecond)
		off = e.appendLog(job, off, "section_end:1700000042:prepare\r\x1b[0K\nlast line")
		time.Sleep(300 * time.Millisecond)
		e.update(job, "success")
	}()
	var lines []string
	var sawEnd, sawStatus bool
	var duration string
	readEvents(t, b, streamURL, func(event, data string) bool {
		switch event {
		case "log":
			var ev logEvent
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			for _, op := range ev.Ops {
				switch op.Op {
				case "line":
					lines = append(lines, op.HTML)
				case "end":
					duration = op.Duration
				}
			}
		case "status":
			sawStatus = data == "success"
		case "end":
			sawEnd = true
			return true
		}
		return false
	})
	if got := strings.Join(lines, "|"); got != "partial line|second line|last line" {
		t.Errorf("streamed lines %q", got)
	}
	if duration != "00:42" || !sawEnd || !sawStatus {
		t.Errorf("section duration %q, end %v, status %v", duration, sawEnd, sawStatus)
	}
	// The finished job's page has it all; the raw log too.
	pg = b.get(jobURL)
	if !strings.Contains(pg.body, "last line") || strings.Contains(pg.body, "data-stream=") || !strings.Contains(pg.body, `<span class="section-duration">00:42</span>`) {
		t.Errorf("finished job page:\n%.3000s", pg.body)
	}
	if raw := b.get(jobURL + "/raw"); raw.header.Get("Content-Type") != "text/plain; charset=utf-8" || !strings.HasSuffix(raw.body, "last line") {
		t.Errorf("raw log: %q %q", raw.header.Get("Content-Type"), raw.body)
	}
	if pg := b.get(jobURL + "/log?from=5&offset=2"); pg.code != http.StatusBadRequest {
		t.Errorf("log stream with from past offset: %d", pg.code)
	}
	if pg := b.get(jobURL + "/log?offset=999999"); pg.code != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("log stream past the end: %d", pg.code)
	}
}

// A pipeline's page hears "changed" when a job's status changes, and its
// live part re-renders.
func TestPipelineEvents(t *testing.T) {
	e := newEnv(t, webui.Config{})
	_, pl := e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	b := e.browser()
	b.signIn(e.admin)
	pipeURL := "/g/p/-/pipelines/" + itoa(pl.ID)
	pg := b.get(pipeURL)
	events := extract(t, pg.body, `sse-connect="`, `"`)
	tok := e.runner("r")
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.take(tok, "s_1")
	}()
	readEvents(t, b, events, func(event, data string) bool { return event == "changed" })
	live := b.do("GET", pipeURL, nil, map[string]string{"HX-Request": "true"})
	if !strings.HasPrefix(strings.TrimSpace(live.body), `<div id="live"`) || !strings.Contains(live.body, "running") {
		t.Errorf("live part:\n%.2000s", live.body)
	}
}

// Retry and play lead to the new job; the UI's answers are those of the
// engine.
func TestRetryAndPlay(t *testing.T) {
	e := newEnv(t, webui.Config{})
	e.project("g/p", map[string]string{".gitlab-ci.yml": `
build:
  script: [make]
deploy:
  script: [deploy]
  when: manual
`})
	job := e.take(e.runner("r"), "s_1")
	e.update(job, "failed")
	b := e.browser()
	b.signIn(e.admin)
	jobURL := "/g/p/-/jobs/" + itoa(job.ID)
	pg := b.get(jobURL)
	if !strings.Contains(pg.body, "/retry") {
		t.Fatalf("failed job offers no retry:\n%.3000s", pg.body)
	}
	res := b.do("POST", jobURL+"/retry", url.Values{"csrf_token": {csrf(t, pg)}}, nil)
	loc := res.header.Get("Location")
	if res.code != http.StatusSeeOther || loc == jobURL || !strings.HasPrefix(loc, "/g/p/-/jobs/") {
		t.Fatalf("retry: %d → %q", res.code, loc)
	}
	if pg := b.get(loc); !strings.Contains(pg.body, "pending") {
		t.Errorf("the retried job:\n%.2000s", pg.body)
	}
	// The old job says it was retried; retrying it again is refused.
	if pg := b.get(jobURL); !strings.Contains(pg.body, "This job was retried") {
		t.Error("old job does not say it was retried")
	}
	if res := b.do("POST", jobURL+"/retry", url.Values{"csrf_token": {csrf(t, pg)}}, nil); res.code != http.StatusConflict {
		t.Errorf("retrying a retried job: %d, want 409", res.code)
	}
	jobs, _ := e.st.ListJobs(t.Context(), store.JobFilter{})
	var manual *store.Job
	for _, j := range jobs {
		if j.Name == "deploy" {
			manual = j
		}
	}
	mURL := "/g/p/-/jobs/" + itoa(manual.ID)
	mp := b.get(mURL)
	if !strings.Contains(mp.body, "/play") {
		t.Fatalf("manual job offers no play")
	}
	if res := b.do("POST", mURL+"/play", url.Values{"csrf_token": {csrf(t, mp)}}, nil); res.code != http.StatusSeeOther {
		t.Fatalf("play: %d %s", res.code, res.body)
	}
	if j, _ := e.st.GetJob(t.Context(), manual.ID); j.Status != store.StatusPending {
		t.Errorf("played job %s, want pending", j.Status)
	}
}

func TestArtifacts(t *testing.T) {
	e := newEnv(t, webui.Config{})
	e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	job := e.take(e.runner("r"), "s_1")
	e.uploadArchive(job, map[string]string{"out/bin/app": "binary", "out/report.html": "<script>alert(1)</script>", "README": "read me"})
	b := e.browser()
	b.signIn(e.admin)
	base := "/g/p/-/jobs/" + itoa(job.ID)
	if pg := b.get(base); !strings.Contains(pg.body, base+"/artifacts/browse") {
		t.Fatalf("job page has no browse link")
	}
	root := b.get(base + "/artifacts/browse")
	if root.code != http.StatusOK || !strings.Contains(root.body, "out/") || !strings.Contains(root.body, "README") {
		t.Fatalf("browse root: %d\n%.2000s", root.code, root.body)
	}
	out := b.get(base + "/artifacts/browse/out")
	if !strings.Contains(out.body, "report.html") || !strings.Contains(out.body, "bin/") {
		t.Fatalf("browse out:\n%.2000s", out.body)
	}
	f := b.get(base + "/artifacts/file/out/report.html")
	if f.code != http.StatusOK || f.body != "<script>alert(1)</script>" || f.header.Get("Content-Type") != "application/octet-stream" ||
		!strings.HasPrefix(f.header.Get("Content-Disposition"), "attachment") {
		t.Errorf("file: %d %q %q", f.code, f.header.Get("Content-Type"), f.header.Get("Content-Disposition"))
	}
	dl := b.get(base + "/artifacts/download")
	zr, err := zip.NewReader(bytes.NewReader([]byte(dl.body)), int64(len(dl.body)))
	if err != nil || len(zr.File) != 3 || !strings.Contains(dl.header.Get("Content-Disposition"), "artifacts.zip") {
		t.Errorf("download: %v, %q", err, dl.header.Get("Content-Disposition"))
	}
	for _, bad := range []string{"/artifacts/browse/../x", "/artifacts/file/nope", "/artifacts/browse/nope", "/artifacts/download?type=trace"} {
		// (ServeMux cleans a path with .. by redirecting to the clean one.)
		if pg := b.get(base + bad); pg.code != http.StatusNotFound && pg.code != http.StatusBadRequest && pg.code != http.StatusTemporaryRedirect {
			t.Errorf("%s: %d", bad, pg.code)
		}
	}
}

// A runner goes offline on the runners page when it has not been heard
// from in two hours; its manager shows what it offers and runs.
func TestRunnersPage(t *testing.T) {
	e := newEnv(t, webui.Config{})
	e.project("g/p", map[string]string{".gitlab-ci.yml": twoStages})
	tok := e.runner("builder", "linux", "docker")
	job := e.take(tok, "s_builder", "none", "container")
	b := e.browser()
	b.signIn(e.user("viewer", "read-only"))
	pg := b.get("/-/runners")
	for _, want := range []string{"builder", `data-status="online"`, "linux", "s_builder", "container", "build #" + itoa(job.ID)} {
		if !strings.Contains(pg.body, want) {
			t.Errorf("runners page lacks %q", want)
		}
	}
	e.update(job, "success")
	e.clock.Advance(3 * time.Hour)
	if pg := b.get("/-/runners"); !strings.Contains(pg.body, `data-status="offline"`) {
		t.Errorf("a runner silent for 3 h is not offline:\n%.3000s", pg.body)
	}
}

// A runner manager's fleet report shows on the fleet page.
func TestFleetPage(t *testing.T) {
	e := newEnv(t, webui.Config{})
	tok := e.runner("autoscaled")
	f := runnerapi.Fleet{SystemID: "s_fleet", Executor: "instance", Plugin: "fleeting-plugin-aws", Ready: 3, Creating: 1,
		MaxInstances: 10, Capacity: 2, SlotsInUse: 4, SlotsIdle: 2, IdleInstances: 1, Boots: 7, Deletions: 3,
		InstanceSeconds: 5.5 * 3600, Since: e.clock.Now().Add(-time.Hour)}
	if code, b := e.api("PUT", "/api/v4/berth/runners/fleet", f, map[string]string{runnerapi.HeaderRunnerToken: tok}); code != http.StatusNoContent {
		t.Fatalf("fleet report: %d %s", code, b)
	}
	for _, bad := range []struct {
		header map[string]string
		body   any
		want   int
	}{
		{nil, f, http.StatusUnauthorized},
		{map[string]string{runnerapi.HeaderRunnerToken: "glrt-nope"}, f, http.StatusForbidden},
		{map[string]string{runnerapi.HeaderRunnerToken: tok}, runnerapi.Fleet{SystemID: "x", Ready: -1}, http.StatusBadRequest},
		{map[string]string{runnerapi.HeaderRunnerToken: tok}, runnerapi.Fleet{}, http.StatusBadRequest},
	} {
		if code, _ := e.api("PUT", "/api/v4/berth/runners/fleet", bad.body, bad.header); code != bad.want {
			t.Errorf("fleet report %v: %d, want %d", bad.header, code, bad.want)
		}
	}
	b := e.browser()
	b.signIn(e.admin)
	pg := b.get("/-/fleet")
	for _, want := range []string{"s_fleet", "fleeting-plugin-aws", "<b>4</b> of at most 10", "5.50", "3 ready, 1 creating"} {
		if !strings.Contains(pg.body, want) {
			t.Errorf("fleet page lacks %q:\n%.4000s", want, pg.body)
		}
	}
	// The charts fill as the sampler runs.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.get("/-/fleet").body, "<polyline") {
		if time.Now().After(deadline) {
			t.Fatal("no chart drawn")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Stale after two minutes without a report.
	e.clock.Advance(3 * time.Minute)
	if pg := b.get("/-/fleet"); !strings.Contains(pg.body, "stale") {
		t.Error("an old report is not marked stale")
	}
}

func extract(t *testing.T, s, start, end string) string {
	t.Helper()
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("no %q in:\n%.3000s", start, s)
	}
	s = s[i+len(start):]
	return s[:strings.Index(s, end)]
}
