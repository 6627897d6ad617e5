package runner

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

func maxJobs(n int) func(*config.Config, *Options) {
	return func(_ *config.Config, o *Options) { o.MaxJobs = n }
}

// runOne runs a single job through the fake and returns its final updates.
func runOne(t *testing.T, f *fake, job *runnerapi.JobResponse, mutate ...func(*config.Config, *Options)) (*harness, []runnerapi.UpdateJobRequest) {
	t.Helper()
	f.add(job)
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		o.MaxJobs = 1
		for _, m := range mutate {
			m(c, o)
		}
	})
	h.start()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	return h, f.finalsOf(job.ID)
}

func lastFinal(t *testing.T, finals []runnerapi.UpdateJobRequest) runnerapi.UpdateJobRequest {
	t.Helper()
	if len(finals) == 0 {
		t.Fatal("no final update")
	}
	return finals[len(finals)-1]
}

func TestJobSucceedsWithSectionsMaskingAndChecksum(t *testing.T) {
	f := newFake(t)
	job := fakeJob(1, "echo hello from $CI_JOB_ID", "echo token=$CI_JOB_TOKEN secret=$MY_SECRET", "cat $MY_FILE", "echo dir=$CI_PROJECT_DIR", "echo pat=glpat-notavariable123")
	job.Variables = append(job.Variables,
		runnerapi.Variable{Key: "MY_SECRET", Value: "hunter2-very-secret", Masked: true},
		runnerapi.Variable{Key: "MY_FILE", Value: "file content here", File: true},
		runnerapi.Variable{Key: "DERIVED", Value: "id-$CI_JOB_ID"},
	)
	job.Steps[0].Script = append(job.Steps[0].Script, "echo derived=$DERIVED")
	h, finals := runOne(t, f, job)
	final := lastFinal(t, finals)
	if final.State != "success" || final.FailureReason != "" || final.ExitCode != 0 {
		t.Fatalf("final %+v", final)
	}
	tr := f.trace(1)
	for _, want := range []string{
		"hello from 1", "token=[MASKED]", "pat=glpat-[MASKED]", "secret=[MASKED]", "file content here", "derived=id-1",
		"section_start:", ":prepare_executor\r\x1b[0K", "section_end:", ":step_script\r\x1b[0K", ":get_sources\r", "Job succeeded",
		"dir=" + filepath.Join(h.dir, "builds", "runnertok", "0", "group", "project"),
	} {
		if !strings.Contains(tr, want) {
			t.Errorf("trace lacks %q:\n%s", want, tr)
		}
	}
	if strings.Contains(tr, "hunter2-very-secret") || strings.Contains(tr, "jobtoken1") || strings.Contains(tr, "notavariable123") {
		t.Errorf("secret in trace:\n%s", tr)
	}
	// The ack came first, with info.
	ups := f.updates[1]
	if ups[0].State != "running" || ups[0].Info == nil || !ups[0].Info.Features.CancelGracefully || !ups[0].Info.Features.TraceChecksum {
		t.Errorf("first update %+v", ups[0])
	}
	// Requests carried system_id and info, and echoed last_update.
	if r := f.requests[0]; r.SystemID != testSystemID || r.Info == nil || r.Info.Executor != "shell" || r.Token != "glrt-t1_runnertoken" {
		t.Errorf("request %+v", r)
	}
}

func TestScriptFailureExitCode(t *testing.T) {
	f := newFake(t)
	_, finals := runOne(t, f, fakeJob(2, "echo before", "exit 7", "echo never"))
	final := lastFinal(t, finals)
	if final.State != "failed" || final.FailureReason != "script_failure" || final.ExitCode != 7 {
		t.Fatalf("final %+v", final)
	}
	if tr := f.trace(2); strings.Contains(tr, "never") || !strings.Contains(tr, "ERROR: Job failed: exit code 7") {
		t.Fatalf("trace:\n%s", tr)
	}
}

