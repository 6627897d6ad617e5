package runner

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

func matrixJob(before []string, script []string, vars ...string) *runnerapi.JobResponse {
	j := &runnerapi.JobResponse{ID: 7, Steps: []runnerapi.Step{{Name: "script", Script: append(append([]string{}, before...), script...)}}}
	j.JobInfo.Name = "test: [a]"
	j.GitInfo.Sha = "abc"
	kv := append([]string{runnerapi.MatrixBranchVariable, "true", runnerapi.MatrixGroupVariable, "test",
		runnerapi.MatrixVariablesVariable, "FLAVOR,OS", runnerapi.BeforeScriptLinesVariable, itoa(len(before)),
		"CI_NODE_TOTAL", "3", "CI_PIPELINE_ID", "12", "FLAVOR", "a"}, vars...)
	for i := 0; i+1 < len(kv); i += 2 {
		j.Variables = append(j.Variables, runnerapi.Variable{Key: kv[i], Value: kv[i+1]})
	}
	return j
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestPlanMatrix(t *testing.T) {
	before := []string{"make deps", "export PATH=$PATH:/opt/x"}
	plan, why := planMatrix(matrixJob(before, []string{"make test FLAVOR=$FLAVOR"}), "short", "img")
	if plan == nil || why != "" || plan.lines != 2 || plan.total != 3 {
		t.Fatalf("a branchable job: %+v, %q", plan, why)
	}
	// The same prefix in the matrix's other job: the same key; anything
	// the prefix depends on changes it.
	other := matrixJob(before, []string{"make test"}, "FLAVOR", "b", "CI_JOB_ID", "8")
	if p, _ := planMatrix(other, "short", "img"); p == nil || p.key != plan.key {
		t.Errorf("another job of the matrix: %+v, want key %s", p, plan.key)
	}
	for name, p := range map[string]func() (*matrixPlan, string){
		"runner": func() (*matrixPlan, string) { return planMatrix(matrixJob(before, nil), "other", "img") },
		"image":  func() (*matrixPlan, string) { return planMatrix(matrixJob(before, nil), "short", "img2") },
		"prefix": func() (*matrixPlan, string) { return planMatrix(matrixJob([]string{"make deps"}, nil), "short", "img") },
		"pipeline": func() (*matrixPlan, string) {
			return planMatrix(matrixJob(before, nil, "CI_PIPELINE_ID", "13"), "short", "img")
		},
	} {
		if got, _ := p(); got == nil || got.key == plan.key {
			t.Errorf("%s changed: %+v, want another key", name, got)
		}
	}
	for _, c := range []struct {
		job  *runnerapi.JobResponse
		want string // "" for not asked
	}{
		{matrixJob(before, nil, runnerapi.MatrixBranchVariable, "false"), ""},
		{matrixJob([]string{"echo $FLAVOR"}, nil), "before_script uses $FLAVOR"},
		{matrixJob([]string{"echo ${OS}-x"}, nil), "before_script uses $OS"},
		{matrixJob([]string{"curl -H \"JOB-TOKEN: $CI_JOB_TOKEN\" x"}, nil), "before_script uses $CI_JOB_TOKEN"},
		{matrixJob([]string{"echo $CI_NODE_INDEX"}, nil), "before_script uses $CI_NODE_INDEX"},
		{matrixJob(before, nil, runnerapi.MatrixVariablesVariable, "GIT_DEPTH"), "the matrix varies GIT_DEPTH"},
		{matrixJob(before, nil, runnerapi.MatrixGroupVariable, ""), "not a parallel:matrix job"},
		{matrixJob(before, nil, "CI_NODE_TOTAL", "1"), "a matrix of one job"},
		{matrixJob(before, nil, runnerapi.BeforeScriptLinesVariable, "9"), "does not fit"},
	} {
		p, why := planMatrix(c.job, "short", "img")
		if p != nil || (c.want == "") != (why == "") || !strings.Contains(why, c.want) {
			t.Errorf("%v: %+v, %q, want no plan and %q", c.job.Variables, p, why, c.want)
		}
	}
	// A before_script using the project directory is fine: the branched
	// jobs keep the owner's.
	if p, why := planMatrix(matrixJob([]string{`cd "$CI_PROJECT_DIR/sub"`}, nil), "short", "img"); p == nil {
		t.Errorf("CI_PROJECT_DIR: %q", why)
	}
}

type fakeBranch struct{ dropped atomic.Int32 }

func (b *fakeBranch) Drop(context.Context) error { b.dropped.Add(1); return nil }

// TestBranchRegistry: the first job of a prefix owns it, the others wait
// for its branch point and get it; once all of them took it, it goes.
// A prefix that fails hands out nothing and the next job owns anew.
func TestBranchRegistry(t *testing.T) {
	var reg branchRegistry
	plan := &matrixPlan{key: "k", total: 3}
	job := func(id int64) *runnerapi.JobResponse { return &runnerapi.JobResponse{ID: id} }
	g, owner := reg.join(plan, job(1))
	if !owner {
		t.Fatal("the first job does not own the prefix")
	}
	g2, owner2 := reg.join(plan, job(2))
	if owner2 || g2 != g {
		t.Fatal("the second job owns a prefix of its own")
	}
	got := make(chan any, 1)
	go func() {
		b, err := g2.wait(context.Background())
		if err != nil {
			got <- err
			return
		}
		got <- b
	}()
	select {
	case v := <-got:
		t.Fatalf("a job got %v before the branch point was made", v)
	case <-time.After(50 * time.Millisecond):
	}
	fb := &fakeBranch{}
	g.publish(fb, []byte("log"), time.Second)
	g.publish(nil, nil, 0) // the owner's deferred publish: no effect
	if v := <-got; v != fb {
		t.Fatalf("the waiting job got %v", v)
	}
	g2.release()
	if fb.dropped.Load() != 0 {
		t.Fatal("dropped while a job of the matrix has yet to start")
	}
	g3, _ := reg.join(plan, job(3))
	if b, _ := g3.wait(context.Background()); b != fb {
		t.Fatal("a job arriving after the branch point does not get it")
	}
	g3.release()
	if fb.dropped.Load() != 1 {
		t.Fatalf("dropped %d times once every job took it, want 1", fb.dropped.Load())
	}
	// A new owner for a retry.
	if _, owner := reg.join(plan, job(4)); !owner {
		t.Error("a job after the branch point went does not own the prefix")
	}

	// A failed prefix.
	var reg2 branchRegistry
	g, _ = reg2.join(plan, job(1))
	w, _ := reg2.join(plan, job(2))
	g.publish(nil, nil, 0)
	if b, err := w.wait(context.Background()); b != nil || err != nil {
		t.Errorf("after a failed prefix: %v, %v, want nothing", b, err)
	}
	if _, owner := reg2.join(plan, job(3)); !owner {
		t.Error("after a failed prefix the next job does not own it")
	}
	// A waiting job whose context ends.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g, _ = reg2.join(plan, job(5))
	if _, err := g.wait(ctx); err == nil {
		t.Error("waiting with an ended context")
	}
}

// brancherExec is an executor that can branch (for restorePoint).
type brancherExec struct{ executor.Executor }

func (brancherExec) Branch(context.Context) (executor.Branch, error) { return &fakeBranch{}, nil }

// TestRestorePointScope: a snapshot point is found by the jobs of its
// pipeline on its runner entry only — never by another pipeline's (of
// this project or another) or another entry's — and it expires.
func TestRestorePointScope(t *testing.T) {
	// The coordinator has no snapshot points either.
	var asked atomic.Int32
	coord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if !strings.Contains(r.URL.Path, "/berth_snapshots/") || r.Header.Get(runnerapi.HeaderJobToken) != "job-token" {
			t.Errorf("asked the coordinator %s %s", r.Method, r.URL)
		}
		if r.URL.Query().Get("job") == "elsewhere" && strings.HasSuffix(r.URL.Path, "/berth_snapshots/end") {
			w.Write([]byte("the bundle"))
			return
		}
		http.Error(w, `{"message":"404 Snapshot Not Found"}`, http.StatusNotFound)
	}))
	defer coord.Close()
	m := &Manager{client: network.New(network.Options{})}
	run := func(short, pipeline, restore string) *jobRun {
		j := &runnerapi.JobResponse{ID: 9, Variables: []runnerapi.Variable{
			{Key: "CI_PIPELINE_ID", Value: pipeline}, {Key: RestoreVariable, Value: restore}, {Key: runnerapi.BeforeScriptLinesVariable, Value: "0"}},
			Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}}
		return &jobRun{m: m, w: &worker{short: short, rc: &config.Runner{}}, job: j, tr: NewTrace(1<<20, nil, nil),
			jc: network.JobCredentials{URL: coord.URL, ID: 9, Token: "job-token"}}
	}
	owner := run("entry", "12", "")
	fb := &fakeBranch{}
	m.branches.putNamed(owner.pointKey("build", SnapshotEnd), fb, "job 1 (build)", 200*time.Millisecond)
	if sp := run("entry", "12", "build:end").restorePoint(t.Context(), brancherExec{}); sp == nil || sp.branch != fb || sp.point != SnapshotEnd {
		t.Fatalf("a job of the pipeline: %+v", sp)
	}
	for name, r := range map[string]*jobRun{
		"another pipeline": run("entry", "13", "build:end"),
		"another entry":    run("other", "12", "build:end"),
		"another point":    run("entry", "12", "build:get_sources"),
		"another job":      run("entry", "12", "test:end"),
	} {
		if sp := r.restorePoint(t.Context(), brancherExec{}); sp != nil {
			t.Errorf("%s found the point", name)
		}
		if !strings.Contains(r.tr.String(), "on this runner or in the coordinator") || !strings.Contains(r.tr.String(), "running the job from the start") {
			t.Errorf("%s: no warning: %q", name, r.tr.String())
		}
	}
	if asked.Load() == 0 {
		t.Error("a point missing on this runner was not looked for in the coordinator")
	}
	for _, bad := range []string{"build", ":end", "build:after_script"} {
		r := run("entry", "12", bad)
		if sp := r.restorePoint(t.Context(), brancherExec{}); sp != nil || !strings.Contains(r.tr.String(), "WARNING") {
			t.Errorf("BERTH_RESTORE=%q: %+v, %q", bad, sp, r.tr.String())
		}
	}
	// A job whose executor cannot branch does not restore.
	if sp := run("entry", "12", "build:end").restorePoint(t.Context(), nil); sp != nil {
		t.Error("an executor that cannot branch restored a point")
	}
	// A point another runner took comes from the coordinator, in a
	// temporary file that done removes.
	sp := run("entry", "12", "elsewhere:end").restorePoint(t.Context(), brancherExec{})
	if sp == nil || sp.branch != nil || sp.bundle == nil {
		t.Fatalf("a point in the coordinator: %+v", sp)
	}
	if b, _ := io.ReadAll(sp.bundle); string(b) != "the bundle" {
		t.Errorf("the bundle read %q", b)
	}
	f := sp.bundle.(*os.File)
	sp.done()
	if _, err := os.Stat(f.Name()); !os.IsNotExist(err) {
		t.Errorf("the downloaded bundle is still there after done: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	if sp := run("entry", "12", "build:end").restorePoint(t.Context(), brancherExec{}); sp != nil || fb.dropped.Load() != 1 {
		t.Errorf("after its expiry: %+v, dropped %d times", sp, fb.dropped.Load())
	}
}

// FuzzPlanMatrix: whatever the coordinator's variables say, a plan's
// before_script fits the job's script.
func FuzzPlanMatrix(f *testing.F) {
	f.Add("true", "test", "A,B", "2", "3", "echo $A")
	f.Add("1", "", "GIT_DEPTH", "-1", "x", "${CI_JOB_TOKEN")
	f.Fuzz(func(t *testing.T, branch, group, names, lines, total, line string) {
		j := &runnerapi.JobResponse{Steps: []runnerapi.Step{{Name: "script", Script: []string{line, "make"}}}}
		for k, v := range map[string]string{runnerapi.MatrixBranchVariable: branch, runnerapi.MatrixGroupVariable: group,
			runnerapi.MatrixVariablesVariable: names, runnerapi.BeforeScriptLinesVariable: lines, "CI_NODE_TOTAL": total} {
			j.Variables = append(j.Variables, runnerapi.Variable{Key: k, Value: v})
		}
		p, why := planMatrix(j, "s", "img")
		if p != nil && (why != "" || p.lines < 0 || p.lines > 2 || p.total < 2) {
			t.Fatalf("plan %+v, why %q", p, why)
		}
	})
}
