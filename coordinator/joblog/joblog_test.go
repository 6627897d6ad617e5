package joblog_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/joblog"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
)

type fixture struct {
	st   store.Store
	arts *artifacts.Dir
	logs *joblog.Logs
	now  time.Time
}

func newFixture(t *testing.T, archiveAfter time.Duration) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	arts, err := artifacts.NewDir(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, arts: arts, now: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		logs: joblog.New(joblog.Options{Store: st, Artifacts: arts, ArchiveAfter: archiveAfter})}
}

// finishedJob stores a job that ran and finished at f.now with log.
func (f *fixture) finishedJob(t *testing.T, log string) int64 {
	t.Helper()
	ctx := context.Background()
	j := &store.Job{Status: store.StatusPending, ProjectID: 1, Name: "j", Stage: "test", CreatedAt: f.now, UpdatedAt: f.now}
	if err := f.st.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := f.logs.Append(ctx, j.ID, 0, []byte(log)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending},
		store.JobUpdate{Status: store.StatusSuccess, StartedAt: f.now, FinishedAt: f.now, UpdatedAt: f.now}); err != nil {
		t.Fatal(err)
	}
	return j.ID
}

func (f *fixture) read(t *testing.T, id, offset int64) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := f.logs.Read(context.Background(), id, offset, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestArchiveAndBack: a finished job's log moves to the artifact storage
// once ArchiveAfter has passed, reads follow it there (from any offset),
// and a line the coordinator adds later brings it back into the store.
func TestArchiveAndBack(t *testing.T) {
	f := newFixture(t, time.Minute)
	ctx := context.Background()
	id := f.finishedJob(t, "hello\nworld\n")
	if err := f.logs.Archive(ctx, f.now.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ti, _ := f.st.TraceInfo(ctx, id); ti.ArchiveKey != "" {
		t.Fatal("archived before ArchiveAfter")
	}
	if err := f.logs.Archive(ctx, f.now.Add(time.Minute+time.Second)); err != nil {
		t.Fatal(err)
	}
	ti, err := f.st.TraceInfo(ctx, id)
	if err != nil || ti.ArchiveKey == "" || ti.Size != 12 {
		t.Fatalf("after archiving: %+v %v", ti, err)
	}
	if rc, size, err := f.arts.Open(ctx, ti.ArchiveKey); err != nil || size != 12 {
		t.Fatalf("archived object: %d %v", size, err)
	} else {
		rc.Close()
	}
	if got := f.read(t, id, 0); got != "hello\nworld\n" {
		t.Fatalf("read from the archive: %q", got)
	}
	if got := f.read(t, id, 6); got != "world\n" {
		t.Fatalf("read from offset 6: %q", got)
	}
	var rerr *store.RangeError
	if _, err := f.logs.Read(ctx, id, 13, &bytes.Buffer{}); !errors.As(err, &rerr) || rerr.Size != 12 {
		t.Fatalf("read past the end: %v", err)
	}

	f.logs.AddLine(ctx, id, "later\n")
	ti, _ = f.st.TraceInfo(ctx, id)
	if ti.ArchiveKey != "" || f.read(t, id, 0) != "hello\nworld\nlater\n" {
		t.Fatalf("after a late line: %+v %q", ti, f.read(t, id, 0))
	}
	if _, _, err := f.arts.Open(ctx, "1/trace.12.log"); !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatalf("the old archive object is still there: %v", err)
	}
	// Archived again, under a key of its new size.
	if err := f.logs.Archive(ctx, f.now.Add(time.Minute+time.Second)); err != nil {
		t.Fatal(err)
	}
	if ti, _ = f.st.TraceInfo(ctx, id); ti.ArchiveKey == "" || ti.Size != 18 {
		t.Fatalf("archived again: %+v", ti)
	}
	if err := f.logs.Reset(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := f.read(t, id, 0); got != "" {
		t.Fatalf("after a reset: %q", got)
	}
}

// TestArchiveOff: a negative ArchiveAfter keeps every log in the store.
func TestArchiveOff(t *testing.T) {
	f := newFixture(t, -1)
	id := f.finishedJob(t, "x\n")
	if err := f.logs.Archive(context.Background(), f.now.Add(365*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ti, _ := f.st.TraceInfo(context.Background(), id); ti.ArchiveKey != "" {
		t.Fatal("archived with archiving off")
	}
}

// TestAppendChecksOffsets: an append must continue the log exactly.
func TestAppendChecksOffsets(t *testing.T) {
	f := newFixture(t, time.Minute)
	ctx := context.Background()
	id := f.finishedJob(t, "abc")
	var rerr *store.RangeError
	if _, err := f.logs.Append(ctx, id, 5, []byte("x")); !errors.As(err, &rerr) || rerr.Size != 3 {
		t.Fatalf("append past the end: %v", err)
	}
	if n, err := f.logs.Append(ctx, id, 3, []byte("d")); err != nil || n != 4 {
		t.Fatalf("append at the end: %d %v", n, err)
	}
}