func TestUnsupportedPayloadFailsWithExitCode3(t *testing.T) {
	f := newFake(t)
	job := fakeJob(3, "echo x")
	job.Run = `[{"name":"x","step":"foo"}]`
	_, finals := runOne(t, f, job)
	final := lastFinal(t, finals)
	if final.State != "failed" || final.FailureReason != "runner_system_failure" || final.ExitCode != 3 {
		t.Fatalf("final %+v", final)
	}
}

func TestTrace416ResumesAtServerOffset(t *testing.T) {
	f := newFake(t)
	// The first PATCH is stored but answered 500, so the runner re-sends
	// it; the fake then has those bytes and answers 416 with its size.
	f.onPatch = func(w http.ResponseWriter, id int64, n int, start int64, data []byte) bool {
		if n != 1 {
			return false
		}
		f.mu.Lock()
		f.traces[id] = append(f.traces[id], data...)
		f.served("patch", 500)
		f.mu.Unlock()
		w.WriteHeader(500)
		return true
	}
	_, finals := runOne(t, f, fakeJob(4, "echo one", "sleep 0.3", "echo two"))
	if final := lastFinal(t, finals); final.State != "success" {
		t.Fatalf("final %+v", final)
	}
	codes := f.codesOf("patch")
	if !slices.Contains(codes, 416) {
		t.Fatalf("no 416 served: %v", codes)
	}
	// The fake's final handler checked size and checksum of its stored
	// trace against the runner's: the resumed trace has no duplicate.
	if tr := f.trace(4); strings.Count(tr, "Running with berth") != 1 || !strings.Contains(tr, "two") {
		t.Fatalf("trace:\n%s", tr)
	}
}

func pidFromFile(t *testing.T, p string) int {
	t.Helper()
	var pid int
	waitFor(t, "pid file", func() bool {
		b, err := os.ReadFile(p)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return pid
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestForbiddenTraceAbortsWithoutFinalUpdate(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	pidFile, marker := filepath.Join(dir, "pid"), filepath.Join(dir, "after")
	job := fakeJob(5, "sleep 1000 & echo $! > "+pidFile+"; wait")
	job.Steps = append(job.Steps, runnerapi.Step{Name: "after_script", Script: []string{"touch " + marker}, When: "always"})
	f.add(job)
	h := newHarness(t, f, maxJobs(1))
	h.start()
	pid := pidFromFile(t, pidFile)
	f.mu.Lock()
	f.onPatch = func(w http.ResponseWriter, id int64, n int, start int64, data []byte) bool {
		w.WriteHeader(403)
		return true
	}
	f.mu.Unlock()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if finals := f.finalsOf(5); len(finals) != 0 {
		t.Fatalf("final update after abort: %+v", finals)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("after_script ran after an abort")
	}
	waitFor(t, "job process killed", func() bool { return !alive(pid) })
}

func TestJobStatusCanceledAborts(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	f.add(fakeJob(6, "sleep 1000 & echo $! > "+pidFile+"; wait"))
	h := newHarness(t, f, maxJobs(1))
	h.start()
	pid := pidFromFile(t, pidFile)
	f.setStatus(6, "canceled")
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if finals := f.finalsOf(6); len(finals) != 0 {
		t.Fatalf("final update after abort: %+v", finals)
	}
	waitFor(t, "job process killed", func() bool { return !alive(pid) })
}

func TestCancelingRunsAfterScriptAndReportsJobCanceled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reasons []string
		want    string
	}{
		{"coordinator lists job_canceled", append(append([]string{}, gitlabFailureReasons...), "job_canceled"), "job_canceled"},
		{"coordinator does not list it", gitlabFailureReasons, "unknown_failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			dir := t.TempDir()
			pidFile, marker := filepath.Join(dir, "pid"), filepath.Join(dir, "after")
			job := fakeJob(7, "sleep 1000 & echo $! > "+pidFile+"; wait")
			job.Features.FailureReasons = tc.reasons
			job.Steps = append(job.Steps, runnerapi.Step{Name: "after_script", Script: []string{"echo status=$CI_JOB_STATUS > " + marker}, When: "always"})
			f.add(job)
			h := newHarness(t, f, maxJobs(1))
			h.start()
			pid := pidFromFile(t, pidFile)
			f.setStatus(7, "canceling")
			if err := h.wait(); err != nil {
				t.Fatal(err)
			}
			final := lastFinal(t, f.finalsOf(7))
			if final.State != "failed" || final.FailureReason != tc.want {
				t.Fatalf("final %+v", final)
			}
			b, err := os.ReadFile(marker)
			if err != nil || strings.TrimSpace(string(b)) != "status=canceled" {
				t.Fatalf("after_script: %q %v", b, err)
			}
			if alive(pid) {
				t.Fatal("script process survived the cancel")
			}
		})
	}
}

