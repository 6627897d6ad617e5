package local

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berthci/berth/coordinator/client"
)

// keptSnapshots bounds the snapshot files SnapshotDir keeps (each holds a
// VM's memory and disk: tens to hundreds of MiB).
const keptSnapshots = 5

// saveSnapshots copies the snapshots the run's failed jobs left out of the
// embedded coordinator (it goes with the run) into dir, and names each in
// its job's result. A snapshot that cannot be saved is a warning.
func saveSnapshots(ctx context.Context, c *client.Client, projectID int64, dir string, res *Result, warn io.Writer) {
	snaps, err := c.Snapshots(ctx, projectID)
	if err != nil {
		fmt.Fprintf(warn, "berth run: listing the failed jobs' VM snapshots: %v\n", err)
		return
	}
	if len(snaps) == 0 {
		return
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintf(warn, "berth run: %v\n", err)
		return
	}
	for _, s := range snaps {
		j := res.job(s.JobID)
		if j == nil {
			continue
		}
		path := filepath.Join(dir, fmt.Sprintf("job-%d-%d.tar.zst", res.PipelineID, s.JobID))
		if err := download(ctx, c, s.JobID, path); err != nil {
			fmt.Fprintf(warn, "berth run: saving the VM snapshot of job %s: %v\n", j.Name, err)
			continue
		}
		j.Snapshot = path
		fmt.Fprintf(warn, "berth run: job %s failed; its VM as it was: berth debug --bundle %s\n", j.Name, path)
	}
	prune(dir, keptSnapshots)
}

func download(ctx context.Context, c *client.Client, jobID int64, path string) error {
	f, err := os.OpenFile(path+".part", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = c.Snapshot(ctx, jobID, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(path+".part", path)
	}
	if err != nil {
		os.Remove(path + ".part")
	}
	return err
}

// prune removes all but the newest keep snapshot files of dir.
func prune(dir string, keep int) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type file struct {
		path string
		mod  int64
	}
	var files []file
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tar.zst") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			files = append(files, file{filepath.Join(dir, e.Name()), fi.ModTime().UnixNano()})
		}
	}
	slices.SortFunc(files, func(a, b file) int { return cmp.Compare(b.mod, a.mod) })
	for i, f := range files {
		if i >= keep {
			os.Remove(f.path)
		}
	}
}

// job returns the result of job id, in this pipeline or a downstream one.
func (r *Result) job(id int64) *JobResult {
	for i := range r.Jobs {
		if r.Jobs[i].ID == id {
			return &r.Jobs[i]
		}
		if d := r.Jobs[i].Downstream; d != nil {
			if j := d.job(id); j != nil {
				return j
			}
		}
	}
	return nil
}
