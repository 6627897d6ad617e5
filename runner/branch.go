package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// Branching a parallel:matrix (docs/snapshots.md). A matrix job that asks
// (BERTH_MATRIX_BRANCH: "true") and runs on an executor that can branch
// its environment (microvm) shares the matrix's common prefix — sources,
// cache, artifacts and before_script — with the matrix's other jobs that
// this runner takes: the first of them to arrive runs the prefix, its VM
// is then saved as a branch point and it runs its script; the others wait
// for the branch point instead of running the prefix, start from a copy
// of that VM and run only their script. before_script runs in a stage of
// its own with set -a; the variables it set or changed and its working
// directory carry over to the script (helper env-save, env-restore).
//
// Any doubt runs the job unbranched: a before_script that names a
// variable that differs between the matrix's jobs, a matrix variable
// that steers the runner, a prefix or branch that failed, a VM that
// could not start from the branch point.

const (
	// branchIdle drops a branch point not every job of its matrix used
	// (some ran on other runners, were canceled or not started).
	branchIdle = 15 * time.Minute
	// branchTimeout bounds making a branch point.
	branchTimeout = 10 * time.Minute
	// maxPrefixLog bounds the prefix's log shown in the other jobs'.
	maxPrefixLog = 1 << 20
)

// matrixPlan is a matrix job's share in its matrix's common prefix.
type matrixPlan struct {
	key   string // the branch point's, on this runner
	lines int    // before_script's lines at the head of the script step
	total int    // the matrix's jobs (CI_NODE_TOTAL)
}

// perJobVariables are the predefined variables whose values differ
// between the jobs of one matrix (besides the matrix's own).
var perJobVariables = regexp.MustCompile(`^(CI_JOB_.*|CI_BUILD_.*|CI_NODE_INDEX|CI_CONCURRENT_.*|CI_REGISTRY_PASSWORD|CI_DEPENDENCY_PROXY_PASSWORD)$`)

// runnerVariables steer the runner's own stages: a matrix that varies
// one of them has no common prefix.
var runnerVariables = regexp.MustCompile(`^(GIT_.*|CACHE_.*|ARTIFACT_.*|.*_ATTEMPTS|FF_.*|BERTH_.*|TRANSFER_METER_FREQUENCY)$`)

var varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// planMatrix is the job's plan, nil when the job did not ask or cannot
// share (why says why, for the job's log).
func planMatrix(job *runnerapi.JobResponse, short, image string) (plan *matrixPlan, why string) {
	last := func(key string) string { v, _ := jobVar(job, key); return v }
	if ok, _ := strconv.ParseBool(last(runnerapi.MatrixBranchVariable)); !ok {
		return nil, ""
	}
	group := last(runnerapi.MatrixGroupVariable)
	if group == "" {
		return nil, "not a parallel:matrix job of a Berth coordinator"
	}
	total, err := strconv.Atoi(last("CI_NODE_TOTAL"))
	if err != nil || total < 2 {
		return nil, "a matrix of one job"
	}
	lines := beforeScriptLines(job)
	if lines < 0 {
		return nil, runnerapi.BeforeScriptLinesVariable + " does not fit the job's script"
	}
	var script *runnerapi.Step
	for i := range job.Steps {
		if job.Steps[i].Name == "script" {
			script = &job.Steps[i]
		}
	}
	varying := map[string]bool{}
	for _, name := range strings.Split(last(runnerapi.MatrixVariablesVariable), ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if runnerVariables.MatchString(name) {
			return nil, fmt.Sprintf("the matrix varies %s, which changes how the runner prepares the job", name)
		}
		varying[name] = true
	}
	for _, l := range script.Script[:lines] {
		for _, m := range varRef.FindAllStringSubmatch(l, -1) {
			if varying[m[1]] || perJobVariables.MatchString(m[1]) {
				return nil, fmt.Sprintf("before_script uses $%s, which differs between the matrix's jobs", m[1])
			}
		}
	}
	h := sha256.New()
	fmt.Fprintf(h, "runner %s\npipeline %s\ngroup %s\ncommit %s\nimage %s\n", short, last("CI_PIPELINE_ID"), group, job.GitInfo.Sha, image)
	for _, l := range script.Script[:lines] {
		fmt.Fprintf(h, "line %q\n", l)
	}
	for _, c := range job.Cache {
		fmt.Fprintf(h, "cache %q %q\n", job.ExpandVariables(c.Key), c.Policy)
	}
	for _, d := range job.Dependencies {
		fmt.Fprintf(h, "dependency %d\n", d.ID)
	}
	return &matrixPlan{key: hex.EncodeToString(h.Sum(nil)), lines: lines, total: total}, ""
}

