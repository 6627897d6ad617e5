package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// balancer is an ordinary round-robin HTTP load balancer in front of
// coordinator replicas: a backend that refuses connections is marked down
// and the request goes to the next one (bodies are buffered to be sent
// again); a request that fails after it reached a backend is answered
// 502, as a load balancer would.
type balancer struct {
	backends []string
	down     []atomic.Bool
	next     atomic.Uint64
	tr       *http.Transport
}

func newBalancer(backends []string) *balancer {
	return &balancer{backends: backends, down: make([]atomic.Bool, len(backends)),
		tr: &http.Transport{MaxIdleConnsPerHost: 64}}
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for range b.backends {
		i := int(b.next.Add(1) % uint64(len(b.backends)))
		if b.down[i].Load() {
			continue
		}
		out := r.Clone(r.Context())
		out.URL.Scheme, out.URL.Host, out.RequestURI = "http", b.backends[i], ""
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		resp, err := b.tr.RoundTrip(out)
		if err != nil {
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				b.down[i].Store(true)
				continue
			}
			http.Error(w, "502 Bad Gateway", http.StatusBadGateway)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		resp.Body.Close()
		return
	}
	http.Error(w, "503 no backend", http.StatusServiceUnavailable)
}

// runnerAPI is a minimal runner manager speaking the runner API.
type runnerAPI struct {
	base, token, systemID, last string
	hc                          *http.Client
}

func (c *runnerAPI) post(ctx context.Context, method, path string, in any) (int, http.Header, []byte, error) {
	b, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body, err
}

// request asks for a job (long poll); nil when none was given. The runner
// acknowledges what it is handed (two-phase commit, as gitlab-runner 18.5
// and later and Berth's runner do), so a job handed to a manager that goes
// away returns to the queue at the ack timeout.
func (c *runnerAPI) request(ctx context.Context) (*runnerapi.JobResponse, int, error) {
	code, h, body, err := c.post(ctx, http.MethodPost, "/api/v4/jobs/request",
		runnerapi.JobRequest{Token: c.token, SystemID: c.systemID, LastUpdate: c.last,
			Info: &runnerapi.Info{Features: runnerapi.Features{TwoPhaseJobCommit: true}}})
	if err != nil {
		return nil, 0, err
	}
	if v := h.Get(runnerapi.HeaderLastUpdate); v != "" {
		c.last = v
	}
	if code != http.StatusCreated {
		return nil, code, nil
	}
	var j runnerapi.JobResponse
	if err := json.Unmarshal(body, &j); err != nil {
		return nil, code, err
	}
	return &j, code, nil
}

// run acknowledges a job and finishes it with success, as a runner does,
// retrying what the balancer could not deliver. It reports whether the
// job ran here: an acknowledgement refused (the job went back to the queue
// while the first try was lost with a killed replica) drops it.
func (c *runnerAPI) run(ctx context.Context, j *runnerapi.JobResponse) (bool, error) {
	for _, state := range []string{"running", "success"} {
		for attempt := 0; ; attempt++ {
			code, _, body, err := c.post(ctx, http.MethodPut, fmt.Sprintf("/api/v4/jobs/%d", j.ID),
				runnerapi.UpdateJobRequest{Token: j.Token, State: state})
			switch {
			case err == nil && code == http.StatusOK:
			case ctx.Err() != nil:
				return false, ctx.Err()
			case err == nil && attempt > 0 && (code == http.StatusForbidden || code == http.StatusConflict):
				// An earlier try reached a replica that was then killed:
				// it may have applied (success is final), or the job
				// was given to another runner meanwhile.
				if state == "running" {
					return false, nil
				}
			case err == nil && code != http.StatusAccepted && code < 500:
				return false, fmt.Errorf("job %d %s: %d %s", j.ID, state, code, body)
			case attempt > 200:
				return false, fmt.Errorf("job %d %s: gave up: %d %v", j.ID, state, code, err)
			default:
				time.Sleep(50 * time.Millisecond)
				continue
			}
			break
		}
	}
	return true, nil
}

type replica struct {
	addr string
	proc *berthProcess
}

