package coordinator

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/token"
)

// requestAt asks for a job as a runner manager offering levels (nil: a
// runner that names none, like gitlab-runner).
func (e *env) requestAt(tok, systemID, lastUpdate string, levels []string) (resp, *runnerapi.JobResponse) {
	e.t.Helper()
	req := runnerapi.JobRequest{Token: tok, SystemID: systemID, LastUpdate: lastUpdate,
		Info: &runnerapi.Info{Name: "berth", IsolationLevels: levels, Features: twoPhase.Features}}
	r := e.do("POST", "/api/v4/jobs/request", req, nil)
	if r.code != http.StatusCreated {
		return r, nil
	}
	var job runnerapi.JobResponse
	r.json(e.t, &job)
	return r, &job
}

func isolationSpec(name, level string) dispatch.JobSpec {
	s := simpleSpec(name)
	s.Isolation = level
	return s
}

// isolationVars returns the payload's BERTH_ISOLATION variables.
func isolationVars(job *runnerapi.JobResponse) []runnerapi.Variable {
	var out []runnerapi.Variable
	for _, v := range job.Variables {
		if v.Key == runnerapi.IsolationVariable {
			out = append(out, v)
		}
	}
	return out
}

// TestIsolationMatching: a job goes only to a runner whose strongest
// offered level is at least the one it needs.
func TestIsolationMatching(t *testing.T) {
	tests := []struct {
		name   string
		job    string   // level the job asks for ("" : nothing)
		offers []string // info.isolation_levels (nil: none sent)
		taken  bool
	}{
		{"vm job, runner offers none and container", "vm", []string{"none", "container"}, false},
		{"vm job, runner offers vm", "vm", []string{"vm"}, true},
		{"vm job, runner offers instance", "vm", []string{"instance"}, true},
		{"vm job, runner offers weaker and stronger", "vm", []string{"cgroups", "instance"}, true},
		{"vm job, runner names none", "vm", nil, false},
		{"vm job, runner names only unknown levels", "vm", []string{"wasm"}, false},
		{"none job, runner names none", "none", nil, true},
		{"job asking nothing, runner names none", "", nil, true},
		{"job asking nothing, runner offers vm only", "", []string{"vm"}, true},
		{"cgroups job, runner names none", "cgroups", nil, false},
		{"container job, runner offers container", "container", []string{"container"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			tok := e.createRunner(restapi.CreateRunnerRequest{})
			id := e.enqueue(isolationSpec("j", tt.job))
			r, job := e.requestAt(tok, "s_1", "", tt.offers)
			if !tt.taken {
				expectCode(t, "request", r, http.StatusNoContent)
				if e.srv.Queue().Len() != 1 {
					t.Fatal("the job left the queue")
				}
				return
			}
			expectCode(t, "request", r, http.StatusCreated)
			if job.ID != id {
				t.Fatalf("got job %d, want %d", job.ID, id)
			}
			want := tt.job
			if vars := isolationVars(job); want == "" && len(vars) != 0 {
				t.Errorf("a job asking nothing got %+v", vars)
			} else if want != "" && (len(vars) != 1 || vars[0] != (runnerapi.Variable{Key: "BERTH_ISOLATION", Value: want, Public: true})) {
				t.Errorf("BERTH_ISOLATION variables %+v, want one public %s", vars, want)
			}
		})
	}
}

