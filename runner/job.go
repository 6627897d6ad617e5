package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/jobpush"
	"github.com/berthci/berth/runner/helper"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// Why a job's script context ends.
var (
	// ErrJobCanceled: the coordinator answered Job-Status: canceling.
	ErrJobCanceled = errors.New("job canceled")
	// ErrJobAborted: 403/404 or Job-Status canceled/failed.
	ErrJobAborted = errors.New("job aborted by the coordinator")
	// ErrJobTimeout: the job ran longer than runner_info.timeout.
	ErrJobTimeout = errors.New("job execution timed out")
	// ErrShutdown: the runner manager is stopping (SIGTERM/SIGINT).
	ErrShutdown = errors.New("runner manager is shutting down")
	// ErrScriptTimeout: the job's steps ran longer than its
	// RUNNER_SCRIPT_TIMEOUT (after_script and later stages still run).
	ErrScriptTimeout = errors.New("script timed out")
	// ErrPrepareTimeout and ErrGetSourcesTimeout: the entry's
	// prepare_timeout or get_sources_timeout ran out (gitlab-runner's
	// words).
	ErrPrepareTimeout    = errors.New("prepare timeout")
	ErrGetSourcesTimeout = errors.New("get sources timeout")
)

// maxPatch is the largest trace PATCH body.
const maxPatch = 1 << 20

// cleanupTimeout bounds an executor's Cleanup.
const cleanupTimeout = time.Hour

// defaultAfterScriptTimeout applies when the after_script step has none.
const defaultAfterScriptTimeout = 5 * time.Minute

// result is how a job ended.
type result struct {
	state    string // success | failed
	reason   string // unmapped failure reason
	exitCode int
	message  string
}

// jobRun is one job from hand-out to final update.
type jobRun struct {
	m    *Manager
	w    *worker
	job  *runnerapi.JobResponse
	jc   network.JobCredentials
	log  *slog.Logger
	tr   *Trace
	slot int
	// reservation is the key capacity was reserved under ("" without a
	// Reserver).
	reservation string
	// streamAck awaits the coordinator's answer to the job's admit on the
	// push stream it came on, when that admit acknowledges it (nil: the
	// job is acknowledged on REST).
	streamAck jobpush.AckWait

	abortCtx     context.Context
	abort        context.CancelCauseFunc
	scriptCtx    context.Context
	cancelScript context.CancelCauseFunc

	mu          sync.Mutex
	sent        int64
	interval    time.Duration
	lastContact time.Time
	traceGone   bool
	canceled    bool
	aborted     bool
	// warned are the variables whose warning the log has (stageTimeout).
	warned map[string]bool

	timing timings
	// debugTrace is CI_DEBUG_TRACE as the job's settings have it
	// (debugTraceSetting): its log is sent as a debug trace.
	debugTrace atomic.Bool
	// otel traces the job when its payload asks (nil: it does not).
	otel *jobTracer
}

func newJobRun(m *Manager, w *worker, job *runnerapi.JobResponse, slot int) *jobRun {
	creds := w.creds()
	secrets := []string{job.Token}
	for _, v := range job.Variables {
		if v.Masked {
			secrets = append(secrets, v.Value)
		}
	}
	prefixes := append(append([]string{}, token.MaskPrefixes...), job.Features.TokenMaskPrefixes...)
	r := &jobRun{
		m: m, w: w, job: job, slot: slot,
		jc:       network.JobCredentials{URL: creds.URL, ID: job.ID, Token: job.Token},
		log:      m.log.With("runner", w.short, "job", job.ID),
		tr:       NewTrace(w.rc.OutputLimitBytes(), secrets, prefixes),
		interval: m.opts.TraceInterval,
	}
	r.timing.t = JobTiming{JobID: job.ID, Name: job.JobInfo.Name, Stage: job.JobInfo.Stage, Received: time.Now(), State: "aborted"}
	r.abortCtx, r.abort = context.WithCancelCause(m.jobsCtx)
	r.scriptCtx, r.cancelScript = context.WithCancelCause(r.abortCtx)
	return r
}

// jobIsolation is the isolation level the job asked for (its
// BERTH_ISOLATION variable; none when absent or unknown).
func jobIsolation(job *runnerapi.JobResponse) executor.Isolation {
	level := executor.IsolationNone
	for _, v := range job.Variables {
		if v.Key == runnerapi.IsolationVariable {
			if l, err := executor.ParseIsolation(strings.TrimSpace(v.Value)); err == nil {
				level = l
			}
		}
	}
	return level
}

// requestAbort kills everything; no after_script, no final update.
func (r *jobRun) requestAbort(why string) {
	r.mu.Lock()
	first := !r.aborted
	r.aborted = true
	r.mu.Unlock()
	if first {
		r.log.Warn("job aborted by the coordinator", "why", why)
		r.abort(ErrJobAborted)
	}
}

// requestCancel stops the script; after_script still runs.
func (r *jobRun) requestCancel() {
	r.mu.Lock()
	first := !r.canceled
	r.canceled = true
	r.mu.Unlock()
	if first {
		r.log.Info("job canceled by the coordinator")
		r.cancelScript(ErrJobCanceled)
	}
}

func (r *jobRun) isAborted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborted
}

// apply acts on the job state an answer carries.
func (r *jobRun) apply(st network.JobState, status string) {
	switch st {
	case network.StateAbort:
		r.requestAbort("job status " + status)
	case network.StateCancel:
		r.requestCancel()
	}
}

func (r *jobRun) setInterval(d time.Duration) {
	if d <= 0 {
		return
	}
	r.mu.Lock()
	r.interval = d
	r.mu.Unlock()
}

