package runner

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// Named snapshot points (docs/snapshots.md). A job lists points in
// BERTH_SNAPSHOT; at each, the runner saves the job's VM as a branch
// point, kept on this runner for the job's pipeline. A later job of the
// pipeline that this runner takes names one in BERTH_RESTORE
// ("JOB:POINT") and starts from it instead of preparing its own
// environment: it skips the stages that ran before the point. Where the
// point is not here (another runner took the earlier job, it expired, the
// executor cannot branch), the job runs from the start, with a warning:
// restoring is a shortcut, never what makes a job correct.
const (
	// SnapshotGetSources is once the sources are checked out.
	SnapshotGetSources = "get_sources"
	// SnapshotBeforeScript is once before_script ran (cache and artifacts
	// restored): the script stage is then split in two, as for a branched
	// matrix.
	SnapshotBeforeScript = "before_script"
	// SnapshotEnd is once the script succeeded, before after_script.
	SnapshotEnd = "end"
	// RestoreVariable names the point a job starts from.
	RestoreVariable = "BERTH_RESTORE"
	// defaultPointTTL and maxPointTTL bound how long a point is kept
	// (BERTH_SNAPSHOT_EXPIRE_IN within them): each holds a VM's memory.
	defaultPointTTL = time.Hour
	maxPointTTL     = 24 * time.Hour
)

// pointIntro says what ran before a point.
var pointIntro = map[string]string{
	SnapshotGetSources:   "Sources",
	SnapshotBeforeScript: "Sources, cache, artifacts and before_script",
	SnapshotEnd:          "Sources, cache, artifacts and the script",
}

// wantsPoint says whether the job asked for snapshot point p.
func (r *jobRun) wantsPoint(p string) bool {
	points, _ := snapshotPoints(r.job)
	return slices.Contains(points, p)
}

// lastVar is the job's last value of key.
func (r *jobRun) lastVar(key string) (string, bool) {
	v, ok := "", false
	for _, x := range r.job.Variables {
		if x.Key == key {
			v, ok = x.Value, true
		}
	}
	return strings.TrimSpace(v), ok
}

// beforeScriptLines is how many of the script step's first lines are
// before_script, as Berth's coordinator says (-1: not said).
func (r *jobRun) beforeScriptLines() int {
	v, ok := r.lastVar(runnerapi.BeforeScriptLinesVariable)
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return -1
	}
	for _, st := range r.job.Steps {
		if st.Name == "script" && n <= len(st.Script) {
			return n
		}
	}
	return -1
}

// pointKey is the registry key of job's point on this runner.
func (r *jobRun) pointKey(job, point string) string {
	pipeline, _ := r.lastVar("CI_PIPELINE_ID")
	return strings.Join([]string{r.w.short, pipeline, job, point}, "\x00")
}

// pointTTL is how long the job's points are kept.
func (r *jobRun) pointTTL() time.Duration {
	v, ok := r.lastVar(SnapshotExpireVariable)
	if !ok || v == "" {
		return defaultPointTTL
	}
	d, err := ci.ParseDuration(v)
	if err != nil || d <= 0 {
		r.tr.Printf("%sWARNING: %s=%q is not a duration; keeping snapshot points %s%s\n", ansiBoldYellow, SnapshotExpireVariable, v, defaultPointTTL, ansiReset)
		return defaultPointTTL
	}
	return min(d, maxPointTTL)
}

// canBranch says whether ex can branch this job's environment.
func (r *jobRun) canBranch(ex executor.Executor) bool {
	_, ok := ex.(executor.Brancher)
	if d, decides := ex.(executor.BranchDecider); ok && decides {
		ok = d.CanBranch(r.job, jobIsolation(r.job))
	}
	return ok
}

// takePoint saves the job's environment as snapshot point p, when the
// job asked for it. A failure is a warning.
func (r *jobRun) takePoint(ex executor.Executor, p string) {
	if !r.wantsPoint(p) {
		return
	}
	name := r.job.JobInfo.Name + ":" + p
	_ = r.section("snapshot_"+p, fmt.Sprintf("Saving snapshot point %s", name), func() error {
		if !r.canBranch(ex) {
			r.tr.Printf("%sWARNING: no snapshot point: the %q executor cannot branch its environment (microvm can)%s\n", ansiBoldYellow, r.w.rc.Executor, ansiReset)
			return nil
		}
		ctx, cancel := context.WithTimeout(r.abortCtx, branchTimeout)
		defer cancel()
		began := time.Now()
		b, err := ex.(executor.Brancher).Branch(ctx)
		if err != nil {
			r.tr.Printf("%sWARNING: no snapshot point: %v%s\n", ansiBoldYellow, err, ansiReset)
			r.log.Warn("snapshot point", "point", p, "err", err)
			return nil
		}
		ttl := r.pointTTL()
		r.m.branches.putNamed(r.pointKey(r.job.JobInfo.Name, p), b, fmt.Sprintf("job %d (%s)", r.job.ID, r.job.JobInfo.Name), ttl)
		r.tr.Printf("Saved in %s, kept %s on this runner: later jobs of the pipeline it runs start from it with %s: %q\n",
			time.Since(began).Round(100*time.Millisecond), ttl, RestoreVariable, name)
		return nil
	})
}

// restorePoint is the snapshot point the job asked to start from, nil
// (with a warning) when it cannot.
func (r *jobRun) restorePoint(ex executor.Executor) *startPoint {
	want, ok := r.lastVar(RestoreVariable)
	if !ok || want == "" {
		return nil
	}
	warn := func(format string, args ...any) *startPoint {
		r.tr.Printf("%sWARNING: %s: %s; running the job from the start%s\n", ansiBoldYellow, RestoreVariable, fmt.Sprintf(format, args...), ansiReset)
		return nil
	}
	i := strings.LastIndex(want, ":")
	if i <= 0 {
		return warn("%q is not JOB:POINT", want)
	}
	job, point := strings.TrimSpace(want[:i]), strings.TrimSpace(want[i+1:])
	switch point {
	case SnapshotGetSources, SnapshotBeforeScript, SnapshotEnd:
	default:
		return warn("%q is not a point (%s, %s or %s)", point, SnapshotGetSources, SnapshotBeforeScript, SnapshotEnd)
	}
	lines := r.beforeScriptLines()
	if point == SnapshotBeforeScript && lines < 0 {
		return warn("the coordinator does not say where before_script ends (Berth's does)")
	}
	if !r.canBranch(ex) {
		return warn("the %q executor cannot start from a snapshot point (microvm can)", r.w.rc.Executor)
	}
	np := r.m.branches.getNamed(r.pointKey(job, point))
	if np == nil {
		return warn("no snapshot point %q of this pipeline on this runner (taken by another runner, expired, or not taken)", want)
	}
	return &startPoint{branch: np.branch, point: point, lines: lines, done: func() {},
		header: fmt.Sprintf("Started from snapshot point %s of %s", want, np.origin),
		intro:  pointIntro[point] + " ran in " + np.origin + "; this job goes on from there.\n"}
}