// TestIsolationLongPoll: a held request of a runner that does not offer
// the level is not answered by the job; one that does is woken by it.
func TestIsolationLongPoll(t *testing.T) {
	e := newEnv(t, Config{LongPollTimeout: 300 * time.Millisecond})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	weak := []string{"none", "container"}
	r, _ := e.requestAt(tok, "s_weak", "", weak)
	expectCode(t, "first request", r, http.StatusNoContent)
	version := r.header.Get(runnerapi.HeaderLastUpdate)

	got := make(chan resp, 1)
	go func() {
		r, _ := e.requestAt(tok, "s_weak", version, weak)
		got <- r
	}()
	waitFor(t, "the weak request to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	id := e.enqueue(isolationSpec("needs vm", "vm"))
	r = <-got
	expectCode(t, "held request of a runner without vm", r, http.StatusNoContent)
	if r.header.Get(runnerapi.HeaderLastUpdate) != version {
		t.Error("the queue version of a runner that cannot run the job changed")
	}

	// A manager of the same runner offering vm has a version of its own
	// and is woken by the next vm job.
	r, job := e.requestAt(tok, "s_vm", "", []string{"vm"})
	expectCode(t, "vm request", r, http.StatusCreated)
	if job.ID != id {
		t.Fatalf("vm runner got %d, want %d", job.ID, id)
	}
	// The rest holds a request until a job comes: on a coordinator with
	// a long hold, so that a loaded machine cannot let it time out first.
	e = newEnv(t, Config{LongPollTimeout: 20 * time.Second})
	tok = e.createRunner(restapi.CreateRunnerRequest{})
	id = e.enqueue(isolationSpec("needs vm", "vm"))
	if r, job = e.requestAt(tok, "s_vm", "", []string{"vm"}); job == nil || job.ID != id {
		t.Fatalf("vm runner got %+v (status %d), want job %d", job, r.code, id)
	}
	vmVersion := r.header.Get(runnerapi.HeaderLastUpdate)
	held := make(chan *runnerapi.JobResponse, 1)
	go func() {
		_, job := e.requestAt(tok, "s_vm", vmVersion, []string{"vm"})
		held <- job
	}()
	waitFor(t, "the vm request to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	id2 := e.enqueue(isolationSpec("needs vm too", "vm"))
	if job := <-held; job == nil || job.ID != id2 {
		t.Fatalf("held vm request got %+v, want job %d", job, id2)
	}
}

// TestIsolationRunnerWithoutLevels: a runner that names no levels (the
// real gitlab-runner) runs the jobs that ask for nothing or none, and no
// other.
func TestIsolationRunnerWithoutLevels(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(isolationSpec("container", "container"))
	plain := e.enqueue(simpleSpec("plain"))
	none := e.enqueue(isolationSpec("none", "none"))
	for _, want := range []int64{plain, none} {
		r, job := e.request(tok, "s_gl", "") // no info at all
		expectCode(t, "request", r, http.StatusCreated)
		if job.ID != want {
			t.Fatalf("got job %d, want %d", job.ID, want)
		}
	}
	r, _ := e.request(tok, "s_gl", "")
	expectCode(t, "request for the container job", r, http.StatusNoContent)
}

func TestIsolationSpecValidation(t *testing.T) {
	e := newEnv(t, Config{})
	spec := isolationSpec("bad", "vms")
	spec.Variables = []runnerapi.Variable{{Key: "BERTH_ISOLATION", Value: "jail"}}
	r := e.adminDo("POST", "/api/v4/berth/jobs", spec)
	expectCode(t, "invalid isolation", r, http.StatusBadRequest)
	for _, want := range []string{
		`isolation: must be one of none, cgroups, container, microvm, vm, instance, not \"vms\"`,
		`variables[0].value: BERTH_ISOLATION must be one of none, cgroups, container, microvm, vm, instance, not \"jail\"`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("error %s does not say %s", r.body, want)
		}
	}
	// The variable asks like the field; the stronger of the two counts.
	spec = isolationSpec("both", "container")
	spec.Variables = []runnerapi.Variable{{Key: "BERTH_ISOLATION", Value: "microvm"}}
	id := e.enqueue(spec)
	if j := e.job(id); j.Isolation != "microvm" {
		t.Errorf("stored isolation %q, want microvm", j.Isolation)
	}
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	_, job := e.requestAt(tok, "s", "", []string{"microvm"})
	if job == nil || job.ID != id {
		t.Fatalf("microvm runner got %+v", job)
	}
	if vars := isolationVars(job); len(vars) != 1 || vars[0].Value != "microvm" || !vars[0].Public || vars[0].Masked {
		t.Errorf("BERTH_ISOLATION variables %+v, want one public microvm", vars)
	}
}

// TestProjectMinimumIsolation: a project's min_isolation raises what its
// jobs need, in the queue and in the payload, also for jobs already
// queued when it changes.
func TestProjectMinimumIsolation(t *testing.T) {
	needGit(t)
	e := newEnv(t, Config{LongPollTimeout: 20 * time.Second})
	r := e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: "secure", MinIsolation: "container"})
	expectCode(t, "create project", r, http.StatusCreated)
	var p restapi.ProjectJSON
	r.json(t, &p)
	if p.MinIsolation != "container" {
		t.Fatalf("min_isolation %q, want container", p.MinIsolation)
	}
	expectCode(t, "bad min_isolation", e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: "bad", MinIsolation: "strong"}), http.StatusBadRequest)
	other := e.createProject(t, "plain")
	if other.MinIsolation != "none" {
		t.Errorf("min_isolation of a project without one: %q, want none", other.MinIsolation)
	}

	tok := e.createRunner(restapi.CreateRunnerRequest{})
	spec := simpleSpec("asks nothing")
	spec.ProjectID = p.ID
	id := e.enqueue(spec)
	r, _ = e.requestAt(tok, "s_none", "", nil)
	expectCode(t, "runner without container", r, http.StatusNoContent)
	r, job := e.requestAt(tok, "s_ctr", "", []string{"container"})
	expectCode(t, "container runner", r, http.StatusCreated)
	if job.ID != id {
		t.Fatalf("got %d, want %d", job.ID, id)
	}
	if vars := isolationVars(job); len(vars) != 1 || vars[0] != (runnerapi.Variable{Key: "BERTH_ISOLATION", Value: "container", Public: true}) {
		t.Errorf("payload BERTH_ISOLATION %+v, want one public container (the project's minimum)", vars)
	}

	// A job asking for less than the minimum (by variable) runs at the
	// minimum; its variable is replaced, not repeated.
	spec = simpleSpec("asks cgroups")
	spec.ProjectID = p.ID
	spec.Variables = []runnerapi.Variable{{Key: "BERTH_ISOLATION", Value: "cgroups"}}
	id = e.enqueue(spec)

	// Raising the minimum applies to the queued job at once.
	r = e.adminDo("PUT", "/api/v4/projects/"+strconv.FormatInt(p.ID, 10), restapi.UpdateProjectRequest{MinIsolation: ptr("vm")})
	expectCode(t, "raise min_isolation", r, http.StatusOK)
	r.json(t, &p)
	if p.MinIsolation != "vm" || p.Name != "secure" {
		t.Fatalf("updated project %+v", p)
	}
	r, _ = e.requestAt(tok, "s_ctr", "", []string{"container"})
	expectCode(t, "container runner after the minimum rose to vm", r, http.StatusNoContent)
	var list []restapi.JobJSON
	e.adminDo("GET", "/api/v4/projects/secure/jobs", nil).json(t, &list)
	for _, j := range list {
		want := map[int64]string{id: "no runner offers isolation level vm (online runners offer: none, container)"}[j.ID]
		if j.PendingReason != want {
			t.Errorf("job %d in the list: pending_reason %q, want %q", j.ID, j.PendingReason, want)
		}
	}

	// Lowering it hands the job to a held request that may now run it.
	r, _ = e.requestAt(tok, "s_ctr", "", []string{"container"})
	held := make(chan *runnerapi.JobResponse, 1)
	go func() {
		_, job := e.requestAt(tok, "s_ctr", r.header.Get(runnerapi.HeaderLastUpdate), []string{"container"})
		held <- job
	}()
	waitFor(t, "the container request to be held", func() bool { return e.srv.Queue().Waiting() == 1 })
	r = e.adminDo("PUT", "/api/v4/projects/secure", restapi.UpdateProjectRequest{MinIsolation: ptr("container"), Description: ptr("d")})
	expectCode(t, "lower min_isolation", r, http.StatusOK)
	job = <-held
	if job == nil || job.ID != id {
		t.Fatalf("held request got %+v, want job %d", job, id)
	}
	if vars := isolationVars(job); len(vars) != 1 || vars[0].Value != "container" {
		t.Errorf("payload BERTH_ISOLATION %+v, want one container", vars)
	}

	expectCode(t, "bad update", e.adminDo("PUT", "/api/v4/projects/secure", restapi.UpdateProjectRequest{MinIsolation: ptr("max")}), http.StatusBadRequest)
	expectCode(t, "missing project", e.adminDo("PUT", "/api/v4/projects/999", restapi.UpdateProjectRequest{MinIsolation: ptr("vm")}), http.StatusNotFound)

	// The minimum survives a restart: the rebuilt queue applies it.
	r = e.adminDo("PUT", "/api/v4/projects/secure", restapi.UpdateProjectRequest{MinIsolation: ptr("instance")})
	expectCode(t, "raise min_isolation", r, http.StatusOK)
	spec = simpleSpec("after restart")
	spec.ProjectID = p.ID
	id = e.enqueue(spec)
	srv2, err := New(Config{}, Options{Store: e.st, Artifacts: e.srv.artifacts, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if st := srv2.queue.Stats(e.clock.Now(), srv2.runners.QueueView(e.runnerByToken(tok), "vm")); len(st) != 0 {
		t.Errorf("restarted queue offers the instance job to a vm runner: %+v", st)
	}
	if j := e.job(id); srv2.dispatch.PendingReason(j) != "no runner offers isolation level instance (online runners offer: none, container)" {
		t.Errorf("pending_reason after restart %q", srv2.dispatch.PendingReason(j))
	}
}

// TestIsolationPendingReason: a job no online runner can take for its
// isolation level says so in the API and in its (not yet started) log,
// and runs normally once a runner offering the level appears.
func TestIsolationPendingReason(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	gpu := e.createRunner(restapi.CreateRunnerRequest{TagList: []string{"gpu"}})
	vmJob := e.enqueue(isolationSpec("vm", "vm"))
	plainJob := e.enqueue(isolationSpec("container", "container"))

	if got := e.jobJSON(1, vmJob).PendingReason; got != "no runner offers isolation level vm (no online runner could take this job)" {
		t.Errorf("pending_reason before any runner asked: %q", got)
	}
	r, job := e.requestAt(tok, "s_a", "", []string{"none", "container"})
	expectCode(t, "container runner", r, http.StatusCreated)
	if job.ID != plainJob {
		t.Fatalf("got %d, want the container job %d", job.ID, plainJob)
	}
	// A runner that could not run the job anyway (tags) does not count.
	r, _ = e.requestAt(gpu, "s_gpu", "", []string{"instance"})
	expectCode(t, "gpu runner", r, http.StatusNoContent)

	const reason = "no runner offers isolation level vm (online runners offer: none, container)"
	if got := e.jobJSON(1, vmJob).PendingReason; got != reason {
		t.Errorf("pending_reason %q, want %q", got, reason)
	}
	if got := e.jobJSON(1, plainJob).PendingReason; got != "" {
		t.Errorf("handed-out job has pending_reason %q", got)
	}
	r = e.adminDo("GET", "/api/v4/projects/1/jobs/"+strconv.FormatInt(vmJob, 10)+"/trace", nil)
	expectCode(t, "trace", r, http.StatusOK)
	if want := "Waiting for a runner that offers isolation level vm: no online runner offers it (offered: none, container)\n"; string(r.body) != want {
		t.Errorf("trace %q, want %q", r.body, want)
	}
	r = e.do("GET", "/api/v4/projects/1/jobs/"+strconv.FormatInt(vmJob, 10)+"/trace", nil,
		map[string]string{runnerapi.HeaderPrivateToken: e.admin, "Range": "bytes=0-"})
	expectCode(t, "ranged trace", r, http.StatusPartialContent)
	if len(r.body) != 0 {
		t.Errorf("ranged trace of a job that has not started: %q, want the stored (empty) trace", r.body)
	}

	// Runners that stop asking stop counting after runners.OnlineWindow.
	e.clock.Advance(runners.OnlineWindow + time.Minute)
	if got := e.jobJSON(1, vmJob).PendingReason; got != "no runner offers isolation level vm (no online runner could take this job)" {
		t.Errorf("pending_reason once the runner went quiet: %q", got)
	}

	// A runner offering vm appears: the job (never failed) is handed out,
	// and its trace starts at offset 0 as usual.
	r, job = e.requestAt(tok, "s_vm", "", []string{"vm"})
	expectCode(t, "vm runner", r, http.StatusCreated)
	if job.ID != vmJob {
		t.Fatalf("vm runner got %d, want %d", job.ID, vmJob)
	}
	if got := e.jobJSON(1, vmJob); got.PendingReason != "" || got.Status != "pending" {
		t.Errorf("handed-out vm job: %+v", got)
	}
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "trace from 0", e.patch(job, "0-5", []byte("hello\n")), http.StatusAccepted)
	r = e.adminDo("GET", "/api/v4/projects/1/jobs/"+strconv.FormatInt(vmJob, 10)+"/trace", nil)
	if string(r.body) != "hello\n" {
		t.Errorf("trace of the running job %q", r.body)
	}

	// A job anyone can take has no reason.
	none := e.enqueue(simpleSpec("plain"))
	if got := e.jobJSON(1, none).PendingReason; got != "" {
		t.Errorf("plain job has pending_reason %q", got)
	}
}