// acknowledge tells the coordinator that the runner runs the job: the
// answer to its admit on the push stream when that admit acknowledged it,
// else (or when the stream ended first, or the coordinator could not
// record it then) PUT /jobs/:id state=running, which also answers an
// admit the coordinator did record.
func (r *jobRun) acknowledge(ctx context.Context) (network.UpdateResult, error) {
	if r.streamAck != nil {
		a, err := r.streamAck(ctx)
		switch jobpush.Verdict(a, err) {
		case jobpush.AckAccepted:
			return network.UpdateResult{Code: http.StatusOK, JobStatus: a.JobStatus, State: network.JobStateOf(http.StatusOK, a.JobStatus),
				TraceUpdateInterval: a.TraceUpdateInterval}, nil
		case jobpush.AckRefused:
			r.log.Debug("acknowledgement refused on the push stream", "code", a.Code, "message", a.Message)
			return network.UpdateResult{Code: http.StatusForbidden, JobStatus: a.JobStatus, State: network.StateAbort}, nil
		}
		if ctx.Err() != nil {
			return network.UpdateResult{}, ctx.Err()
		}
		r.log.Info("acknowledging on REST: the push stream did not answer the admit", "err", err, "code", a.Code)
		r.m.metrics.pushJobs.WithLabelValues(r.w.short, "ack_on_rest").Inc()
	}
	return r.m.client.UpdateJob(ctx, r.jc, runnerapi.UpdateJobRequest{State: runnerapi.StateRunning, Info: r.w.infoCopy()})
}

// run is the whole life of the job.
func (r *jobRun) run() {
	start := time.Now()
	if f := r.m.opts.OnJobTiming; f != nil {
		defer func() {
			t := r.timing.snapshot()
			t.Finished = time.Now()
			f(t)
		}()
	}
	netCtx := r.m.netCtx
	res, err := r.acknowledge(netCtx)
	r.timing.mu.Lock()
	r.timing.t.Acknowledged = time.Now()
	r.timing.mu.Unlock()
	if err != nil {
		r.log.Error("acknowledging job failed; dropping it", "err", err)
		return
	}
	switch res.State {
	case network.StateAbort:
		r.log.Warn("job dropped: the coordinator no longer runs it", "job_status", res.JobStatus, "code", res.Code)
		return
	case network.StateCancel:
		r.tr.Printf("%sERROR: Job failed: canceled%s\n", ansiBoldRed, ansiReset)
		r.tr.Close()
		r.finalUpdate(result{state: runnerapi.StateFailed, reason: runnerapi.JobCanceled})
		r.timing.setState(runnerapi.StateFailed)
		return
	}
	r.setInterval(res.TraceUpdateInterval)
	r.mu.Lock()
	r.lastContact = time.Now()
	r.mu.Unlock()

	r.m.metrics.running.WithLabelValues(r.w.short).Inc()
	defer r.m.metrics.running.WithLabelValues(r.w.short).Dec()

	stopSender := make(chan struct{})
	senderDone := make(chan struct{})
	go r.sendLoop(stopSender, senderDone)

	r.otel = startJobTracing(r.log, r.job, r.w.rc.ID, r.w.rc.Executor, r.m.opts.Version)
	out := r.execute()
	if r.isAborted() {
		r.otel.end(r.log, "aborted")
	} else {
		r.otel.end(r.log, out.state)
	}

	close(stopSender)
	<-senderDone
	if r.isAborted() {
		r.tr.Close()
		r.log.Info("job aborted; no final update")
		r.m.metrics.duration.WithLabelValues(r.w.short, "aborted").Observe(time.Since(start).Seconds())
		return
	}
	if out.state == runnerapi.StateSuccess {
		r.tr.Printf("\n%sJob succeeded%s\n", ansiBoldGreen, ansiReset)
	} else {
		r.tr.Printf("\n%sERROR: Job failed: %s%s\n", ansiBoldRed, out.message, ansiReset)
	}
	r.tr.Close()
	r.finalUpdate(out)
	r.timing.setState(out.state)
	r.m.metrics.duration.WithLabelValues(r.w.short, out.state).Observe(time.Since(start).Seconds())
	r.log.Info("job finished", "state", out.state, "reason", out.reason, "exit_code", out.exitCode, "duration", time.Since(start).Round(time.Millisecond))
}

// sendLoop sends the trace on the server's interval and keeps the job
// alive when nothing was sent for a while.
func (r *jobRun) sendLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		r.mu.Lock()
		d := r.interval
		r.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		_ = r.flush(r.m.netCtx)
		r.mu.Lock()
		idle := time.Since(r.lastContact) >= r.m.opts.ForceSendInterval
		r.mu.Unlock()
		if idle && !r.isAborted() {
			r.keepAlive()
		}
	}
}

func (r *jobRun) keepAlive() {
	res, err := r.m.client.UpdateJob(r.m.netCtx, r.jc, runnerapi.UpdateJobRequest{
		State:  runnerapi.StateRunning,
		Output: &runnerapi.Output{Checksum: r.tr.Checksum(), Bytesize: r.tr.Len()},
	})
	if err != nil {
		r.log.Warn("keep-alive update failed", "err", err)
		return
	}
	r.mu.Lock()
	r.lastContact = time.Now()
	r.mu.Unlock()
	r.setInterval(res.TraceUpdateInterval)
	r.apply(res.State, res.JobStatus)
}

// flush sends every byte of the trace not yet sent.
func (r *jobRun) flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		sent, gone := r.sent, r.traceGone
		r.mu.Unlock()
		if gone || r.isAborted() {
			return nil
		}
		data := r.tr.From(sent, maxPatch)
		if len(data) == 0 {
			return nil
		}
		res, err := r.m.client.PatchTrace(ctx, r.jc, sent, data, r.debugTrace.Load())
		if err != nil {
			r.log.Warn("sending trace failed", "err", err)
			return err
		}
		r.mu.Lock()
		r.lastContact = time.Now()
		switch {
		case res.Gone:
			r.traceGone = true
		case res.RangeMismatch:
			r.log.Info("trace offset mismatch; resuming where the coordinator is", "ours", sent, "theirs", res.Offset)
			r.sent = min(res.Offset, r.tr.Len())
		case res.State == network.StateOK || res.State == network.StateCancel:
			r.sent = sent + int64(len(data))
			r.m.metrics.traceBytes.WithLabelValues(r.w.short).Add(float64(len(data)))
		}
		r.mu.Unlock()
		r.setInterval(res.TraceUpdateInterval)
		r.apply(res.State, res.JobStatus)
		if res.Gone || res.State == network.StateAbort {
			return nil
		}
	}
}