// branchRegistry holds a runner manager's matrix prefixes and named
// snapshot points, by key.
type branchRegistry struct {
	mu     sync.Mutex
	groups map[string]*branchGroup
	named  map[string]*namedPoint
}

// namedPoint is a snapshot point a job took (BERTH_SNAPSHOT) for later
// jobs of its pipeline (BERTH_RESTORE).
type namedPoint struct {
	branch executor.Branch
	origin string // the job that took it, for the log
	expiry *time.Timer
}

// putNamed keeps b under key for ttl, replacing (and dropping) the point
// an earlier attempt of the job took.
func (reg *branchRegistry) putNamed(key string, b executor.Branch, origin string, ttl time.Duration) {
	np := &namedPoint{branch: b, origin: origin}
	reg.mu.Lock()
	if reg.named == nil {
		reg.named = map[string]*namedPoint{}
	}
	old := reg.named[key]
	reg.named[key] = np
	np.expiry = time.AfterFunc(ttl, func() { reg.dropNamed(key, np) })
	reg.mu.Unlock()
	if old != nil {
		reg.dropNamed(key, old)
	}
}

// named is the point kept under key.
func (reg *branchRegistry) getNamed(key string) *namedPoint {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return reg.named[key]
}

// dropNamed removes np (VMs made from it run on).
func (reg *branchRegistry) dropNamed(key string, np *namedPoint) {
	reg.mu.Lock()
	if reg.named[key] == np {
		delete(reg.named, key)
	}
	np.expiry.Stop()
	reg.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = np.branch.Drop(ctx)
}

// branchGroup is one matrix prefix: run by its owner, then a branch
// point its other jobs start from.
type branchGroup struct {
	reg       *branchRegistry
	key       string
	owner     int64
	ownerName string
	total     int
	ready     chan struct{} // closed once branch is set, or the prefix failed
	// Set before ready closes.
	branch    executor.Branch // nil: no branch point, run unbranched
	prefixLog []byte
	took      time.Duration // the prefix, in the owner

	// Under reg.mu.
	released int // jobs that started from the branch point, or tried
	idle     *time.Timer
	dropped  bool
}

// join makes the job the owner of the plan's prefix, or one of its
// other jobs.
func (reg *branchRegistry) join(plan *matrixPlan, job *runnerapi.JobResponse) (g *branchGroup, owner bool) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.groups == nil {
		reg.groups = map[string]*branchGroup{}
	}
	if g := reg.groups[plan.key]; g != nil {
		return g, false
	}
	g = &branchGroup{reg: reg, key: plan.key, owner: job.ID, ownerName: job.JobInfo.Name, total: plan.total, ready: make(chan struct{})}
	reg.groups[plan.key] = g
	return g, true
}

// publish makes the branch point available (b nil: the prefix or the
// branch failed; the waiting jobs run unbranched).
func (g *branchGroup) publish(b executor.Branch, prefixLog []byte, took time.Duration) {
	g.reg.mu.Lock()
	select {
	case <-g.ready:
		g.reg.mu.Unlock()
		return
	default:
	}
	g.branch, g.prefixLog, g.took = b, prefixLog, took
	if b == nil {
		g.dropped = true
		if g.reg.groups[g.key] == g {
			delete(g.reg.groups, g.key)
		}
	} else {
		g.idle = time.AfterFunc(branchIdle, g.drop)
	}
	close(g.ready)
	g.reg.mu.Unlock()
}

