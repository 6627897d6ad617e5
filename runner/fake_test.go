package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/helper"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// fake is an httptest coordinator that speaks the Runner API as GitLab
// does, with hooks to script protocol paths.
//
// It hands jobs out as GitLab and Berth do with two_phase_job_commit: a
// job handed out but never acknowledged (no update, no trace) within
// fakeAckTimeout goes back to the queue. A request the runner gave up on
// (a reload retired its entry, the manager stopped) may still be answered
// with a job; the runner never sees it, and the coordinator must not lose
// it.
type fake struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	queue     []*runnerapi.JobResponse
	traces    map[int64][]byte
	updates   map[int64][]runnerapi.UpdateJobRequest
	finals    map[int64][]runnerapi.UpdateJobRequest
	status    map[int64]string // Job-Status sent back
	requests  []runnerapi.JobRequest
	codes     map[string][]int // status codes served per endpoint
	version   int
	handed    map[int64]handOut // handed out, not acknowledged yet
	resetTo   string            // token handed out by reset_authentication_token
	resetExp  *string
	finalDone chan int64

	// Hooks; returning true means the hook answered.
	onRequest func(w http.ResponseWriter, n int) bool
	onPatch   func(w http.ResponseWriter, id int64, n int, start int64, data []byte) bool
	onFinal   func(w http.ResponseWriter, id int64, n int, req runnerapi.UpdateJobRequest) bool
}

// handOut is a job handed out and when.
type handOut struct {
	job *runnerapi.JobResponse
	at  time.Time
}

// fakeAckTimeout is how long a handed-out job waits for its first update
// or trace before it is handed out again (Berth's coordinator: ack_timeout;
// long beside a runner's first update, sent at once after the 201).
const fakeAckTimeout = 5 * time.Second

func newFake(t *testing.T) *fake {
	f := &fake{
		t: t, handed: map[int64]handOut{}, traces: map[int64][]byte{}, updates: map[int64][]runnerapi.UpdateJobRequest{},
		finals: map[int64][]runnerapi.UpdateJobRequest{}, status: map[int64]string{}, codes: map[string][]int{},
		finalDone: make(chan int64, 16),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v4/jobs/request", f.handleRequest)
	mux.HandleFunc("PUT /api/v4/jobs/{id}", f.handleUpdate)
	mux.HandleFunc("PATCH /api/v4/jobs/{id}/trace", f.handlePatch)
	mux.HandleFunc("POST /api/v4/runners/reset_authentication_token", f.handleReset)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) served(endpoint string, code int) {
	f.codes[endpoint] = append(f.codes[endpoint], code)
}

func (f *fake) codesOf(endpoint string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.codes[endpoint]...)
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

func (f *fake) add(job *runnerapi.JobResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, job)
	f.status[job.ID] = "running"
	f.version++
}

func (f *fake) handleRequest(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.JobRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.requests = append(f.requests, req)
	n := len(f.requests)
	hook := f.onRequest
	f.mu.Unlock()
	if hook != nil && hook(w, n) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set(runnerapi.HeaderLastUpdate, strconv.Itoa(f.version))
	for id, h := range f.handed {
		if time.Since(h.at) > fakeAckTimeout {
			delete(f.handed, id)
			f.queue = append([]*runnerapi.JobResponse{h.job}, f.queue...)
		}
	}
	if len(f.queue) == 0 {
		f.served("request", 204)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(204)
		return
	}
	job := f.queue[0]
	f.queue = f.queue[1:]
	f.handed[job.ID] = handOut{job, time.Now()}
	f.served("request", 201)
	reply(w, 201, job)
}

func (f *fake) handleUpdate(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	var req runnerapi.UpdateJobRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	if r.Header.Get(runnerapi.HeaderJobToken) != req.Token || req.Token == "" {
		f.t.Errorf("update of job %d: JOB-TOKEN %q, body token %q", id, r.Header.Get(runnerapi.HeaderJobToken), req.Token)
	}
	f.mu.Lock()
	delete(f.handed, id)
	f.updates[id] = append(f.updates[id], req)
	status := f.status[id]
	final := req.State == "success" || req.State == "failed"
	var n int
	if final {
		f.finals[id] = append(f.finals[id], req)
		n = len(f.finals[id])
	}
	hook := f.onFinal
	trace := append([]byte(nil), f.traces[id]...)
	f.mu.Unlock()
	w.Header().Set(runnerapi.HeaderJobStatus, status)
	w.Header().Set(runnerapi.HeaderTraceUpdateInterval, "1")
	if !final {
		if status == "canceled" || status == "failed" {
			reply(w, 403, map[string]string{"message": "403 Forbidden - Job is not running"})
			return
		}
		reply(w, 200, map[string]any{})
		return
	}
	if hook != nil && hook(w, id, n, req) {
		return
	}
	want := fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(trace))
	if req.Output == nil || req.Output.Checksum != want || req.Output.Bytesize != int64(len(trace)) || req.Checksum != want {
		f.t.Errorf("final update of job %d: output %+v, stored trace %d bytes %s", id, req.Output, len(trace), want)
	}
	f.mu.Lock()
	f.served("final", 200)
	f.mu.Unlock()
	reply(w, 200, map[string]any{})
	f.finalDone <- id
}