// finalUpdate sends the job's final state: trace flushed first, 202
// repeated after the update interval, 412 re-sends the whole trace, other
// failures retried with backoff up to job_status_final_update_retry_limit.
func (r *jobRun) finalUpdate(out result) {
	ctx := r.m.netCtx
	req := runnerapi.UpdateJobRequest{State: out.state, Info: r.w.infoCopy()}
	if out.state == runnerapi.StateFailed {
		req.FailureReason = MapFailureReason(out.reason, r.job.Features.FailureReasons)
		req.ExitCode = out.exitCode
	}
	r.setInterval(r.m.opts.TraceInterval)
	limit := r.w.rc.EffectiveFinalUpdateRetryLimit()
	failures := 0
	for {
		_ = r.flush(ctx)
		req.Output = &runnerapi.Output{Checksum: r.tr.Checksum(), Bytesize: r.tr.Len()}
		req.Checksum = req.Output.Checksum
		res, err := r.m.client.UpdateJob(ctx, r.jc, req)
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				r.log.Error("final update abandoned: shutting down", "err", err)
				return
			}
			failures++
			if failures >= limit {
				r.log.Error("final update failed; giving up", "attempts", failures, "err", err)
				return
			}
			wait = r.m.opts.FinalUpdateBackoff.Delay(failures - 1)
			r.log.Warn("final update failed; retrying", "attempt", failures, "wait", wait, "err", err)
		case res.Accepted:
			wait = res.TraceUpdateInterval
			if wait <= 0 {
				r.mu.Lock()
				wait = r.interval
				r.mu.Unlock()
			}
			r.log.Debug("final update accepted, trace not finalized yet; repeating", "wait", wait)
		case res.TraceReset:
			failures++
			if failures >= limit {
				r.log.Error("trace validation keeps failing; giving up", "attempts", failures)
				return
			}
			r.log.Warn("trace validation failed; re-sending the whole trace")
			r.mu.Lock()
			r.sent, r.traceGone = 0, false
			r.mu.Unlock()
			continue
		case res.Code == http.StatusOK:
			return
		default:
			r.log.Warn("final update rejected: the job is no longer running", "code", res.Code, "job_status", res.JobStatus)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			r.log.Error("final update abandoned: shutting down")
			return
		case <-t.C:
		}
	}
}

// section writes GitLab's collapsible section markers around fn.
func (r *jobRun) section(name, header string, fn func() error) error {
	defer r.timing.step(name, time.Now())
	r.tr.Printf("section_start:%d:%s\r\x1b[0K\x1b[0K\x1b[36;1m%s\x1b[0;m\n", time.Now().Unix(), name, header)
	endSpan := r.otel.stage(name)
	err := fn()
	endSpan(err != nil)
	r.tr.Printf("section_end:%d:%s\r\x1b[0K\n", time.Now().Unix(), name)
	return err
}

// unsupported lists payload options this runner cannot honour.
func (r *jobRun) unsupported() []string {
	var u []string
	if strings.TrimSpace(r.job.Run) != "" {
		u = append(u, "run (step-runner steps)")
	}
	if len(r.job.Steps) == 0 && strings.TrimSpace(r.job.Run) == "" {
		u = append(u, "a job without steps")
	}
	return u
}

// projectPath is where the project lives below the concurrency directory.
func (r *jobRun) projectPath() string { return projectPathOf(r.job) }

// projectPathOf is the job's project path (group/project): the payload's
// project_full_path, else the repository URL's path, else project-<id>.
func projectPathOf(job *runnerapi.JobResponse) string {
	if p := strings.Trim(job.JobInfo.ProjectFullPath, "/"); p != "" && !strings.Contains(p, "..") {
		return p
	}
	if u, err := url.Parse(job.GitInfo.RepoURL); err == nil && job.GitInfo.RepoURL != "" {
		p := strings.TrimSuffix(strings.Trim(path.Clean(u.Path), "/"), ".git")
		if p != "" && p != "." && !strings.Contains(p, "..") {
			return p
		}
	}
	return "project-" + strconv.FormatInt(job.JobInfo.ProjectID, 10)
}

// variables are the job's variables with the runner's own and config's
// environment, values expanded unless raw.
func (r *jobRun) variables(env executor.Environment, projectDir, buildsDir string) []runnerapi.Variable {
	pub := func(k, v string) runnerapi.Variable {
		return runnerapi.Variable{Key: k, Value: v, Public: true, Raw: true}
	}
	vars := []runnerapi.Variable{
		pub("CI_PROJECT_DIR", projectDir),
		pub("CI_BUILDS_DIR", buildsDir),
		pub("CI_CONCURRENT_ID", strconv.Itoa(r.slot)),
		pub("CI_CONCURRENT_PROJECT_ID", strconv.Itoa(r.slot)),
		pub("CI_RUNNER_SHORT_TOKEN", r.w.short),
		pub("CI_RUNNER_VERSION", r.m.opts.Version),
		pub("CI_RUNNER_EXECUTABLE_ARCH", runtime.GOOS+"/"+runtime.GOARCH),
	}
	vars = append(vars, r.tlsVariables()...)
	vars = append(vars, env.Variables...)
	vars = append(vars, r.job.Variables...)
	for _, e := range r.w.rc.Environment {
		if k, v, ok := strings.Cut(e, "="); ok {
			vars = append(vars, runnerapi.Variable{Key: k, Value: v})
		}
	}
	lookup := map[string]string{}
	for i, v := range vars {
		if !v.Raw && strings.Contains(v.Value, "$") {
			vars[i].Value = os.Expand(v.Value, func(k string) string {
				if k == "$" {
					return "$"
				}
				return lookup[k]
			})
		}
		lookup[v.Key] = vars[i].Value
	}
	return vars
}

