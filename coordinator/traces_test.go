package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// finishWithLog runs a job through the runner API: its log is log, and it
// succeeds.
func (e *env) finishWithLog(tok string, log []byte) *runnerapi.JobResponse {
	e.t.Helper()
	job := e.take(tok)
	expectCode(e.t, "running", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(e.t, "trace", e.patch(job, fmt.Sprintf("0-%d", len(log)-1), log), http.StatusAccepted)
	sum := fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(log))
	expectCode(e.t, "success", e.update(job, runnerapi.UpdateJobRequest{State: "success",
		Output: &runnerapi.Output{Checksum: sum, Bytesize: int64(len(log))}}), http.StatusOK)
	return job
}

// getTrace reads a job's log through the REST API (rng: a Range header).
func (e *env) getTrace(projectID, jobID int64, rng string) resp {
	e.t.Helper()
	h := map[string]string{"PRIVATE-TOKEN": e.admin}
	if rng != "" {
		h["Range"] = rng
	}
	return e.do("GET", "/api/v4/projects/"+strconv.FormatInt(projectID, 10)+"/jobs/"+strconv.FormatInt(jobID, 10)+"/trace", nil, h)
}

func (e *env) objectBytes(key string) ([]byte, error) {
	rc, _, err := e.srv.artifacts.Open(context.Background(), key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// TestTraceArchive: a finished job's log moves to the artifact storage
// after TraceArchiveAfter, reads the same (whole and ranged), comes back
// into the store when the coordinator adds a line, and is archived again
// under a new key, the old object deleted.
func TestTraceArchive(t *testing.T) {
	e := newEnv(t, Config{TraceArchiveAfter: 10 * time.Minute})
	ctx := context.Background()
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("build"))
	e.enqueue(simpleSpec("running"))
	log := bytes.Repeat([]byte("line of the build log\n"), 500)
	job := e.finishWithLog(tok, log)
	other := e.take(tok)
	expectCode(t, "running", e.update(other, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "trace", e.patch(other, "0-5", []byte("start\n")), http.StatusAccepted)
	pid := e.job(job.ID).ProjectID

	reap := func() {
		t.Helper()
		if err := e.srv.Reap(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reap() // too early: nothing moves
	if ti, _ := e.st.TraceInfo(ctx, job.ID); ti.ArchiveKey != "" {
		t.Fatalf("archived right after finishing: %+v", ti)
	}
	e.clock.Advance(11 * time.Minute)
	reap()
	ti, err := e.st.TraceInfo(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.ArchiveKey == "" || ti.Size != int64(len(log)) {
		t.Fatalf("after the reaper: %+v, want archived, %d bytes", ti, len(log))
	}
	if got, err := e.objectBytes(ti.ArchiveKey); err != nil || !bytes.Equal(got, log) {
		t.Fatalf("archived object: %d bytes, %v; want the log", len(got), err)
	}
	if _, err := e.st.ReadTrace(ctx, job.ID, 0, io.Discard); !errors.Is(err, store.ErrTraceArchived) {
		t.Fatalf("the store still serves the log: %v", err)
	}
	if ti, _ := e.st.TraceInfo(ctx, other.ID); ti.ArchiveKey != "" {
		t.Error("a running job's log was archived")
	}

	// Reading is unchanged for API clients.
	r := e.getTrace(pid, job.ID, "")
	expectCode(t, "GET trace", r, http.StatusOK)
	if !bytes.Equal(r.body, log) {
		t.Errorf("GET trace of an archived log: %d bytes, want %d", len(r.body), len(log))
	}
	r = e.getTrace(pid, job.ID, "bytes=100-")
	expectCode(t, "GET trace ranged", r, http.StatusPartialContent)
	if !bytes.Equal(r.body, log[100:]) {
		t.Errorf("ranged GET of an archived log: %q…", r.body[:min(len(r.body), 40)])
	}
	if cr := r.header.Get("Content-Range"); cr != fmt.Sprintf("bytes 100-%d/%d", len(log)-1, len(log)) {
		t.Errorf("Content-Range = %q", cr)
	}
	var buf bytes.Buffer
	if _, err := e.srv.logs.Read(ctx, job.ID, int64(len(log)+1), &buf); !errors.As(err, new(*store.RangeError)) {
		t.Errorf("ReadTrace past the end: %v, want a RangeError", err)
	}

	// The runner cannot append to a finished job; the coordinator can
	// (a bridge's or a release's line): the log comes back, then goes
	// again under a new key.
	expectCode(t, "PATCH after the end", e.patch(job, fmt.Sprintf("%d-%d", len(log), len(log)+2), []byte("no\n")), http.StatusForbidden)
	oldKey := ti.ArchiveKey
	e.srv.logs.AddLine(ctx, job.ID, "a line added later\n")
	want := append(append([]byte(nil), log...), "a line added later\n"...)
	ti, _ = e.st.TraceInfo(ctx, job.ID)
	if ti.ArchiveKey != "" || ti.Size != int64(len(want)) || ti.CRC32 != crc32.ChecksumIEEE(want) {
		t.Fatalf("after a late line: %+v, want back in the store with %d bytes", ti, len(want))
	}
	if _, err := e.objectBytes(oldKey); !errors.Is(err, artifacts.ErrNotFound) {
		t.Errorf("the object of the log brought back: %v, want deleted", err)
	}
	buf.Reset()
	if _, err := e.srv.logs.Read(ctx, job.ID, 0, &buf); err != nil || !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("ReadTrace after a late line: %d bytes, %v", buf.Len(), err)
	}
	reap()
	ti, _ = e.st.TraceInfo(ctx, job.ID)
	if ti.ArchiveKey == "" || ti.ArchiveKey == oldKey {
		t.Fatalf("archived again under %q (old %q)", ti.ArchiveKey, oldKey)
	}
	if got, err := e.objectBytes(ti.ArchiveKey); err != nil || !bytes.Equal(got, want) {
		t.Errorf("archived again: %d bytes, %v", len(got), err)
	}
	if r := e.getTrace(pid, job.ID, ""); !bytes.Equal(r.body, want) {
		t.Errorf("GET trace after archiving again: %d bytes", len(r.body))
	}
}

// TestTraceArchiveOff: a negative TraceArchiveAfter keeps every log in the
// store.
func TestTraceArchiveOff(t *testing.T) {
	e := newEnv(t, Config{TraceArchiveAfter: -1})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.enqueue(simpleSpec("build"))
	job := e.finishWithLog(tok, []byte("hello\n"))
	e.clock.Advance(1000 * time.Hour)
	if err := e.srv.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ti, _ := e.st.TraceInfo(context.Background(), job.ID); ti.ArchiveKey != "" {
		t.Errorf("archived with archiving off: %+v", ti)
	}
}