// TestIsolationQueueInsight: a runner's queue insight counts only the jobs
// it could take at the levels it offers.
func TestIsolationQueueInsight(t *testing.T) {
	e := newEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("plain"))
	e.enqueue(isolationSpec("container", "container"))
	e.enqueue(isolationSpec("vm", "vm"))
	e.enqueue(isolationSpec("instance", "instance"))
	insight := func(query string) int {
		t.Helper()
		r := e.do("GET", "/api/v4/berth/queue"+query, nil, map[string]string{runnerapi.HeaderRunnerToken: tok})
		expectCode(t, "queue insight", r, http.StatusOK)
		var st restapi.QueueStats
		r.json(t, &st)
		return st.Queued
	}
	var all restapi.QueueStats
	e.adminDo("GET", "/api/v4/berth/queue", nil).json(t, &all)
	tests := []struct {
		name  string
		setup func()
		query string
		want  int
	}{
		{"admin sees all", func() {}, "", -1},
		{"runner that never asked: none", func() {}, "", 1},
		{"levels in the query", func() {}, "?isolation_levels=none,container", 2},
		{"levels in the query, repeated", func() {}, "?isolation_levels=none&isolation_levels=vm", 3},
		{"unknown levels in the query", func() {}, "?isolation_levels=wasm", 1},
		{"levels its manager offered", func() {
			e.do("POST", "/api/v4/runners/verify", runnerapi.VerifyRequest{Token: tok, SystemID: "s_1",
				Info: &runnerapi.Info{IsolationLevels: []string{"container", "vm"}}}, nil)
		}, "", 3},
		{"the strongest of its managers", func() {
			r, job := e.requestAt(tok, "s_2", "", []string{"instance"})
			expectCode(t, "request", r, http.StatusCreated)
			if job.JobInfo.Name != "plain" {
				t.Fatalf("instance runner took %q, want the oldest job, plain", job.JobInfo.Name)
			}
		}, "", 3},
		{"the query wins", func() {}, "?isolation_levels=container", 1},
	}
	for _, tt := range tests {
		tt.setup()
		if tt.want < 0 {
			if all.Queued != 4 {
				t.Errorf("%s: %d queued, want 4", tt.name, all.Queued)
			}
			continue
		}
		if got := insight(tt.query); got != tt.want {
			t.Errorf("%s: %d queued, want %d", tt.name, got, tt.want)
		}
	}
}