func (f *fake) handlePatch(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	data, _ := io.ReadAll(r.Body)
	var start, end int64
	if _, err := fmt.Sscanf(r.Header.Get(runnerapi.HeaderContentRange), "%d-%d", &start, &end); err != nil || end-start+1 != int64(len(data)) {
		f.t.Errorf("PATCH Content-Range %q for %d bytes", r.Header.Get(runnerapi.HeaderContentRange), len(data))
	}
	f.mu.Lock()
	delete(f.handed, id)
	n := len(f.codes["patch"]) + 1
	hook := f.onPatch
	status := f.status[id]
	f.mu.Unlock()
	w.Header().Set(runnerapi.HeaderJobStatus, status)
	w.Header().Set(runnerapi.HeaderTraceUpdateInterval, "1")
	if hook != nil && hook(w, id, n, start, data) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := int64(len(f.traces[id]))
	if start != cur {
		w.Header().Set(runnerapi.HeaderRange, fmt.Sprintf("0-%d", cur))
		f.served("patch", 416)
		w.WriteHeader(416)
		return
	}
	f.traces[id] = append(f.traces[id], data...)
	w.Header().Set(runnerapi.HeaderRange, fmt.Sprintf("0-%d", len(f.traces[id])))
	f.served("patch", 202)
	w.WriteHeader(202)
}

func (f *fake) handleReset(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.served("reset", 201)
	reply(w, 201, runnerapi.RunnerTokenResponse{Token: f.resetTo, TokenExpiresAt: f.resetExp})
}

func (f *fake) trace(id int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.traces[id])
}

func (f *fake) finalsOf(id int64) []runnerapi.UpdateJobRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]runnerapi.UpdateJobRequest(nil), f.finals[id]...)
}

func (f *fake) setStatus(id int64, s string) {
	f.mu.Lock()
	f.status[id] = s
	f.mu.Unlock()
}

// job builds a payload for the fake.
func fakeJob(id int64, script ...string) *runnerapi.JobResponse {
	return &runnerapi.JobResponse{
		ID: id, Token: fmt.Sprintf("glcbt-jobtoken%d", id),
		JobInfo:    runnerapi.JobInfo{Name: "test", Stage: "test", ProjectID: 1, ProjectFullPath: "group/project"},
		RunnerInfo: runnerapi.RunnerInfo{Timeout: 300},
		Variables: []runnerapi.Variable{
			{Key: "CI_JOB_ID", Value: strconv.FormatInt(id, 10), Public: true},
			{Key: "CI_JOB_TOKEN", Value: fmt.Sprintf("glcbt-jobtoken%d", id), Masked: true},
		},
		Steps:    []runnerapi.Step{{Name: "script", Script: script, Timeout: 300, When: "on_success"}},
		Features: runnerapi.JobFeatures{TraceSections: true, FailureReasons: gitlabFailureReasons},
	}
}

// harness is a manager against the fake with the shell executor.
type harness struct {
	t    *testing.T
	f    *fake
	cfg  *config.Config
	m    *Manager
	dir  string
	path string
	done chan error
	stop context.CancelFunc
}

func newHarness(t *testing.T, f *fake, mutate func(*config.Config, *Options)) *harness {
	t.Helper()
	testenv.LookPath(t, "bash")
	dir := t.TempDir()
	cfg := &config.Config{Concurrent: 2, ShutdownTimeout: 10, Runners: []*config.Runner{{
		Name: "test", URL: f.srv.URL, Token: "glrt-t1_runnertoken", Executor: "shell",
		BuildsDir: filepath.Join(dir, "builds"), CacheDir: filepath.Join(dir, "cache"),
	}}}
	opts := Options{
		Logger:             slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		PollInterval:       20 * time.Millisecond,
		TraceInterval:      50 * time.Millisecond,
		ForceSendInterval:  200 * time.Millisecond,
		RequestBackoff:     network.Backoff{Min: time.Millisecond, Max: 10 * time.Millisecond, Factor: 2},
		FinalUpdateBackoff: network.Backoff{Min: time.Millisecond, Max: 10 * time.Millisecond, Factor: 2},
		SystemID:           testSystemID,
		Version:            "test",
		NewProvider: func(rc *config.Runner) (executor.Provider, error) {
			return shell.New(shell.Config{Helper: helperBinary(t), KillGrace: 500 * time.Millisecond}), nil
		},
	}
	if mutate != nil {
		mutate(cfg, &opts)
	}
	m, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, f: f, cfg: cfg, m: m, dir: dir}
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.m.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(30 * time.Second):
			h.t.Error("manager did not stop")
		}
	})
}

// wait waits for Run to return (MaxJobs reached, Stop, or ctx).
func (h *harness) wait() error {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.done <- err
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("manager did not finish")
		return nil
	}
}

// waitFor polls cond; the bound only stops a broken runner from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// helperBinary is the test binary itself: TestMain runs the helper when
// the shell executor invokes it as "<binary> helper …".
func helperBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	os.Exit(m.Run())
}

// gitlabFailureReasons is a features.failure_reasons list without
// job_canceled, like a GitLab that does not offer it (Berth's coordinator
// does).
var gitlabFailureReasons = []string{
	runnerapi.ScriptFailure, runnerapi.RunnerSystemFailure, runnerapi.JobExecutionTimeout, runnerapi.ImagePullFailure,
	runnerapi.UnknownFailure, runnerapi.RunnerConfigurationError, runnerapi.RunnerExternalDependencyFailure, runnerapi.RunnerInterrupted,
}

// testSystemID is the system_id of the managers of this test process: its
// own, so that a manager's sweep of its scope's leftover processes never
// reaches the jobs of another test process running at the same time.
var testSystemID = config.NewSystemID("")