// tlsVariables are GitLab's CI_SERVER_TLS_CA_FILE, CI_SERVER_TLS_CERT_FILE
// and CI_SERVER_TLS_KEY_FILE: file variables holding the entry's TLS
// files (tls-*-file or the certs directory's), so that the job's git and
// the helper trust the coordinator as the runner does (and present its
// client certificate). Without an authority file, the authorities are the
// chain that verified the coordinator for the runner (GitLab's runner
// does the same): a job image that lacks the authority the runner's host
// trusts still reaches the coordinator. The key file is not public, as in
// GitLab's runner.
func (r *jobRun) tlsVariables() []runnerapi.Variable {
	read := func(key, path string, public bool) []runnerapi.Variable {
		if path == "" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			r.log.Warn("reading a TLS file for the job", "variable", key, "err", err)
			return nil
		}
		return []runnerapi.Variable{{Key: key, Value: string(b), Public: public, File: true, Raw: true}}
	}
	rc := r.w.rc
	f := rc.TLSFiles()
	vars := read(network.TLSCAFileVariable, f.CAFile, true)
	if f.CAFile == "" {
		if chain := r.w.m.client.PresentedChain(rc.URL); chain != "" {
			vars = []runnerapi.Variable{{Key: network.TLSCAFileVariable, Value: chain, Public: true, File: true, Raw: true}}
		}
	}
	if f.CertFile != "" && f.KeyFile != "" {
		vars = append(vars, read(network.TLSCertFileVariable, f.CertFile, true)...)
		vars = append(vars, read(network.TLSKeyFileVariable, f.KeyFile, false)...)
	}
	return vars
}

// debugTraceSetting is CI_DEBUG_TRACE (debugSetting).
func (r *jobRun) debugTraceSetting(vars []runnerapi.Variable) bool {
	return r.debugSetting(vars, "CI_DEBUG_TRACE")
}

// debugSetting is a debug variable (CI_DEBUG_TRACE, CI_DEBUG_SERVICES) as
// gitlab-runner reads it: a bool (another value is a warning and off),
// off with gitlab-runner's warning where the entry sets
// debug_trace_disabled.
func (r *jobRun) debugSetting(vars []runnerapi.Variable, key string) bool {
	on, warn := boolVariable(vars, key, false)
	switch {
	case warn != "":
		r.tr.Printf("%s%s%s\n", ansiBoldYellow, warn, ansiReset)
	case on && r.w.rc.DebugTraceDisabled:
		r.tr.Printf("%sWARNING: %s: usage is disabled on this Runner%s\n", ansiBoldYellow, key, ansiReset)
		return false
	}
	return on
}

// jobTimeout is the job's timeout: runner_info.timeout, else an hour.
func (r *jobRun) jobTimeout() time.Duration {
	if t := time.Duration(r.job.RunnerInfo.Timeout) * time.Second; t > 0 {
		return t
	}
	return time.Hour
}

// stageTimeout is the duration a stage timeout variable (gitlab-runner's
// RUNNER_SCRIPT_TIMEOUT, RUNNER_AFTER_SCRIPT_TIMEOUT) sets, 0 when it sets
// none; a malformed or negative value, or one longer than limit (the
// job's timeout), is ignored with gitlab-runner's warning. Warnings are
// printed once per variable.
func (r *jobRun) stageTimeout(s *scripts, key string, limit time.Duration) time.Duration {
	raw := strings.TrimSpace(s.varValue(key))
	if raw == "" {
		return 0
	}
	d, err := time.ParseDuration(raw)
	warn := ""
	switch {
	case err != nil:
		warn = fmt.Sprintf("Ignoring malformed %s timeout: %v", key, raw)
	case d < 0:
		warn = fmt.Sprintf("Ignoring relative %s timeout: %v", key, raw)
	case d > limit:
		warn = fmt.Sprintf("%s timeout: %v is longer than job timeout. Setting to job timeout", key, raw)
	default:
		return d
	}
	r.mu.Lock()
	if r.warned == nil {
		r.warned = map[string]bool{}
	}
	first := !r.warned[key]
	r.warned[key] = true
	r.mu.Unlock()
	if first {
		r.tr.Printf("%sWARNING: %s%s\n", ansiBoldYellow, warn, ansiReset)
	}
	return 0
}

// entryTimeout is a stage timeout of the entry (prepare_timeout,
// get_sources_timeout): 0 when unset; a value not above 0, or above the
// job's timeout (limit), is ignored with gitlab-runner's warning.
func (r *jobRun) entryTimeout(key string, d *time.Duration, limit time.Duration) time.Duration {
	switch {
	case d == nil:
		return 0
	case *d <= 0:
		r.tr.Printf("%sWARNING: %s (%s) must be greater than 0; using job timeout (%s)%s\n", ansiBoldYellow, key, *d, limit, ansiReset)
		return 0
	case *d > limit:
		r.tr.Printf("%sWARNING: %s (%s) exceeds job timeout (%s); using job timeout%s\n", ansiBoldYellow, key, *d, limit, ansiReset)
		return 0
	}
	return *d
}

// stageDeadline is ctx, ended after d with cause unless done is called
// first (d of 0, or not under the job's own timeout: ctx itself). Done
// stops the clock without ending the context, so an executor that keeps
// the context it prepared with is not cut off later; once done returned,
// the context has ended by the clock or never will. The stage timeouts
// (prepare_timeout, get_sources_timeout, RUNNER_SCRIPT_TIMEOUT) all run
// on it.
func stageDeadline(ctx context.Context, d, jobTimeout time.Duration, cause error) (context.Context, func()) {
	if d <= 0 || d >= jobTimeout {
		return ctx, func() {}
	}
	c, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	stopped := false
	t := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			cancel(cause)
		}
	})
	return c, func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// stageTimedOut is err, or the stage's timeout (stageDeadline's cause)