// wait waits for the owner's branch point (nil: run unbranched).
func (g *branchGroup) wait(ctx context.Context) (executor.Branch, error) {
	select {
	case <-g.ready:
		return g.branch, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// release says one more of the matrix's jobs is done with the branch
// point; once all of them are, it goes.
func (g *branchGroup) release() {
	g.reg.mu.Lock()
	g.released++
	all := g.released >= g.total-1
	g.reg.mu.Unlock()
	if all {
		g.drop()
	}
}

// drop removes the branch point (VMs made from it run on).
func (g *branchGroup) drop() {
	g.reg.mu.Lock()
	if g.dropped {
		g.reg.mu.Unlock()
		return
	}
	g.dropped = true
	if g.reg.groups[g.key] == g {
		delete(g.reg.groups, g.key)
	}
	if g.idle != nil {
		g.idle.Stop()
	}
	b := g.branch
	g.reg.mu.Unlock()
	if b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = b.Drop(ctx)
	}
}

// matrixRun is a job's part in its matrix's prefix.
type matrixRun struct {
	plan  *matrixPlan
	g     *branchGroup
	owner bool
	// from is the branch point the job started from (not the owner's).
	from executor.Branch
	// logStart is where the owner's log of the prefix starts.
	logStart int64
	began    time.Time
}

// start is where a job of the matrix that is not its owner starts.
func (mr *matrixRun) start() *startPoint {
	g := mr.g
	return &startPoint{branch: mr.from, point: SnapshotBeforeScript, lines: mr.plan.lines, done: g.release,
		header: fmt.Sprintf("Started from the matrix's common prefix, run once by job %d (%s) in %s", g.owner, g.ownerName, g.took.Round(100*time.Millisecond)),
		intro:  fmt.Sprintf("Sources, cache, artifacts and before_script ran in job %d; its log of them:\n", g.owner),
		log:    g.prefixLog}
}

// startPoint is where a job that starts from a branch point picks up,
// instead of preparing its own environment.
type startPoint struct {
	// branch is this runner's branch point, or bundle the snapshot the
	// coordinator kept (another runner took it).
	branch executor.Branch
	bundle io.Reader
	// point is the snapshot point the branch point was taken at.
	point string
	// lines are the job's own before_script lines (point before_script:
	// they are not run; -1 unknown).
	lines int
	// done is called once the job's environment was made from it (or
	// failed to be).
	done func()
	// header, intro and log are the job's log section about it.
	header, intro string
	log           []byte
}

// skips says whether a job starting here skips its stage: what ran
// before the point.
func (sp *startPoint) skips(stage string) bool {
	if sp == nil {
		return false
	}
	switch stage {
	case executor.StageGetSources:
		return true
	case executor.StageRestoreCache, executor.StageDownloadArtifacts:
		return sp.point != SnapshotGetSources
	}
	return false
}

// Files of the shell state before_script leaves, in the job's temporary
// directory.
const (
	prefixStartState = "matrix-prefix-start.json"
	prefixEndState   = "matrix-prefix-end.json"
)

// prefixScript is the owner's before_script stage: the prefix's commands
// with set -a, between two saves of the shell's state.
func (s *scripts) prefixScript(st runnerapi.Step, lines int) string {
	var b strings.Builder
	s.prelude(&b, true)
	fmt.Fprintf(&b, "%s env-save %s\n", s.helper(), shq(path.Join(s.env.TmpDir, prefixStartState)))
	b.WriteString("set -a\n")
	userLines(&b, splitLines(s.rc.PreBuildScript))
	userLines(&b, st.Script[:lines])
	b.WriteString("set +a\n")
	fmt.Fprintf(&b, "%s env-save %s\n", s.helper(), shq(path.Join(s.env.TmpDir, prefixEndState)))
	return b.String()
}

// resumeScript is the script stage after the prefix: the job's own
// variables, then what before_script changed, then the script. A job
// started from the branch point points the checkout's remote at its own
// credentials (the owner's expire with its job).
func (s *scripts) resumeScript(st runnerapi.Step, lines int, branched bool) string {
	var b strings.Builder
	s.prelude(&b, true)
	if url := s.job.GitInfo.RepoURL; branched && url != "" && s.gitStrategy() != "none" {
		fmt.Fprintf(&b, "if [ -d .git ]; then git remote set-url origin %s 2>/dev/null || true; fi\n", shq(url))
	}
	fmt.Fprintf(&b, "__berth_prefix_state=$(%s env-restore %s %s)\n", s.helper(),
		shq(path.Join(s.env.TmpDir, prefixStartState)), shq(path.Join(s.env.TmpDir, prefixEndState)))
	b.WriteString("eval \"$__berth_prefix_state\"\nunset __berth_prefix_state\n")
	userLines(&b, st.Script[lines:])
	userLines(&b, splitLines(s.rc.PostBuildScript))
	return b.String()
}

// joinMatrix finds the job's part in its matrix's prefix, right after
// its executor was created: the owner goes on, the others wait for the
// branch point. nil: run unbranched.
func (r *jobRun) joinMatrix(ctx context.Context, plan *matrixPlan, ex executor.Executor) (*matrixRun, error) {
	if !r.canBranch(ex) {
		r.tr.Printf("%sWARNING: %s: not branching: the %q executor cannot branch its environment (microvm can)%s\n", ansiBoldYellow, runnerapi.MatrixBranchVariable, r.w.rc.Executor, ansiReset)
		return nil, nil
	}
	g, owner := r.m.branches.join(plan, r.job)
	mr := &matrixRun{plan: plan, g: g, owner: owner, began: time.Now()}
	if owner {
		r.tr.Printf("Running the matrix's common prefix (sources, cache, artifacts, before_script) for its %d jobs on this runner\n", plan.total)
		return mr, nil
	}
	r.tr.Printf("Waiting for job %d (%s), which runs the matrix's common prefix...\n", g.owner, g.ownerName)
	b, err := g.wait(ctx)
	if err != nil {
		g.release()
		return nil, err
	}
	if b == nil {
		g.release()
		r.tr.Printf("%sWARNING: job %d made no branch point; running the prefix here%s\n", ansiBoldYellow, g.owner, ansiReset)
		return nil, nil
	}
	mr.from = b
	return mr, nil
}

// branchPrefix, in the owner once before_script ran, saves its VM as the
// branch point and hands it to the matrix's other jobs. A failure is a
// warning: they run the prefix themselves.
func (r *jobRun) branchPrefix(mr *matrixRun, ex executor.Executor) {
	took := time.Since(mr.began)
	prefixLog := r.tr.From(mr.logStart, maxPrefixLog)
	_ = r.section("matrix_branch", "Branching the VM for the matrix's other jobs", func() error {
		ctx, cancel := context.WithTimeout(r.abortCtx, branchTimeout)
		defer cancel()
		began := time.Now()
		b, err := ex.(executor.Brancher).Branch(ctx)
		if err != nil {
			r.tr.Printf("%sWARNING: no branch point: %v; the matrix's other jobs run the prefix themselves%s\n", ansiBoldYellow, err, ansiReset)
			r.log.Warn("branching a matrix prefix", "err", err)
			mr.g.publish(nil, nil, 0)
			return nil
		}
		mr.g.publish(b, prefixLog, took)
		r.tr.Printf("Branch point saved in %s: the matrix's other jobs start from it\n", time.Since(began).Round(100*time.Millisecond))
		return nil
	})
}

// resumed is the log of a job that started from a branch point.
func (r *jobRun) resumed(sp *startPoint) error {
	return r.section("snapshot_restore", sp.header, func() error {
		r.tr.Printf("%s", sp.intro)
		if len(sp.log) > 0 {
			if _, err := r.tr.Write(sp.log); err != nil {
				return err
			}
			r.tr.Printf("\n")
		}
		return nil
	})
}
