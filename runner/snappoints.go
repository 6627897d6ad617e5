package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/network"
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

// jobVar is job's last value of key, trimmed, and whether it has one.
func jobVar(job *runnerapi.JobResponse, key string) (string, bool) {
	v, ok := lookupVariable(job.Variables, key)
	return strings.TrimSpace(v), ok
}

// lastVar is the job's last value of key.
func (r *jobRun) lastVar(key string) (string, bool) { return jobVar(r.job, key) }

// beforeScriptLines is how many of job's script step's first lines are
// before_script, as Berth's coordinator says (-1: not said, or not
// fitting the step).
func beforeScriptLines(job *runnerapi.JobResponse) int {
	v, ok := jobVar(job, runnerapi.BeforeScriptLinesVariable)
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return -1
	}
	for _, st := range job.Steps {
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
// job asked for it: a branch point of this runner's daemon (for its later
// jobs of the pipeline: fast), and a bundle uploaded to the coordinator
// (for the fleet's other runners). A failure of either is a warning.
func (r *jobRun) takePoint(ex executor.Executor, p string, vars []runnerapi.Variable) {
	if !r.wantsPoint(p) {
		return
	}
	name := r.job.JobInfo.Name + ":" + p
	_ = r.section("snapshot_"+p, fmt.Sprintf("Saving snapshot point %s", name), func() error {
		sn, canSave := ex.(executor.Snapshotter)
		if !r.canBranch(ex) && !canSave {
			r.tr.Printf("%sWARNING: no snapshot point: the %q executor cannot save its environment (microvm can)%s\n", ansiBoldYellow, r.w.rc.Executor, ansiReset)
			return nil
		}
		ctx, cancel := context.WithTimeout(r.abortCtx, branchTimeout)
		defer cancel()
		began := time.Now()
		if r.canBranch(ex) { // else saved for the fleet only (a VM on a daemon elsewhere)
			if b, err := ex.(executor.Brancher).Branch(ctx); err != nil {
				r.tr.Printf("%sWARNING: no branch point on this runner: %v%s\n", ansiBoldYellow, err, ansiReset)
				r.log.Warn("snapshot point", "point", p, "err", err)
			} else {
				ttl := r.pointTTL()
				r.m.branches.putNamed(r.pointKey(r.job.JobInfo.Name, p), b, fmt.Sprintf("job %d (%s)", r.job.ID, r.job.JobInfo.Name), ttl)
				r.tr.Printf("Branch point saved in %s, kept %s on this runner\n", time.Since(began).Round(100*time.Millisecond), ttl)
			}
		}
		if !canSave {
			return nil
		}
		uctx, cancelUpload := context.WithTimeout(r.abortCtx, snapshotTimeout)
		defer cancelUpload()
		size, took, err := r.snapshot(uctx, sn, vars, p)
		if err != nil {
			r.tr.Printf("%sWARNING: the snapshot point is not in the coordinator (other runners cannot start from it): %v%s\n", ansiBoldYellow, err, ansiReset)
			r.log.Warn("uploading a snapshot point", "point", p, "err", err)
			return nil
		}
		r.tr.Printf("Snapshot (%s) uploaded in %s for the fleet's other runners\n", humanBytes(size), took.Round(100*time.Millisecond))
		r.tr.Printf("Later jobs of the pipeline start from it with %s: %q\n", RestoreVariable, name)
		return nil
	})
}

// restorePoint is the snapshot point the job asked to start from: this
// runner's branch point, else the bundle the coordinator keeps (downloaded
// to a temporary file, which release removes); nil (with a warning) when
// it cannot.
func (r *jobRun) restorePoint(ctx context.Context, ex executor.Executor) *startPoint {
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
	lines := beforeScriptLines(r.job)
	if point == SnapshotBeforeScript && lines < 0 {
		return warn("the coordinator does not say where before_script ends (Berth's does)")
	}
	if !r.canBranch(ex) {
		return warn("the %q executor cannot start from a snapshot point (microvm can)", r.w.rc.Executor)
	}
	sp := &startPoint{point: point, lines: lines, done: func() {}}
	if np := r.m.branches.getNamed(r.pointKey(job, point)); np != nil {
		sp.branch = np.branch
		sp.header = fmt.Sprintf("Started from snapshot point %s of %s", want, np.origin)
		sp.intro = pointIntro[point] + " ran in " + np.origin + "; this job goes on from there.\n"
		return sp
	}
	// Another runner of the fleet took it, or this one lost it.
	began := time.Now()
	f, size, err := r.fetchPoint(ctx, job, point)
	var se *network.StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusNotFound:
		return warn("no snapshot point %q of this pipeline, on this runner or in the coordinator (not taken, failed, or expired)", want)
	case err != nil:
		return warn("fetching snapshot point %q from the coordinator: %v", want, err)
	}
	sp.bundle, sp.done = f, func() { f.Close(); os.Remove(f.Name()) }
	sp.header = fmt.Sprintf("Started from snapshot point %s, fetched from the coordinator (%s in %s)", want, humanBytes(size), time.Since(began).Round(100*time.Millisecond))
	sp.intro = pointIntro[point] + " ran in job " + job + " on another runner; this job goes on from there.\n"
	return sp
}

// fetchPoint downloads the bundle of job's point to a temporary file,
// open at its start.
func (r *jobRun) fetchPoint(ctx context.Context, job, point string) (*os.File, int64, error) {
	body, err := r.m.client.DownloadPipelineSnapshot(ctx, r.jc, job, point)
	if err != nil {
		return nil, 0, err
	}
	defer body.Close()
	f, err := os.CreateTemp("", "berth-point-*.tar.zst")
	if err != nil {
		return nil, 0, err
	}
	n, err := io.Copy(f, body)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	return f, n, nil
}