func TestCancelingOnAckFailsAtOnce(t *testing.T) {
	f := newFake(t)
	job := fakeJob(8, "touch should-not-run")
	f.add(job)
	f.setStatus(8, "canceling")
	h := newHarness(t, f, maxJobs(1))
	h.start()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	final := lastFinal(t, f.finalsOf(8))
	if final.State != "failed" || final.FailureReason != "unknown_failure" {
		t.Fatalf("final %+v", final)
	}
	if strings.Contains(f.trace(8), "section_start") {
		t.Fatalf("stages ran: %s", f.trace(8))
	}
}

func TestFinalUpdate202IsRepeated(t *testing.T) {
	f := newFake(t)
	f.onFinal = func(w http.ResponseWriter, id int64, n int, req runnerapi.UpdateJobRequest) bool {
		if n <= 2 {
			w.Header().Set(runnerapi.HeaderTraceUpdateInterval, "1")
			reply(w, 202, map[string]any{})
			return true
		}
		return false
	}
	_, finals := runOne(t, f, fakeJob(9, "echo x"))
	if len(finals) != 3 || lastFinal(t, finals).State != "success" {
		t.Fatalf("final updates %+v, want two 202 then 200", finals)
	}
}

func TestFinalUpdate412ResendsWholeTrace(t *testing.T) {
	f := newFake(t)
	f.onFinal = func(w http.ResponseWriter, id int64, n int, req runnerapi.UpdateJobRequest) bool {
		if n == 1 {
			// Lose the stored trace, as a coordinator whose chunks failed
			// validation does, and ask for it again.
			f.mu.Lock()
			f.traces[id] = nil
			f.mu.Unlock()
			reply(w, 412, map[string]string{"message": "trace validation failed"})
			return true
		}
		return false
	}
	_, finals := runOne(t, f, fakeJob(10, "echo resend-me"))
	if len(finals) != 2 || lastFinal(t, finals).State != "success" {
		t.Fatalf("final updates %+v", finals)
	}
	if tr := f.trace(10); !strings.HasPrefix(tr, "Running with berth") || !strings.Contains(tr, "resend-me") {
		t.Fatalf("trace not re-sent from 0:\n%s", tr)
	}
}

func TestFinalUpdateRetriedThenGivesUp(t *testing.T) {
	f := newFake(t)
	f.onFinal = func(w http.ResponseWriter, id int64, n int, req runnerapi.UpdateJobRequest) bool {
		reply(w, 400, map[string]string{"message": "nope"})
		return true
	}
	_, finals := runOne(t, f, fakeJob(11, "true"), func(c *config.Config, _ *Options) {
		c.Runners[0].JobStatusFinalUpdateRetryLimit = 3
	})
	if len(finals) != 3 {
		t.Fatalf("%d final updates, want 3 (job_status_final_update_retry_limit)", len(finals))
	}
}