// jobJSON fetches a job through the REST API.
func (e *env) jobJSON(project, id int64) restapi.JobJSON {
	e.t.Helper()
	r := e.adminDo("GET", "/api/v4/projects/"+strconv.FormatInt(project, 10)+"/jobs/"+strconv.FormatInt(id, 10), nil)
	expectCode(e.t, "get job", r, http.StatusOK)
	var j restapi.JobJSON
	r.json(e.t, &j)
	return j
}

func (e *env) runnerByToken(tok string) *store.Runner {
	e.t.Helper()
	rn, err := e.st.RunnerByTokenDigest(context.Background(), token.Digest(tok))
	if err != nil {
		e.t.Fatal(err)
	}
	return rn
}

func ptr[T any](v T) *T { return &v }

// TestPipelineIsolation: levels asked in .gitlab-ci.yml (keyword, default,
// variable) reach the queue and the payload, raised by the project's
// minimum; invalid levels are configuration errors with a position.
func TestPipelineIsolation(t *testing.T) {
	e := newGitEnv(t, Config{})
	r := e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: "iso", MinIsolation: "cgroups"})
	expectCode(t, "create project", r, http.StatusCreated)
	const cfg = `
default:
  isolation: container
build:
  script: [make]
deploy:
  script: [ship]
  variables:
    BERTH_ISOLATION: vm
plain:
  script: [x]
  isolation: none
`
	e.pushFiles(t, "iso", "main", map[string]string{".gitlab-ci.yml": cfg}, "-o", "ci.skip")
	e.createPipeline(t, "iso", "main")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	got := map[string]string{}
	for range 2 {
		r, job := e.requestAt(tok, "s_ctr", "", []string{"none", "container"})
		expectCode(t, "container runner", r, http.StatusCreated)
		vars := isolationVars(job)
		if len(vars) != 1 || !vars[0].Public || vars[0].Masked {
			t.Fatalf("%s: BERTH_ISOLATION variables %+v, want one public", job.JobInfo.Name, vars)
		}
		got[job.JobInfo.Name] = vars[0].Value
	}
	r, _ = e.requestAt(tok, "s_ctr", "", []string{"none", "container"})
	expectCode(t, "container runner, vm job left", r, http.StatusNoContent)
	r, job := e.requestAt(tok, "s_vm", "", []string{"vm"})
	expectCode(t, "vm runner", r, http.StatusCreated)
	got[job.JobInfo.Name] = isolationVars(job)[0].Value
	want := map[string]string{"build": "container", "plain": "cgroups", "deploy": "vm"}
	same := len(got) == len(want)
	for k, v := range want {
		same = same && got[k] == v
	}
	if !same {
		t.Errorf("levels handed out %v, want %v", got, want)
	}

	// Invalid levels: 400 with GitLab's shape and the position.
	e.pushFiles(t, "iso", "bad", map[string]string{".gitlab-ci.yml": "build:\n  script: [make]\n  isolation: vms\n"}, "-o", "ci.skip")
	r = e.adminDo("POST", "/api/v4/projects/iso/pipeline?ref=bad", nil)
	expectCode(t, "pipeline with a bad isolation", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), `.gitlab-ci.yml:3:14: jobs:build:isolation should be one of none, cgroups, container, microvm, vm, instance, found \"vms\"`) {
		t.Errorf("error body %s", r.body)
	}
	r = e.adminDo("POST", "/api/v4/projects/iso/pipeline", restapi.CreatePipelineRequest{Ref: "main",
		Variables: []restapi.PipelineVariable{{Key: "BERTH_ISOLATION", Value: "hard"}}})
	expectCode(t, "pipeline with a bad BERTH_ISOLATION variable", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), `variable BERTH_ISOLATION (a project or pipeline variable) should be one of`) {
		t.Errorf("error body %s", r.body)
	}
}