// when its clock ended stageCtx while the job's own context runs on.
func stageTimedOut(jobCtx, stageCtx context.Context, err error) error {
	if err == nil || stageCtx == jobCtx || jobCtx.Err() != nil || stageCtx.Err() == nil {
		return err
	}
	return context.Cause(stageCtx)
}

// debugServices is CI_DEBUG_SERVICES (debugSetting) from the job's
// variables, decided before the executor prepares the job.
func (r *jobRun) debugServices() bool {
	vars := r.job.Variables
	for i := len(vars) - 1; i >= 0; i-- {
		if v := vars[i]; v.Key == "CI_DEBUG_SERVICES" {
			if !v.Raw {
				v.Value = r.job.ExpandVariables(v.Value)
			}
			return r.debugSetting([]runnerapi.Variable{v}, v.Key)
		}
	}
	return false
}

// variableValue is the value of the last variable named key ("" if none).
func variableValue(vars []runnerapi.Variable, key string) string {
	v, _ := lookupVariable(vars, key)
	return v
}

// lookupVariable is the value of the last variable named key, and
// whether there is one.
func lookupVariable(vars []runnerapi.Variable, key string) (string, bool) {
	for i := len(vars) - 1; i >= 0; i-- {
		if vars[i].Key == key {
			return vars[i].Value, true
		}
	}
	return "", false
}

// notAllowedError is a job's demand the runner's configuration refuses.
type notAllowedError struct{ msg string }

func (e *notAllowedError) Error() string { return e.msg }
func (e *notAllowedError) Unwrap() error { return executor.ErrNotAllowed }

// customBuildDir is the project directory a job's GIT_CLONE_PATH (clone,
// expanded) names, as GitLab's runner allows one: with custom_build_dir
// enabled, and at or within the job's builds directory (CI_BUILDS_DIR).
func customBuildDir(clone, buildsDir string, enabled bool) (string, error) {
	if !enabled {
		return "", &notAllowedError{"setting GIT_CLONE_PATH is not allowed, enable `custom_build_dir` feature"}
	}
	rel, err := filepath.Rel(buildsDir, clone)
	if err != nil || !filepath.IsAbs(clone) || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", &notAllowedError{fmt.Sprintf("the GIT_CLONE_PATH=%q has to be within %q", clone, buildsDir)}
	}
	return filepath.Clean(clone), nil
}

// attemptVariables are GitLab's variables that let a job retry its stages
// that fetch things (1 to 10 attempts, default 1).
var attemptVariables = map[string]string{
	executor.StageGetSources:        "GET_SOURCES_ATTEMPTS",
	executor.StageRestoreCache:      "RESTORE_CACHE_ATTEMPTS",
	executor.StageDownloadArtifacts: "ARTIFACT_DOWNLOAD_ATTEMPTS",
}