func TestRequest409And429(t *testing.T) {
	f := newFake(t)
	f.onRequest = func(w http.ResponseWriter, n int) bool {
		switch n {
		case 1:
			reply(w, 409, map[string]string{"message": "409 Conflict"})
			return true
		case 2:
			w.Header().Set("Retry-After", "1")
			reply(w, 429, map[string]string{"message": "slow down"})
			return true
		}
		return false
	}
	f.add(fakeJob(12, "echo after-conflicts"))
	h := newHarness(t, f, maxJobs(1))
	h.start()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if final := lastFinal(t, f.finalsOf(12)); final.State != "success" {
		t.Fatalf("final %+v", final)
	}
	f.mu.Lock()
	n := len(f.requests)
	f.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d requests; want 409, then 429 retried by the client, then the job", n)
	}
}

// TestUnhealthyRunnerProbesWithBackoffAndRecovers: after
// unhealthy_requests_limit failures the runner probes with a doubling
// delay instead of pausing for the whole unhealthy_interval (an hour
// here), and takes jobs again as soon as the coordinator answers (issue 9,
// defect 7: a 12 s outage idled every runner for an hour).
func TestUnhealthyRunnerProbesWithBackoffAndRecovers(t *testing.T) {
	f := newFake(t)
	const failing = 7
	var mu sync.Mutex
	var at []time.Time
	f.onRequest = func(w http.ResponseWriter, n int) bool {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if n <= failing {
			reply(w, 403, map[string]string{"message": "403 Forbidden"})
			return true
		}
		return false
	}
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		c.Runners[0].UnhealthyRequestsLimit = 3
		c.Runners[0].UnhealthyInterval = time.Hour
		o.PollInterval = 20 * time.Millisecond
	})
	h.start()
	waitFor(t, "unhealthy state", func() bool { return h.m.currentWorkers()[0].isUnhealthy() })
	waitFor(t, "recovery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(at) > failing && !h.m.currentWorkers()[0].isUnhealthy()
	})
	h.m.Stop()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Probes 4..7 failed: each waited at least twice the one before.
	for i := 4; i < failing; i++ {
		gap, prev := at[i].Sub(at[i-1]), at[i-1].Sub(at[i-2])
		if i > 4 && gap < 2*20*time.Millisecond*time.Duration(1<<(i-5)) {
			t.Errorf("probe %d came %v after the previous one (previous gap %v): no backoff", i+1, gap, prev)
		}
	}
}