func startReplica(t *testing.T, dsn, dir, admin, external string, gitHosting bool) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := startBerth(t, "server", "--store", dsn, "--data", dir, "--listen", addr, "--admin-token", admin,
		"--external-url", external, "--reap-interval", "500ms", "--ack-timeout", "3s", "--long-poll-timeout", "5s",
		fmt.Sprintf("--git-hosting=%v", gitHosting), "--log-level", "info")
	waitFor(t, 60*time.Second, "replica "+addr+" healthy", func() bool {
		resp, err := http.Get("http://" + addr + "/-/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return &replica{addr: addr, proc: p}
}

// TestReplicas: three coordinator replicas on one PostgreSQL database
// behind a load balancer. A job enqueued on one wakes long polls held on
// the others; 2,000 jobs go through 50 runner managers, each run exactly
// once, while the leading replica is killed with SIGKILL mid-run: a job
// it had handed out unacknowledged goes back to the queue by the new
// leader's reaper, and a pipeline running across the kill completes.
func TestReplicas(t *testing.T) {
	dsn := testenv.Postgres(t)
	testenv.LookPath(t, "git")
	const admin = "replicas-admin-token"
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	var lbURL string
	lb := httptest.NewUnstartedServer(nil)
	lbURL = "http://" + lb.Listener.Addr().String()
	var reps []*replica
	for i := range 3 {
		// Replica 1 hosts the repositories; replica 0 starts first and
		// leads.
		reps = append(reps, startReplica(t, dsn, filepath.Join(t.TempDir(), fmt.Sprint(i)), admin, lbURL, i == 1))
		if i == 0 {
			waitFor(t, 30*time.Second, "replica 0 leading", func() bool {
				return strings.Contains(reps[0].proc.out.String(), "this replica leads")
			})
		}
	}
	t.Cleanup(func() {
		if t.Failed() { // (also after a Fatal)
			for i, r := range reps {
				t.Logf("replica %d:\n%s", i, tail(r.proc.out.String(), 3000))
			}
		}
	})
	bal := newBalancer([]string{reps[0].addr, reps[1].addr, reps[2].addr})
	lb.Config.Handler = bal
	lb.Start()
	defer lb.Close()
	api := client.New(lbURL, admin)
	hc := &http.Client{Timeout: 30 * time.Second}

	var tokens []string
	for range 5 {
		r, err := api.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type", RunUntagged: ptr(true)})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, r.Token)
	}

	var runs sync.Map // job id → *atomic.Int32: how often a runner ran it
	count := func(id int64) int32 {
		v, _ := runs.LoadOrStore(id, new(atomic.Int32))
		return v.(*atomic.Int32).Add(1)
	}
	const total = 2000

	// Long polls held on replicas 1 and 2 are woken by jobs enqueued on
	// replica 0.
	t.Run("wake", func(t *testing.T) {
		const n = 6
		var wg sync.WaitGroup
		codes := make([]int, n)
		for i := range n {
			c := &runnerAPI{base: "http://" + reps[1+i%2].addr, token: tokens[0], systemID: fmt.Sprintf("waker-%d", i), last: "seen", hc: hc}
			wg.Go(func() {
				j, code, err := c.request(ctx)
				codes[i] = code
				if err != nil {
					t.Error(err)
				}
				if j != nil {
					ran, err := c.run(ctx, j)
					if err != nil {
						t.Error(err)
					}
					if ran {
						count(j.ID)
					}
				}
			})
		}
		time.Sleep(500 * time.Millisecond) // let the polls be held
		on0 := client.New("http://"+reps[0].addr, admin)
		for i := range n {
			if _, err := on0.Enqueue(ctx, dispatch.JobSpec{ProjectID: 1, Name: fmt.Sprintf("wake-%d", i),
				Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}}); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		for i, code := range codes {
			if code != http.StatusCreated {
				t.Errorf("long poll %d held on replica %d answered %d, want 201 (a job enqueued on replica 0)", i, 1+i%2, code)
			}
		}
	})

	// A pipeline, pushed to the replica hosting git, runs across the
	// kill.
	git := client.New("http://"+reps[1].addr, admin)
	proj, err := git.CreateProject(ctx, restapi.CreateProjectRequest{Name: "app", Path: "app", NamespacePath: "team"})
	if err != nil {
		t.Fatal(err)
	}
	pushCI(t, "http://"+reps[1].addr+"/team/app.git", admin, `stages: [build, test, deploy]
build: {stage: build, script: [make], parallel: 3}
test: {stage: test, script: [make test], parallel: 3}
deploy: {stage: deploy, script: [make deploy]}
`)

	var (
		finished atomic.Int32
		enqueued = make(chan int64, total)
		done     = make(chan struct{})
	)
	var wg sync.WaitGroup
	for m := range 50 {
		c := &runnerAPI{base: lbURL, token: tokens[m%len(tokens)], systemID: fmt.Sprintf("manager-%d", m), hc: hc}
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				j, code, err := c.request(ctx)
				if err != nil || code >= 500 {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if j == nil {
					continue
				}
				ran, err := c.run(ctx, j)
				if err != nil {
					t.Error(err)
					continue
				}
				if !ran {
					continue
				}
				if n := count(j.ID); n > 1 {
					t.Errorf("job %d ran %d times", j.ID, n)
				}
				finished.Add(1)
			}
		})
	}
	for p := range 4 {
		wg.Go(func() {
			for i := p; i < total; i += 4 {
				j, err := api.Enqueue(ctx, dispatch.JobSpec{ProjectID: 1, Name: fmt.Sprintf("load-%d", i),
					Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}})
				for attempt := 0; err != nil && attempt < 50; attempt++ {
					// The balancer answered 502: the request reached the
					// killed replica, which may have stored the job or
					// not. Enqueue again; a first copy, if stored, must
					// run once too (every job in the store is checked).
					time.Sleep(50 * time.Millisecond)
					j, err = api.Enqueue(ctx, dispatch.JobSpec{ProjectID: 1, Name: fmt.Sprintf("load-%d", i),
						Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}})
				}
				if err != nil {
					t.Errorf("enqueue %d: %v", i, err)
					return
				}
				enqueued <- j.ID
			}
		})
	}

	// Mid-run: a manager takes a job from the leader and never
	// acknowledges it; then the leader is killed.
	waitFor(t, 3*time.Minute, "a third of the jobs run", func() bool { return finished.Load() >= total/3 })
	lost := &runnerAPI{base: "http://" + reps[0].addr, token: tokens[0], systemID: "lost", hc: hc}
	var lostJob *runnerapi.JobResponse
	waitFor(t, time.Minute, "a job handed to the lost manager", func() bool {
		lostJob, _, _ = lost.request(ctx)
		return lostJob != nil
	})
	if err := reps[0].proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	reps[0].proc.cmd.Wait()
	t.Logf("killed the leader after %d jobs; job %d was handed to a manager that went away", finished.Load(), lostJob.ID)

	// Every job finishes, the pipeline too.
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	unfinished := []store.Status{store.StatusCreated, store.StatusPending, store.StatusRunning}
	deadline := time.Now().Add(4 * time.Minute)
	for {
		left, err := st.ListJobs(ctx, store.JobFilter{Statuses: unfinished, Limit: 1})
		if err == nil && len(left) == 0 && len(enqueued) == total {
			break
		}
		if time.Now().After(deadline) {
			// What is left, to tell a slow machine from a lost job.
			left, _ = st.ListJobs(ctx, store.JobFilter{Statuses: unfinished, Limit: 20})
			for _, j := range left {
				t.Logf("unfinished: job %d %q %s, runner %d, pipeline %d", j.ID, j.Name, j.Status, j.RunnerID, j.PipelineID)
			}
			t.Fatalf("timed out waiting for every job to finish: %d of %d enqueued, %d finished by the managers, %v", len(enqueued), total, finished.Load(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	close(enqueued)

	ids := map[int64]bool{}
	for id := range enqueued {
		ids[id] = true
	}
	if len(ids) != total {
		t.Errorf("%d distinct jobs enqueued, want %d", len(ids), total)
	}
	all, err := st.ListJobs(ctx, store.JobFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range all {
		v, _ := runs.Load(j.ID)
		n := int32(0)
		if v != nil {
			n = v.(*atomic.Int32).Load()
		}
		if j.Status != store.StatusSuccess || n != 1 {
			t.Errorf("job %d (%s): %s, run %d times; want success, once", j.ID, j.Name, j.Status, n)
		}
	}
	// (The lost job is among them: run once, by another manager, after
	// the new leader's reaper put it back.)
	pl, err := st.ListPipelines(ctx, store.PipelineFilter{ProjectID: proj.ID})
	if err != nil || len(pl) != 1 {
		t.Fatalf("pipelines: %v, %v", pl, err)
	}
	waitFor(t, 30*time.Second, "the pipeline succeeded", func() bool {
		p, err := st.GetPipeline(ctx, pl[0].ID)
		return err == nil && p.Status == store.StatusSuccess
	})
	leaders := 0
	for _, r := range reps[1:] {
		if strings.Contains(r.proc.out.String(), "this replica leads") {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d of the surviving replicas took the lead, want 1", leaders)
	}
}

func ptr[T any](v T) *T { return &v }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// pushCI commits a .gitlab-ci.yml and pushes it to the remote's main
// branch with the admin token.
func pushCI(t *testing.T, remote, admin, ci string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(ci), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader",
			"GIT_CONFIG_VALUE_0=Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte("root:"+admin)))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "-q", "-b", "main")
	run("add", ".gitlab-ci.yml")
	run("commit", "-q", "-m", "ci")
	run("push", "-q", remote, "HEAD:refs/heads/main")
}