// stageAttempts is how often a stage may run: its *_ATTEMPTS variable,
// else EXECUTOR_JOB_SECTION_ATTEMPTS, else 1; values outside 1..10 are
// ignored with a warning, as GitLab does.
func (r *jobRun) stageAttempts(stage string) int {
	name, ok := attemptVariables[stage]
	if !ok {
		return 1
	}
	for _, key := range []string{name, "EXECUTOR_JOB_SECTION_ATTEMPTS"} {
		val, found := r.lastVar(key)
		if !found {
			continue
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > 10 {
			r.tr.Printf("%sWARNING: %s=%q is not a number from 1 to 10; using 1%s\n", ansiBoldYellow, key, val, ansiReset)
			return 1
		}
		return n
	}
	return 1
}

// execute runs the stages and returns how the job ended.
func (r *jobRun) execute() result {
	rc := r.w.rc
	r.tr.Printf("Running with berth %s\n  on %s %s, system ID: %s\n", r.m.opts.Version, rc.Name, r.w.short, r.m.systemID)
	if u := r.unsupported(); len(u) > 0 {
		r.tr.Printf("%sERROR: this runner does not support: %s%s\n", ansiBoldRed, strings.Join(u, ", "), ansiReset)
		return result{state: runnerapi.StateFailed, reason: runnerapi.RunnerSystemFailure, exitCode: 3, message: "unsupported job options"}
	}
	timeout := r.jobTimeout()
	jobCtx, cancelTimeout := context.WithTimeoutCause(r.scriptCtx, timeout, ErrJobTimeout)
	defer cancelTimeout()

	secretVars, err := r.resolveSecrets(jobCtx)
	if err != nil {
		if context.Cause(jobCtx) != nil {
			return r.classify(jobCtx, err, nil, nil)
		}
		reason := runnerapi.RunnerSystemFailure
		if se := (*secretError)(nil); errors.As(err, &se) {
			reason = se.reason
		}
		return result{state: runnerapi.StateFailed, reason: reason, message: fmt.Sprintf("resolving secrets: %v", err)}
	}

	image := ""
	if r.job.Image != nil {
		image = strings.TrimSpace(r.job.ExpandVariables(r.job.Image.Name))
	}
	mplan, why := planMatrix(r.job, r.w.short, image)
	if why != "" {
		r.tr.Printf("%sWARNING: %s: not branching: %s%s\n", ansiBoldYellow, runnerapi.MatrixBranchVariable, why, ansiReset)
	}
	// mr is the job's part in its matrix's common prefix (nil: none);
	// from is the branch point it starts from (nil: it prepares its own
	// environment).
	var mr *matrixRun
	var from *startPoint
	var ex executor.Executor
	var env executor.Environment
	// prepare_timeout bounds the executor's preparation and the
	// prepare_script stage.
	prepTimeout := r.entryTimeout("prepare_timeout", rc.PrepareTimeout, timeout)
	prepCtx, prepDone := stageDeadline(jobCtx, prepTimeout, timeout, fmt.Errorf("%w: exceeded timeout of %s", ErrPrepareTimeout, prepTimeout))
	defer prepDone()
	err = r.section(executor.StagePrepareExecutor, fmt.Sprintf("Preparing the %q executor", rc.Executor), func() error {
		jobCtx := prepCtx
		var err error
		ex, err = r.w.provider.Create(jobCtx)
		if err != nil {
			return fmt.Errorf("creating executor: %w", err)
		}
		if mplan != nil {
			if mr, err = r.joinMatrix(jobCtx, mplan, ex); err != nil {
				return err
			}
		}
		opts := executor.PrepareOptions{
			JobID: r.job.ID, ProjectPath: r.projectPath(), ShortToken: r.w.short, ConcurrencyID: r.slot,
			BuildsDir: rc.BuildsDir, CacheDir: rc.CacheDir, Shell: rc.Shell, Output: r.tr,
			Job: r.job, SystemID: r.m.systemID, Reservation: r.reservation, Isolation: jobIsolation(r.job),
			ServerURL: r.jc.URL, DebugServices: r.debugServices(), User: r.m.runUser(),
		}
		switch {
		case mr != nil && mr.from != nil:
			from = mr.start()
		case mr == nil:
			from = r.restorePoint(jobCtx, ex)
		}
		if from != nil {
			opts.Branch, opts.Snapshot = from.branch, from.bundle
			env, err = ex.Prepare(jobCtx, opts)
			from.done()
			if err == nil || jobCtx.Err() != nil {
				return err
			}
			// Run from the start, in an environment of its own.
			r.tr.Printf("%sWARNING: starting from the branch point failed: %v; preparing the job's own environment%s\n", ansiBoldYellow, err, ansiReset)
			mr, from, opts.Branch, opts.Snapshot = nil, nil, nil, nil
			cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			if cerr := ex.Cleanup(cctx); cerr != nil {
				r.log.Warn("executor cleanup failed", "err", cerr)
			}
			cancel()
			if ex, err = r.w.provider.Create(jobCtx); err != nil {
				return fmt.Errorf("creating executor: %w", err)
			}
		}
		env, err = ex.Prepare(jobCtx, opts)
		if err != nil {
			return fmt.Errorf("preparing environment: %w", err)
		}
		return nil
	})
	if mr != nil && mr.owner {
		// Whatever ends the job before its branch point was made: the
		// matrix's other jobs run the prefix themselves.
		defer mr.g.publish(nil, nil, 0)
	}
	if ex != nil {
		defer func() {
			// Executors bound their own cleanup (the custom executor's
			// cleanup_exec_timeout, say); this only stops a stuck one.
			cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer cancel()
			defer r.timing.step("cleanup", time.Now())
			if cerr := ex.Cleanup(cctx); cerr != nil {
				r.log.Warn("executor cleanup failed", "err", cerr)
			}
		}()
	}
	if err != nil {
		return r.classify(jobCtx, stageTimedOut(jobCtx, prepCtx, err), nil, nil)
	}
	// The project is checked out in the executor's build directory, or
	// where the job's GIT_CLONE_PATH says, within the builds directory.
	projectDir := env.BuildDir
	buildsDir := strings.TrimSuffix(projectDir, string(filepath.Separator)+filepath.FromSlash(r.projectPath()))
	vars := r.variables(env, projectDir, buildsDir)
	if clone := variableValue(vars, "GIT_CLONE_PATH"); clone != "" {
		if projectDir, err = customBuildDir(clone, buildsDir, rc.CustomBuildDirEnabled()); err != nil {
			return r.classify(jobCtx, err, nil, nil)
		}
		vars = r.variables(env, projectDir, buildsDir)
	}
	r.debugTrace.Store(r.debugTraceSetting(vars))
	safeDirectory := env.Disposable
	if rc.SafeDirectoryCheckout != nil {
		safeDirectory = *rc.SafeDirectoryCheckout
	}
	s := &scripts{
		job: r.job, rc: rc, env: env, serverURL: r.jc.URL, projectDir: projectDir, debugTrace: r.debugTrace.Load(),
		safeDirectory: safeDirectory,
		cacheRoot:     filepath.Join(env.CacheDir, filepath.FromSlash(r.projectPath())),
	}
	if r.w.cache != nil {
		// URLs are signed when their stage is written, each valid for the
		// job's timeout: a stage's requests start well within it.
		s.remote, s.runnerToken, s.urlExpiry, s.mask = r.w.cache, rc.Token, timeout, r.tr.Mask
		r.tr.Mask(r.w.cache.Secrets()...)
	}
	s.vars = append(vars, secretVars...)

	runStage := func(ctx context.Context, name, header string, run func(context.Context) error) error {
		attempts := r.stageAttempts(name)
		return r.section(name, header, func() error {
			for attempt := 1; ; attempt++ {
				// A failure of either kind (exit code or system failure)
				// is retried, as GitLab does for these stages.
				err := run(ctx)
				if err == nil || attempt >= attempts || ctx.Err() != nil {
					return err
				}
				r.tr.Printf("%sWARNING: %s failed (%v); retrying, attempt %d of %d%s\n", ansiBoldYellow, name, err, attempt+1, attempts, ansiReset)
				t := time.NewTimer(time.Duration(attempt) * time.Second)
				select {
				case <-ctx.Done():
					t.Stop()
					return err
				case <-t.C:
				}
			}
		})
	}
	stage := func(ctx context.Context, name, header, script string) error {
		if script == "" {
			return nil
		}
		return runStage(ctx, name, header, func(ctx context.Context) error {
			return ex.Run(ctx, executor.Command{Stage: name, Script: script, Output: r.tr})
		})
	}
	// A stage that only moves files runs in this process when the
	// environment's files are this process's.
	fileStage := func(ctx context.Context, name, header string, steps []fileStep) error {
		if len(steps) == 0 {
			return nil
		}
		if !env.Local {
			return stage(ctx, name, header, s.fileScript(steps))
		}
		return runStage(ctx, name, header, func(ctx context.Context) error {
			return runFileSteps(ctx, name, steps, r.tr, r.runHelper)
		})
	}
	if env.Hostname != "" {
		// Prepare has run in the environment and learnt its host name:
		// the stage that would only print it is not worth a round trip
		// to the environment (tens of milliseconds over SSH or docker
		// exec) before the job's first line.
		err = r.section(executor.StagePrepareScript, "Preparing environment", func() error {
			r.tr.Printf("Running on %s...\n", env.Hostname)
			return nil
		})
	} else {
		err = stage(prepCtx, executor.StagePrepareScript, "Preparing environment", s.prepareScript())
	}
	prepDone()
	if err == nil && prepCtx.Err() != nil {
		err = prepCtx.Err() // the clock ran out as the stage ended
	}
	err = stageTimedOut(jobCtx, prepCtx, err)
	if mr != nil && mr.owner {
		mr.logStart = r.tr.Len()
	}
	if err == nil && from != nil {
		err = r.resumed(from)
	}
	if err == nil && !from.skips(executor.StageGetSources) {
		// get_sources_timeout bounds the stage, all its attempts.
		d := r.entryTimeout("get_sources_timeout", rc.GetSourcesTimeout, timeout)
		ctx, done := stageDeadline(jobCtx, d, timeout, fmt.Errorf("%w: exceeded timeout of %s", ErrGetSourcesTimeout, d))
		err = stage(ctx, executor.StageGetSources, "Getting source from Git repository", s.getSources())
		done()
		err = stageTimedOut(jobCtx, ctx, err)
	}
	if err == nil {
		r.takePoint(ex, SnapshotGetSources, s.vars)
	}
	if err == nil && !from.skips(executor.StageRestoreCache) {
		err = fileStage(jobCtx, executor.StageRestoreCache, "Restoring cache", s.restoreCache(jobCtx))
	}
	if err == nil && !from.skips(executor.StageDownloadArtifacts) {
		err = fileStage(jobCtx, executor.StageDownloadArtifacts, "Downloading artifacts", s.downloadArtifacts())
	}
	// The script stage is split in two, before_script then the rest, for
	// a matrix's owner and a job that snapshots before_script.
	splitAt := -1
	if mr != nil && mr.owner {
		splitAt = mr.plan.lines
	} else if r.wantsPoint(SnapshotBeforeScript) {
		if splitAt = beforeScriptLines(r.job); splitAt < 0 {
			r.tr.Printf("%sWARNING: %s: no snapshot point before_script: the coordinator does not say where it ends (Berth's does)%s\n", ansiBoldYellow, SnapshotVariable, ansiReset)
		}
	}
	resumeAt := -1 // a job starting after before_script skips its own
	if from != nil && from.point == SnapshotBeforeScript {
		resumeAt = from.lines
	}
	var after *runnerapi.Step
	for i := range r.job.Steps {
		if r.job.Steps[i].Name == "after_script" {
			after = &r.job.Steps[i]
		}
	}
	// RUNNER_SCRIPT_TIMEOUT bounds the steps alone, so that after_script,
	// the cache and the artifacts still have time, as in gitlab-runner.
	d := r.stageTimeout(s, "RUNNER_SCRIPT_TIMEOUT", timeout)
	stepsCtx, stepsDone := stageDeadline(jobCtx, d, timeout, fmt.Errorf("%w after %s (RUNNER_SCRIPT_TIMEOUT)", ErrScriptTimeout, d))
	defer stepsDone()
	if err == nil {
		for _, st := range r.job.Steps {
			if st.Name == "after_script" {
				continue
			}
			name := "step_" + st.Name
			if st.Name == "script" {
				name = executor.StageStepScript
			}
			header := fmt.Sprintf("Executing %q stage of the job script", name)
			if st.Name == "script" && resumeAt >= 0 {
				if err = stage(stepsCtx, name, header, s.resumeScript(st, resumeAt, true)); err != nil {
					break
				}
				continue
			}
			if st.Name == "script" && splitAt >= 0 {
				// Its processes run on into the script, and into the
				// branch point.
				prefix := s.prefixScript(st, splitAt)
				prefixHeader := "Executing before_script"
				if mr != nil {
					prefixHeader += ", the matrix's common prefix"
				}
				err = runStage(stepsCtx, "before_script", prefixHeader, func(ctx context.Context) error {
					return ex.Run(ctx, executor.Command{Stage: "before_script", Script: prefix, Output: r.tr, KeepProcesses: true})
				})
				if err != nil {
					break
				}
				if mr != nil {
					r.branchPrefix(mr, ex)
				}
				r.takePoint(ex, SnapshotBeforeScript, s.vars)
				if err = stage(stepsCtx, name, header, s.resumeScript(st, splitAt, false)); err != nil {
					break
				}
				continue
			}
			// As gitlab-runner: the first failing step ends the steps.
			if err = stage(stepsCtx, name, header, s.step(st)); err != nil {
				break
			}
		}
		stepsDone()
		err = stageTimedOut(jobCtx, stepsCtx, err)
		if err == nil {
			r.takePoint(ex, SnapshotEnd, s.vars)
		}
		var exit *executor.ExitError
		if errors.As(err, &exit) && !r.isAborted() && jobCtx.Err() == nil {
			// The state the script failed in, before after_script
			// changes it.
			r.snapshotOnFailure(ex, s.vars)
		}
		if after != nil && len(after.Script) > 0 && !r.isAborted() && context.Cause(jobCtx) != ErrShutdown {
			if aerr := r.runAfterScript(ex, s, *after, jobCtx, err); aerr != nil && err == nil {
				// AFTER_SCRIPT_IGNORE_ERRORS=false: the job fails with it.
				err = aerr
			}
		}
	}
	failed := err != nil
	var cacheErr, uploadErr error
	canceled := errors.Is(context.Cause(jobCtx), ErrJobCanceled)
	if !r.isAborted() && !canceled && context.Cause(jobCtx) != ErrShutdown {
		postCtx, cancel := context.WithTimeout(r.abortCtx, timeout)
		name, header := executor.StageArchiveCache, "Saving cache for successful job"
		if failed {
			name, header = executor.StageArchiveCacheOnFailure, "Saving cache for failed job"
		}
		cacheErr = fileStage(postCtx, name, header, s.archiveCache(postCtx, failed))
		name, header = executor.StageUploadArtifactsOnSuccess, "Uploading artifacts for successful job"
		if failed {
			name, header = executor.StageUploadArtifactsOnFailure, "Uploading artifacts for failed job"
		}
		uploadErr = fileStage(postCtx, name, header, s.uploadArtifacts(failed))
		cancel()
	}
	if !r.isAborted() {
		cctx, cancel := context.WithTimeout(r.abortCtx, time.Minute)
		_ = fileStage(cctx, executor.StageCleanupFileVariables, "Cleaning up project directory and file based variables", s.cleanupFileVariables())
		cancel()
	}
	return r.classify(jobCtx, err, cacheErr, uploadErr)
}

// runHelper runs a helper command in this process, with the runner's
// API client.
func (r *jobRun) runHelper(ctx context.Context, args []string, out io.Writer) int {
	return helper.Run(ctx, args, out, out, r.m.client, r.m.opts.Version)
}

// runAfterScript runs after_script with its own timeout. Its failure is a
// warning, or with AFTER_SCRIPT_IGNORE_ERRORS false (gitlab-runner's),
// returned: the job fails with it unless it failed already.
func (r *jobRun) runAfterScript(ex executor.Executor, s *scripts, st runnerapi.Step, jobCtx context.Context, jobErr error) error {
	to := time.Duration(st.Timeout) * time.Second
	if to <= 0 {
		to = defaultAfterScriptTimeout
	}
	if d := r.stageTimeout(s, "RUNNER_AFTER_SCRIPT_TIMEOUT", r.jobTimeout()); d > 0 {
		to = d
	}
	status := "success"
	switch {
	case errors.Is(context.Cause(jobCtx), ErrJobCanceled):
		status = "canceled"
	case jobErr != nil:
		status = "failed"
	}
	ctx, cancel := context.WithTimeout(r.abortCtx, to)
	defer cancel()
	orig := s.vars
	s.vars = append(append([]runnerapi.Variable{}, orig...), runnerapi.Variable{Key: "CI_JOB_STATUS", Value: status, Raw: true})
	script := s.afterScript(st)
	s.vars = orig
	err := r.section(executor.StageAfterScript, "Running after_script", func() error {
		return ex.Run(ctx, executor.Command{Stage: executor.StageAfterScript, Script: script, Output: r.tr})
	})
	if err == nil {
		return nil
	}
	ignore, warn := s.boolVar("AFTER_SCRIPT_IGNORE_ERRORS", true)
	if warn != "" {
		r.tr.Printf("%s%s%s\n", ansiBoldYellow, warn, ansiReset)
	}
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		r.tr.Printf("%sWARNING: after_script timed out after %s%s\n", ansiBoldYellow, to, ansiReset)
	case ignore:
		r.tr.Printf("%sWARNING: after_script failed, but job will continue unaffected: %v%s\n", ansiBoldYellow, err, ansiReset)
	}
	if ignore {
		return nil
	}
	return err
}