func TestTokenRotationWrittenBack(t *testing.T) {
	f := newFake(t)
	exp := time.Now().Add(30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	f.resetTo, f.resetExp = "glrt-t1_rotated", &exp
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	doc := `concurrent = 1
[[runners]]
  name = "r"
  url = "` + f.srv.URL + `"
  token = "glrt-t1_runnertoken"
  token_obtained_at = 2026-01-01T00:00:00Z
  token_expires_at = ` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `
  executor = "shell"
  [runners.docker]
    image = "kept"
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		*c = *cfg
		c.Runners[0].BuildsDir = filepath.Join(dir, "builds")
		o.ConfigPath = path
	})
	h.start()
	waitFor(t, "a request with the rotated token", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, r := range f.requests {
			if r.Token == "glrt-t1_rotated" {
				return true
			}
		}
		return false
	})
	got, _, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r := got.Runners[0]
	if r.Token != "glrt-t1_rotated" || r.TokenExpiresAt.Format(time.RFC3339) != exp || time.Since(r.TokenObtainedAt) > time.Hour {
		t.Fatalf("config after rotation: %+v", r)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `image = "kept"`) {
		t.Fatalf("rotation lost [runners.docker]:\n%s", b)
	}
}

func TestTimeout(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "after")
	job := fakeJob(13, "sleep 1000")
	job.RunnerInfo.Timeout = 1
	job.Steps = append(job.Steps, runnerapi.Step{Name: "after_script", Script: []string{"echo $CI_JOB_STATUS > " + marker}, When: "always"})
	_, finals := runOne(t, f, job)
	final := lastFinal(t, finals)
	if final.State != "failed" || final.FailureReason != "job_execution_timeout" {
		t.Fatalf("final %+v", final)
	}
	if b, _ := os.ReadFile(marker); strings.TrimSpace(string(b)) != "failed" {
		t.Fatalf("after_script after timeout: %q", b)
	}
}

func TestShutdownAbortsJobsAsSystemFailure(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	f.add(fakeJob(14, "sleep 1000 & echo $! > "+pidFile+"; wait"))
	h := newHarness(t, f, nil)
	h.start()
	pid := pidFromFile(t, pidFile)
	h.stop() // SIGTERM
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	final := lastFinal(t, f.finalsOf(14))
	if final.State != "failed" || final.FailureReason != "runner_system_failure" {
		t.Fatalf("final %+v", final)
	}
	if alive(pid) {
		t.Fatal("job process survived shutdown")
	}
}

func TestGracefulStopFinishesRunningJobs(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	f.add(fakeJob(15, "echo started", "while [ ! -e "+gate+" ]; do sleep 0.05; done", "echo finished"))
	h := newHarness(t, f, nil)
	h.start()
	waitFor(t, "job start", func() bool { return strings.Contains(f.trace(15), "started") })
	h.m.Stop() // SIGQUIT
	f.add(fakeJob(16, "echo must-not-be-taken"))
	os.WriteFile(gate, nil, 0o644)
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if final := lastFinal(t, f.finalsOf(15)); final.State != "success" {
		t.Fatalf("final %+v", final)
	}
	if len(f.finalsOf(16)) != 0 {
		t.Fatal("a job was taken after Stop")
	}
}

func TestOutputLimit(t *testing.T) {
	f := newFake(t)
	_, finals := runOne(t, f, fakeJob(17, "i=0; while [ $i -lt 3000 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done", "echo tail-marker"),
		func(c *config.Config, _ *Options) { c.Runners[0].OutputLimit = 16 })
	if final := lastFinal(t, finals); final.State != "success" || final.Output.Bytesize > 17*1024 {
		t.Fatalf("final %+v", final)
	}
	tr := f.trace(17)
	if !strings.Contains(tr, "Job's log exceeded limit of 16384 bytes") || strings.Contains(tr, "tail-marker") {
		t.Fatalf("trace of %d bytes lacks the limit notice or kept output", len(tr))
	}
}

func TestConcurrencyAndLimit(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	for i := int64(20); i < 23; i++ {
		f.add(fakeJob(i, "echo running-$CI_CONCURRENT_ID", "while [ ! -e "+gate+" ]; do sleep 0.05; done"))
	}
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		c.Concurrent = 5
		c.Runners[0].Limit = 2
		c.Runners[0].RequestConcurrency = 3
		o.MaxJobs = 3
	})
	h.start()
	waitFor(t, "two jobs running", func() bool {
		return strings.Contains(f.trace(20), "running-") && strings.Contains(f.trace(21), "running-")
	})
	// The third job stays queued while the limit is reached.
	f.mu.Lock()
	queued := len(f.queue)
	f.mu.Unlock()
	if queued != 1 {
		t.Fatalf("%d jobs queued with limit 2, want 1", queued)
	}
	ids := []string{f.trace(20), f.trace(21)}
	if strings.Contains(ids[0], "running-0") == strings.Contains(ids[1], "running-0") {
		t.Fatalf("concurrent jobs share a concurrency id:\n%s\n%s", ids[0], ids[1])
	}
	os.WriteFile(gate, nil, 0o644)
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	for i := int64(20); i < 23; i++ {
		if final := lastFinal(t, f.finalsOf(i)); final.State != "success" {
			t.Fatalf("job %d: %+v", i, final)
		}
	}
}

func TestMetrics(t *testing.T) {
	f := newFake(t)
	h, _ := runOne(t, f, fakeJob(30, "echo metrics"))
	rec := httptest.NewRecorder()
	h.m.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`berth_runner_job_requests_total{outcome="job",runner="runnertok"} 1`,
		`berth_runner_job_duration_seconds_count{runner="runnertok",state="success"} 1`,
		`berth_runner_jobs_running{runner="runnertok"} 0`,
		`berth_runner_trace_bytes_total{runner="runnertok"} ` + strconv.Itoa(len(f.trace(30))),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

var _ = context.Background

func TestUnsupportedExecutorEntriesAreSkipped(t *testing.T) {
	f := newFake(t)
	h := newHarness(t, f, func(c *config.Config, _ *Options) {
		c.Runners = append(c.Runners, &config.Runner{Name: "k8s", URL: f.srv.URL, Token: "glrt-t1_k8srunner", Executor: "kubernetes"})
	})
	if len(h.m.currentWorkers()) != 1 || h.m.currentWorkers()[0].rc.Executor != "shell" {
		t.Fatalf("workers %d", len(h.m.currentWorkers()))
	}
	cfg := &config.Config{Concurrent: 1, Runners: []*config.Runner{{Name: "d", URL: f.srv.URL, Token: "glrt-x", Executor: "kubernetes"}}}
	if _, err := New(cfg, Options{NewProvider: h.m.opts.NewProvider}); err == nil {
		t.Fatal("a config without a runnable entry accepted")
	}
}

// A 204 that brings a new X-GitLab-Last-Update is followed by a request
// at once (the coordinator holds that one: long polling), not after
// check_interval; a coordinator that answers at once with a new version
// every time gets check_interval after a few.
func TestNoJobWithANewVersionAsksAgainAtOnce(t *testing.T) {
	f := newFake(t)
	var mu sync.Mutex
	var sent []string
	f.onRequest = func(w http.ResponseWriter, n int) bool {
		mu.Lock()
		defer mu.Unlock()
		f.mu.Lock()
		sent = append(sent, f.requests[n-1].LastUpdate)
		f.mu.Unlock()
		w.Header().Set(runnerapi.HeaderLastUpdate, "v"+strconv.Itoa(n)) // always new
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	h := newHarness(t, f, func(c *config.Config, o *Options) { o.PollInterval = time.Hour })
	h.start()
	waitFor(t, "the quick requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sent) >= 1+maxQuickRequests
	})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1+maxQuickRequests {
		t.Fatalf("%d requests (last_update %q), want %d then check_interval", len(sent), sent, 1+maxQuickRequests)
	}
	for i := 1; i < len(sent); i++ {
		if sent[i] != "v"+strconv.Itoa(i) {
			t.Errorf("request %d sent last_update %q, want the version the previous answer brought", i+1, sent[i])
		}
	}
}

// After a request that brought a job the runner asks again at once, as
// gitlab-runner does; with strict_check_interval it waits check_interval
// first.
func TestStrictCheckInterval(t *testing.T) {
	for _, strict := range []bool{false, true} {
		f := newFake(t)
		f.add(fakeJob(30, "true"))
		f.add(fakeJob(31, "true"))
		h := newHarness(t, f, func(c *config.Config, o *Options) {
			o.PollInterval = time.Hour
			c.Runners[0].StrictCheckInterval = strict
		})
		h.start()
		waitFor(t, "the first job done", func() bool { return len(f.finalsOf(30)) > 0 })
		time.Sleep(300 * time.Millisecond)
		f.mu.Lock()
		left := len(f.queue)
		f.mu.Unlock()
		if want := map[bool]int{false: 0, true: 1}[strict]; left != want {
			t.Errorf("strict_check_interval %v: %d jobs left in the queue, want %d", strict, left, want)
		}
	}
}

// The entry's labels (the global ones under its own) go in every job
// request's info, as gitlab-runner sends them.
func TestLabelsInRequestInfo(t *testing.T) {
	f := newFake(t)
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		c.Labels = map[string]string{"team": "ci", "region": "eu-west-1"}
		c.Runners[0].Labels = map[string]string{"region": "us-east-1"}
	})
	h.start()
	waitFor(t, "a job request", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.requests) > 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.requests[0].Info.Labels; !maps.Equal(got, map[string]string{"team": "ci", "region": "us-east-1"}) {
		t.Errorf("info labels %v", got)
	}
}
