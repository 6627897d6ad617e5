package webui_test

import (
	"archive/zip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/berthci/berth/coordinator/webui"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// The browser tests drive a real Chromium (Debian's, BERTH_TEST_CHROMIUM
// or /usr/bin/chromium) through the DevTools protocol, started once for
// the package; each test has a browser context of its own (cookies
// apart). Screenshots of the main pages go to BERTH_UI_SCREENSHOTS when
// set (CI keeps them; docs/ui/ holds the committed ones), else to the
// test's temporary directory.

var chrome struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if chrome.cancel != nil {
		chrome.cancel()
	}
	os.Exit(code)
}

func chromiumPath() string {
	if p := os.Getenv("BERTH_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("chromium")
	return p
}

// newTab returns a chromedp context of a fresh browser context (its own
// cookies), in the package's one Chromium.
func newTab(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		testenv.Missing(t, "no Chromium (apt-get install chromium, or set BERTH_TEST_CHROMIUM)")
	}
	chrome.once.Do(func() {
		dir, err := os.MkdirTemp("", "berth-chromium-")
		if err != nil {
			chrome.err = err
			return
		}
		opts := []chromedp.ExecAllocatorOption{
			chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
			chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
			chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.Flag("hide-scrollbars", true), chromedp.Flag("font-render-hinting", "none"),
			chromedp.UserDataDir(dir), chromedp.WindowSize(1280, 860),
		}
		actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, bcancel := chromedp.NewContext(actx)
		// The first run starts the browser; it lives as long as bctx.
		if err := chromedp.Do(bctx); err != nil {
			chrome.err = err
			bcancel()
			acancel()
			return
		}
		chrome.ctx = bctx
		chrome.cancel = func() { bcancel(); acancel(); os.RemoveAll(dir) }
	})
	if chrome.err != nil {
		t.Fatalf("starting Chromium %s: %v", path, chrome.err)
	}
	ctx, cancel := chromedp.NewContext(chrome.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	// The first run opens the tab, for as long as ctx lives: without a
	// timeout of its own (one would close the tab).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	return ctx
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitFor polls a JavaScript predicate in the page until it holds,
// across navigations (a page being replaced cannot answer for a moment).
func waitFor(t *testing.T, ctx context.Context, what, predicate string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ok, err := chromedp.Run(ectx, chromedp.Evaluate[bool]("!!("+predicate+")"))
		cancel()
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	body, _ := chromedp.Run(ctx, chromedp.Evaluate[string]("document.body ? document.body.innerText : ''"))
	t.Fatalf("waiting for %s at %s: %v\n%.2000s", what, loc, last, body)
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("BERTH_UI_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

const webshop = `
stages: [build, test, deploy]
compile:
  stage: build
  script: [make]
  artifacts:
    paths: [bin/]
assets:
  stage: build
  script: [npm run build]
lint:
  stage: test
  needs: []
  script: [golangci-lint run]
unit-tests:
  stage: test
  needs: [compile]
  script: [go test ./...]
integration:
  stage: test
  needs: [compile, assets]
  script: [make integration]
deploy-staging:
  stage: deploy
  script: [./deploy staging]
deploy-production:
  stage: deploy
  script: [./deploy production]
  when: manual
`

func sectionLog(name, header string, start, end int64, body string) string {
	return fmt.Sprintf("\x1b[0Ksection_start:%d:%s\r\x1b[0K\x1b[36;1m%s\x1b[0;m\n%s\x1b[0Ksection_end:%d:%s\r\x1b[0K\n", start, name, header, body, end, name)
}

const runnerBanner = "\x1b[0KRunning with berth 1.0 (runner s_builder)\x1b[0;m\n\x1b[0K  on builder-1 glrt-t1_abc, system ID: s_builder\x1b[0;m\n"

// TestBrowser walks the UI as a person would, in Chromium: sign in, open
// a running pipeline, watch a job's log grow, cancel the job and see it
// change state, retry it, download an artifact, see a runner go offline;
// and takes screenshots of the main pages on the way.
func TestBrowser(t *testing.T) {
	ctx := newTab(t)
	e := newEnv(t, webui.Config{})
	_, pl := e.project("acme/webshop", map[string]string{".gitlab-ci.yml": webshop})
	tok := e.runner("builder-1 (autoscaled)", "linux", "docker")

	// compile succeeds with an artifact; assets too; lint runs.
	compile := e.take(tok, "s_builder", "none", "container")
	e.clock.Advance(5 * time.Second)
	off := e.appendLog(compile, 0, runnerBanner+sectionLog("prepare_executor", "Preparing the \"instance\" executor", 1764230400, 1764230403, "Using instance i-0af3 slot 2\n")+
		sectionLog("get_sources", "Getting source from Git repository", 1764230403, 1764230405, "Fetching changes with git depth set to 20...\nChecking out 4f2c9e1a as detached HEAD (ref is main)...\n")+
		sectionLog("step_script", "Executing \"step_script\" stage of the job script", 1764230405, 1764230441, "\x1b[32;1m$ make\x1b[0;m\ngo build -o bin/webshop ./cmd/webshop\n\x1b[32;1mBuild OK\x1b[0;m\n"))
	e.appendLog(compile, off, sectionLog("upload_artifacts_on_success", "Uploading artifacts for successful job", 1764230441, 1764230442, "bin/: found 1 matching artifact files and directories\nUploading artifacts as \"archive\" to coordinator... 201 Created\n")+"\x1b[32;1mJob succeeded\x1b[0;m\n")
	e.uploadArchive(compile, map[string]string{"bin/webshop": "#!/bin/sh\necho webshop\n", "bin/VERSION": "1.4.2\n"})
	e.clock.Advance(36 * time.Second)
	e.update(compile, "success")
	assets := e.take(tok, "s_builder", "none", "container")
	e.clock.Advance(20 * time.Second)
	e.appendLog(assets, 0, runnerBanner+"\x1b[32;1m$ npm run build\x1b[0;m\nwebpack 5.91.0 compiled successfully in 4312 ms\n")
	e.update(assets, "success")
	lint := e.take(tok, "s_builder", "none", "container")
	e.clock.Advance(12 * time.Second)
	lintLog := e.appendLog(lint, 0, runnerBanner+sectionLog("get_sources", "Getting source from Git repository", 1764230460, 1764230462, "Checking out 4f2c9e1a as detached HEAD (ref is main)...\n")+
		"\x1b[0Ksection_start:1764230462:step_script\r\x1b[0K\x1b[36;1mExecuting \"step_script\" stage of the job script\x1b[0;m\n\x1b[32;1m$ golangci-lint run ./...\x1b[0;m\n"+
		"level=info msg=\"[loader] Go packages loading at mode 575\"\n\x1b[33mWARN\x1b[0m [runner] The linter 'exportloopref' is deprecated\n")
	unit := e.take(tok, "s_builder", "none", "container")
	e.appendLog(unit, 0, runnerBanner+"\x1b[32;1m$ go test ./...\x1b[0;m\nok  \tacme/webshop/cart\t0.412s\n")

	// Sign in: the UI sends a reader without a session to the form.
	base := e.http.URL
	do(t, ctx, "open the UI", chromedp.Navigate(base+"/acme/webshop/-/pipelines/"+itoa(pl.ID)))
	waitFor(t, ctx, "the sign-in form", `document.querySelector('#token') !== null`)
	do(t, ctx, "sign in",
		chromedp.SendKeys(chromedp.CSS("#token"), e.admin),
		chromedp.Click(chromedp.CSS(`.signin button[type=submit]`)),
	)
	waitFor(t, ctx, "the pipeline after signing in", `location.pathname.endsWith('/pipelines/`+itoa(pl.ID)+`') && document.querySelector('h1') && document.querySelector('h1').innerText.includes('Pipeline #')`)
	if h := text(t, ctx, "h1"); !strings.Contains(h, "running") {
		t.Errorf("pipeline heading %q, want running", h)
	}
	screenshot(t, ctx, "pipeline.png")
	do(t, ctx, "needs view", chromedp.Navigate(base+"/acme/webshop/-/pipelines/"+itoa(pl.ID)+"?view=needs"))
	waitFor(t, ctx, "the needs graph", `document.querySelectorAll('.graph svg a').length === 7`)
	screenshot(t, ctx, "needs.png")
	do(t, ctx, "projects", chromedp.Navigate(base+"/"))
	waitFor(t, ctx, "the projects", `document.body.innerText.includes('acme/webshop')`)
	screenshot(t, ctx, "projects.png")
	do(t, ctx, "pipelines", chromedp.Navigate(base+"/acme/webshop/-/pipelines"))
	waitFor(t, ctx, "the pipelines", `document.querySelectorAll('tbody tr').length === 1`)
	screenshot(t, ctx, "pipelines.png")

	// The running job's log grows in the page, without a reload.
	lintURL := base + "/acme/webshop/-/jobs/" + itoa(lint.ID)
	do(t, ctx, "the lint job", chromedp.Navigate(lintURL))
	waitFor(t, ctx, "the log", `document.querySelector('#log').innerText.includes('exportloopref')`)
	do(t, ctx, "mark the page", chromedp.Evaluate[chromedp.Void](`window.berthMark = 1`))
	lintLog = e.appendLog(lint, lintLog, "\x1b[31;1mcart/cart.go:42:2: ineffectual assignment to err (ineffassign)\x1b[0m\n")
	waitFor(t, ctx, "the new line, streamed", `document.querySelector('#log').innerText.includes('ineffectual assignment')`)
	lintLog = e.appendLog(lint, lintLog, "checkout/pay.go:17:6: func `legacyPay` is unused (unused)\n")
	waitFor(t, ctx, "another line", `document.querySelector('#log').innerText.includes('legacyPay')`)
	if mark, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`window.berthMark || 0`)); mark != 1 {
		t.Error("the page reloaded to show the log")
	}
	if colour, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector('#log .term-fg-1')).color`)); colour == "" {
		t.Error("no ANSI colour in the log")
	}
	screenshot(t, ctx, "job.png")

	// Cancel: the job is canceling, then canceled when its runner says so.
	do(t, ctx, "cancel", chromedp.Click(chromedp.CSS(`form[action$="/cancel"] button`)))
	waitFor(t, ctx, "canceling", `document.querySelector('#job-header h1').innerText.includes('canceling')`)
	e.appendLog(lint, lintLog, "\x1b[0KERROR: Job failed: canceled\x1b[0;m\n")
	code, _ := e.api("PUT", "/api/v4/jobs/"+itoa(lint.ID), runnerapi.UpdateJobRequest{Token: lint.Token, State: "failed", FailureReason: "job_canceled"},
		map[string]string{runnerapi.HeaderJobToken: lint.Token})
	if code != 200 {
		t.Fatalf("final update: %d", code)
	}
	waitFor(t, ctx, "canceled, pushed to the page", `document.querySelector('#job-header h1').innerText.includes('canceled')`)

	// Retry leads to the new job, pending.
	do(t, ctx, "retry", chromedp.Click(chromedp.CSS(`form[action$="/retry"] button`)))
	waitFor(t, ctx, "the retried job", `!location.pathname.endsWith('/`+itoa(lint.ID)+`') && document.querySelector('#job-header h1').innerText.includes('pending')`)

	// Download the compile job's artifact.
	dir := t.TempDir()
	do(t, ctx, "download the artifacts",
		chromedp.Navigate(base+"/acme/webshop/-/jobs/"+itoa(compile.ID)),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
				Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir,
				BrowserContextID: chromedp.FromContext(ctx).BrowserContextID})
			return err
		}),
		chromedp.Click(chromedp.CSS(`a[href$="/artifacts/download"]`)),
	)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err := os.Stat(filepath.Join(dir, "artifacts.zip")); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dir)
			t.Fatalf("download did not complete: %v", entries)
		}
	}
	zr, err := zip.OpenReader(filepath.Join(dir, "artifacts.zip"))
	if err != nil {
		t.Fatalf("downloaded archive: %v", err)
	}
	if len(zr.File) != 2 {
		t.Errorf("downloaded archive holds %d files", len(zr.File))
	}
	zr.Close()
	do(t, ctx, "browse the artifacts", chromedp.Navigate(base+"/acme/webshop/-/jobs/"+itoa(compile.ID)+"/artifacts/browse/bin"))
	waitFor(t, ctx, "the files", `document.body.innerText.includes('VERSION')`)

	// The fleet page with a report of the runner manager's fleet.
	f := runnerapi.Fleet{SystemID: "s_builder", Executor: "instance", Plugin: "fleeting-plugin-aws", Ready: 3, Creating: 1,
		MaxInstances: 8, Capacity: 4, SlotsInUse: 7, SlotsIdle: 5, IdleInstances: 0, Boots: 11, Deletions: 7,
		InstanceSeconds: 13.4 * 3600, Since: e.clock.Now().Add(-6 * time.Hour)}
	if code, b := e.api("PUT", "/api/v4/berth/runners/fleet", f, map[string]string{runnerapi.HeaderRunnerToken: tok}); code != 204 {
		t.Fatalf("fleet report: %d %s", code, b)
	}
	do(t, ctx, "fleet", chromedp.Navigate(base+"/-/fleet"))
	waitFor(t, ctx, "the fleet and its charts", `document.body.innerText.includes('fleeting-plugin-aws') && document.querySelectorAll('figure.chart polyline').length === 4 && document.querySelectorAll('figure.chart .now')[2].innerText.startsWith('4 ')`)
	screenshot(t, ctx, "fleet.png")

	// A runner goes offline: two hours and more without a word.
	do(t, ctx, "runners", chromedp.Navigate(base+"/-/runners"))
	waitFor(t, ctx, "the runner online", `document.querySelector('[data-status]').dataset.status === 'online'`)
	screenshot(t, ctx, "runners.png")
	e.clock.Advance(3 * time.Hour)
	waitFor(t, ctx, "the runner offline, without a reload", `document.querySelector('[data-status]').dataset.status === 'offline'`)
}

// A reader without JavaScript reads every page; the sign-in works too.
func TestBrowserWithoutJavaScript(t *testing.T) {
	ctx := newTab(t)
	e := newEnv(t, webui.Config{})
	_, pl := e.project("acme/webshop", map[string]string{".gitlab-ci.yml": webshop})
	job := e.take(e.runner("r"), "s_1")
	e.appendLog(job, 0, "hello from the log\n")
	do(t, ctx, "turn JavaScript off", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	}))
	base := e.http.URL
	// Without scripts, only the DOM is looked at (no JavaScript of
	// DevTools either).
	do(t, ctx, "sign in without JavaScript",
		chromedp.Navigate(base+"/"),
		chromedp.SendKeys(chromedp.CSS("#token"), e.admin),
		chromedp.Click(chromedp.CSS(`.signin button[type=submit]`)),
	)
	for _, c := range []struct{ path, sel, want string }{
		{"/", "table", "acme/webshop"},
		{"/acme/webshop/-/pipelines/" + itoa(pl.ID), ".stages", "compile"},
		{"/acme/webshop/-/jobs/" + itoa(job.ID), "#log", "hello from the log"},
	} {
		time.Sleep(300 * time.Millisecond) // the sign-in's redirect
		do(t, ctx, "open "+c.path, chromedp.Navigate(base+c.path))
		html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS(c.sel)))
		if err != nil || !strings.Contains(html, c.want) {
			t.Errorf("%s without JavaScript: %v %.500s", c.path, err, html)
		}
	}
}

func ptr[T any](v T) *T { return &v }