// classify turns the stage errors into the job's result, in GitLab's
// priority: the script's error, then the cache's, then the artifacts'.
func (r *jobRun) classify(jobCtx context.Context, err, cacheErr, uploadErr error) result {
	if err == nil {
		err = cacheErr
	}
	if err == nil {
		err = uploadErr
	}
	if err == nil {
		return result{state: runnerapi.StateSuccess}
	}
	switch cause := context.Cause(jobCtx); {
	case errors.Is(cause, ErrShutdown):
		return result{state: runnerapi.StateFailed, reason: runnerapi.RunnerSystemFailure, message: "runner is shutting down (system failure)"}
	case errors.Is(cause, ErrJobAborted):
		return result{state: runnerapi.StateFailed, reason: runnerapi.UnknownFailure, message: "aborted"}
	case errors.Is(cause, ErrJobCanceled):
		return result{state: runnerapi.StateFailed, reason: runnerapi.JobCanceled, message: "canceled"}
	case errors.Is(cause, ErrJobTimeout):
		return result{state: runnerapi.StateFailed, reason: runnerapi.JobExecutionTimeout,
			message: fmt.Sprintf("execution took longer than %s seconds", time.Duration(r.job.RunnerInfo.Timeout)*time.Second)}
	}
	var ee *executor.ExitError
	switch {
	case errors.Is(err, ErrScriptTimeout), errors.Is(err, ErrPrepareTimeout), errors.Is(err, ErrGetSourcesTimeout):
		return result{state: runnerapi.StateFailed, reason: runnerapi.JobExecutionTimeout, message: err.Error()}
	case errors.As(err, &ee):
		return result{state: runnerapi.StateFailed, reason: runnerapi.ScriptFailure, exitCode: ee.Code, message: fmt.Sprintf("exit code %d", ee.Code)}
	case errors.Is(err, executor.ErrImagePull):
		return result{state: runnerapi.StateFailed, reason: runnerapi.ImagePullFailure, message: fmt.Sprintf("%v (image pull failure)", err)}
	case errors.Is(err, executor.ErrNotAllowed):
		return result{state: runnerapi.StateFailed, reason: runnerapi.RunnerConfigurationError, message: fmt.Sprintf("%v (runner configuration)", err)}
	}
	return result{state: runnerapi.StateFailed, reason: runnerapi.RunnerSystemFailure, message: fmt.Sprintf("%v (system failure)", err)}
}
