package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// Snapshots of failed jobs (docs/snapshots.md). A job asks for one with
// the variable BERTH_SNAPSHOT listing the points to snapshot at (GitLab's
// parser takes any variable, so a pipeline that sets it runs unchanged on
// GitLab); a project asks for all its jobs with a project variable.
const (
	SnapshotVariable       = "BERTH_SNAPSHOT"
	SnapshotExpireVariable = "BERTH_SNAPSHOT_EXPIRE_IN"
	// SnapshotOnFailure is the point once the script failed, before
	// after_script.
	SnapshotOnFailure = "on_failure"
	// SnapshotArtifactType is the artifact type a snapshot is uploaded as.
	SnapshotArtifactType = "berth_snapshot"
	// defaultSnapshotExpireIn is how long the coordinator keeps one, and
	// defaultPointExpireIn a snapshot point's.
	defaultSnapshotExpireIn = "1 day"
	defaultPointExpireIn    = "1 hour"
	// snapshotTimeout bounds taking and uploading one.
	snapshotTimeout = 15 * time.Minute
)

// snapshotPoints are the points BERTH_SNAPSHOT lists (comma or space
// separated), and the words it has that are no point Berth knows.
func snapshotPoints(job *runnerapi.JobResponse) (points, unknown []string) {
	for _, v := range job.Variables {
		if v.Key != SnapshotVariable {
			continue
		}
		points, unknown = nil, nil // the last definition wins
		for _, w := range strings.FieldsFunc(v.Value, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			switch w {
			case SnapshotOnFailure, SnapshotGetSources, SnapshotBeforeScript, SnapshotEnd:
				points = append(points, w)
			default:
				unknown = append(unknown, w)
			}
		}
	}
	return points, unknown
}

// snapshotEnv are the variables a debugger's shell gets: the job's as its
// script saw them, without masked and file variables and without any
// value that has a masked value or the job token in it.
func snapshotEnv(vars []runnerapi.Variable, job *runnerapi.JobResponse) []string {
	secrets := []string{job.Token}
	for _, v := range append(slices.Clone(job.Variables), vars...) {
		if v.Masked && v.Value != "" {
			secrets = append(secrets, v.Value)
		}
	}
	var env []string
	for _, v := range vars {
		if v.Masked || v.File || v.Key == "" {
			continue
		}
		leaks := false
		for _, s := range secrets {
			if s != "" && strings.Contains(v.Value, s) {
				leaks = true
				break
			}
		}
		if !leaks {
			env = append(env, v.Key+"="+v.Value)
		}
	}
	return env
}

// snapshotOnFailure saves the failed job's environment and uploads it to
// the coordinator, when the job asked for it. Nothing it does changes the
// job's result: a snapshot that cannot be made is a warning in the log.
func (r *jobRun) snapshotOnFailure(ex executor.Executor, vars []runnerapi.Variable) {
	points, unknown := snapshotPoints(r.job)
	if len(unknown) > 0 {
		r.tr.Printf("%sWARNING: %s: %q are not snapshot points Berth knows (%s, %s, %s, %s); ignored%s\n", ansiBoldYellow, SnapshotVariable, unknown,
			SnapshotGetSources, SnapshotBeforeScript, SnapshotEnd, SnapshotOnFailure, ansiReset)
	}
	if !slices.Contains(points, SnapshotOnFailure) {
		return
	}
	_ = r.section("snapshot_on_failure", "Saving a snapshot of the failed job", func() error {
		sn, ok := ex.(executor.Snapshotter)
		if !ok {
			r.tr.Printf("%sWARNING: no snapshot: this executor cannot save its environment (the microvm executor can)%s\n", ansiBoldYellow, ansiReset)
			return nil
		}
		ctx, cancel := context.WithTimeout(r.abortCtx, snapshotTimeout)
		defer cancel()
		size, took, err := r.snapshot(ctx, sn, vars, SnapshotOnFailure)
		if err != nil {
			r.tr.Printf("%sWARNING: no snapshot: %v%s\n", ansiBoldYellow, err, ansiReset)
			r.log.Warn("snapshot on failure", "err", err)
			return nil
		}
		r.tr.Printf("Saved a snapshot of the job's VM (%s) in %s: `berth debug %d` restores it\n", humanBytes(size), took.Round(100*time.Millisecond), r.job.ID)
		return nil
	})
}

// snapshot writes the bundle of point to a temporary file and uploads it
// (on_failure as artifact type berth_snapshot, the other points as
// berth_snapshot_<point>).
func (r *jobRun) snapshot(ctx context.Context, sn executor.Snapshotter, vars []runnerapi.Variable, point string) (int64, time.Duration, error) {
	began := time.Now()
	f, err := os.CreateTemp("", "berth-snapshot-*.tar.zst")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(f.Name())
	bw := bufio.NewWriterSize(f, 1<<20)
	o := executor.SnapshotOptions{JobID: r.job.ID, JobName: r.job.JobInfo.Name, Project: r.projectPath(), Point: point,
		Env: snapshotEnv(vars, r.job)}
	err = sn.Snapshot(ctx, o, bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, executor.ErrNoSnapshots) {
			return 0, 0, err
		}
		return 0, 0, fmt.Errorf("saving it: %w", err)
	}
	fi, err := os.Stat(f.Name())
	if err != nil {
		return 0, 0, err
	}
	expire, typ := defaultSnapshotExpireIn, SnapshotArtifactType
	if point != SnapshotOnFailure {
		expire, typ = defaultPointExpireIn, SnapshotArtifactType+"_"+point
	}
	if v, _ := r.lastVar(SnapshotExpireVariable); v != "" {
		expire = v
	}
	open := func() (io.ReadCloser, error) { return os.Open(f.Name()) }
	if err := r.m.client.UploadArtifact(ctx, r.jc, open, network.ArtifactOptions{Name: point + ".tar.zst", Type: typ, Format: "raw", ExpireIn: expire}); err != nil {
		return 0, 0, fmt.Errorf("uploading it: %w", err)
	}
	return fi.Size(), time.Since(began), nil
}

// humanBytes is n in KiB, MiB or GiB.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
}
