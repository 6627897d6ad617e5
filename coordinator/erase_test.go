package coordinator

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/runnerapi"
)

// jobWithData runs a job of project projectID that logs log, uploads a
// VM snapshot and an archive, and, when finish is set, fails.
func (e *env) jobWithData(tok, name string, projectID int64, log []byte, finish bool) *runnerapi.JobResponse {
	e.t.Helper()
	job := e.runningJob(tok, name, projectID)
	expectCode(e.t, "trace of "+name, e.patch(job, fmt.Sprintf("0-%d", len(log)-1), log), http.StatusAccepted)
	expectCode(e.t, "snapshot of "+name, e.uploadSnapshot(job, snapshotQuery, snapshotBundle(5000, "MASKED-hunter2;")), http.StatusCreated)
	expectCode(e.t, "archive of "+name, uploadArtifact(e, job, "?artifact_type=archive&artifact_format=zip", []byte("PK-zip")), http.StatusCreated)
	if finish {
		sum := fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(log))
		expectCode(e.t, "fail "+name, e.update(job, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1,
			Output: &runnerapi.Output{Checksum: sum, Bytesize: int64(len(log))}}), http.StatusOK)
	}
	return job
}

// listsSnapshot reports whether GET /api/v4/snapshots lists job id's.
func (e *env) listsSnapshot(id int64) bool {
	e.t.Helper()
	list, err := client.New(e.http.URL, e.admin).Snapshots(e.t.Context(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.Contains(snapshotJobs(list), id)
}

// TestEraseJob: POST /projects/:id/jobs/:job_id/erase, as GitLab's:
// refused (403 "Job is not erasable!") while the job runs; for a finished
// job it deletes every artifact, the VM snapshot included, from the
// storage and the store, and the log, and answers 201 with the job,
// erased_at set; a second erase is refused. Only the admin token may,
// and only for a job of the project named.
func TestEraseJob(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	ctx := t.Context()
	c := client.New(e.http.URL, e.admin)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	web, api := e.project("acme/web"), e.project("acme/api")
	log := []byte("Running with berth\nDB_PASSWORD=hunter2\nERROR: Job failed\n")
	job := e.jobWithData(tok, "test", web.ID, log, false)
	erase := fmt.Sprintf("/api/v4/projects/%d/jobs/%d/erase", web.ID, job.ID)

	r := e.adminDo("POST", erase, nil)
	if r.code != http.StatusForbidden || !strings.Contains(string(r.body), `"403 Forbidden - Job is not erasable!"`) {
		t.Errorf("erase of a running job: %d %s, want 403 Job is not erasable!", r.code, r.body)
	}
	expectCode(t, "fail", e.update(job, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1,
		Output: &runnerapi.Output{Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(log)), Bytesize: int64(len(log))}}), http.StatusOK)

	readOnly := e.newUser("viewer", "read-only")
	for _, tt := range []struct {
		name, path string
		header     map[string]string
		code       int
	}{
		{"no token", erase, nil, http.StatusUnauthorized},
		{"a read-only user's token", erase, map[string]string{runnerapi.HeaderPrivateToken: readOnly}, http.StatusForbidden},
		{"the job's token", erase, map[string]string{runnerapi.HeaderPrivateToken: job.Token}, http.StatusForbidden},
		{"another project's job", fmt.Sprintf("/api/v4/projects/%d/jobs/%d/erase", api.ID, job.ID), map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
		{"an unknown project", fmt.Sprintf("/api/v4/projects/acme%%2Fnope/jobs/%d/erase", job.ID), map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
		{"an unknown job", fmt.Sprintf("/api/v4/projects/%d/jobs/999999/erase", web.ID), map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
	} {
		if r := e.do("POST", tt.path, nil, tt.header); r.code != tt.code {
			t.Errorf("erase with %s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
		}
	}
	if n := len(e.storedObjects(job.ID)); n != 2 || !e.listsSnapshot(job.ID) || e.trace(t, job.ID) != string(log) {
		t.Fatalf("a refused erase erased: %d objects stored, want the snapshot and the archive", n)
	}

	e.clock.Advance(time.Minute)
	jj, err := c.EraseJob(ctx, web.ID, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := e.clock.Now().UTC().Format(time.RFC3339Nano)
	if jj.ID != job.ID || jj.Status != "failed" || len(jj.Artifacts) != 0 || jj.ErasedAt == nil || !sameInstant(*jj.ErasedAt, want) {
		t.Errorf("erase answered job %d %s, artifacts %+v, erased_at %s; want job %d failed, no artifacts, erased at %s",
			jj.ID, jj.Status, jj.Artifacts, deref(jj.ErasedAt), job.ID, want)
	}
	if objects := e.storedObjects(job.ID); len(objects) != 0 {
		t.Errorf("after the erase, %d objects are still stored for the job", len(objects))
	}
	if arts, err := e.st.ListArtifacts(ctx, job.ID); err != nil || len(arts) != 0 {
		t.Errorf("after the erase, the store records artifacts %v (%v)", arts, err)
	}
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", job.ID), nil)
	if r.code != http.StatusNotFound || bytes.Contains(r.body, []byte("hunter2")) {
		t.Errorf("snapshot download after the erase: %d", r.code)
	}
	if e.listsSnapshot(job.ID) {
		t.Error("GET /api/v4/snapshots still lists the erased job's snapshot")
	}
	if r := e.getTrace(web.ID, job.ID, ""); r.code != http.StatusOK || len(r.body) != 0 {
		t.Errorf("trace after the erase: %d %q, want 200 and empty", r.code, r.body)
	}

	// GET job tells it too; a second erase finds nothing to erase.
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/jobs/%d", web.ID, job.ID), nil)
	var raw map[string]any
	r.json(t, &raw)
	if got, _ := raw["erased_at"].(string); !sameInstant(got, want) {
		t.Errorf("GET job: erased_at %v, want %s", raw["erased_at"], want)
	}
	if _, err := c.EraseJob(ctx, web.ID, job.ID); err == nil || !strings.Contains(err.Error(), "403: 403 Forbidden - Job is not erasable!") {
		t.Errorf("second erase: %v, want 403 Job is not erasable!", err)
	}
	// A job never erased shows erased_at null, as GitLab.
	other := e.runningJob(tok, "other", web.ID)
	r = e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/jobs/%d", web.ID, other.ID), nil)
	if !bytes.Contains(r.body, []byte(`"erased_at":null`)) {
		t.Errorf("a job not erased: %s, want erased_at null", r.body)
	}
}

// TestEraseJobArchivedLog: the log of a job erased after the reaper
// archived it goes from the artifact storage too.
func TestEraseJobArchivedLog(t *testing.T) {
	e := newSnapshotEnv(t, Config{TraceArchiveAfter: time.Minute})
	ctx := t.Context()
	web := e.project("acme/web")
	log := bytes.Repeat([]byte("a line of a long log\n"), 300)
	job := e.jobWithData(e.createRunner(restapi.CreateRunnerRequest{}), "test", web.ID, log, true)
	e.clock.Advance(2 * time.Minute)
	if err := e.srv.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if ti, err := e.st.TraceInfo(ctx, job.ID); err != nil || ti.ArchiveKey == "" {
		t.Fatalf("the log was not archived: %+v %v", ti, err)
	}
	if n := len(e.storedObjects(job.ID)); n != 3 {
		t.Fatalf("%d objects stored, want the snapshot, the archive and the log", n)
	}
	if _, err := client.New(e.http.URL, e.admin).EraseJob(ctx, web.ID, job.ID); err != nil {
		t.Fatal(err)
	}
	if objects := e.storedObjects(job.ID); len(objects) != 0 {
		t.Errorf("after the erase, objects %v are still stored", keys(objects))
	}
	if ti, err := e.st.TraceInfo(ctx, job.ID); err != nil || ti.Size != 0 || ti.ArchiveKey != "" {
		t.Errorf("after the erase, the log is %+v (%v), want none", ti, err)
	}
	if r := e.getTrace(web.ID, job.ID, ""); r.code != http.StatusOK || len(r.body) != 0 {
		t.Errorf("trace after the erase: %d, %d bytes, want 200 and empty", r.code, len(r.body))
	}
}

// TestDeleteJobArtifacts: DELETE /projects/:id/jobs/:job_id/artifacts,
// as GitLab's: 204, whatever the job's status; every artifact goes, the
// VM snapshot included, from the storage and the store; the log stays.
// Only the admin token may, and only for a job of the project named.
func TestDeleteJobArtifacts(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	ctx := t.Context()
	c := client.New(e.http.URL, e.admin)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	web, api := e.project("acme/web"), e.project("acme/api")
	log := []byte("Running with berth\n")
	running := e.jobWithData(tok, "running", web.ID, log, false)
	path := fmt.Sprintf("/api/v4/projects/%d/jobs/%d/artifacts", web.ID, running.ID)

	readOnly := e.newUser("viewer", "read-only")
	for _, tt := range []struct {
		name, path string
		header     map[string]string
		code       int
	}{
		{"no token", path, nil, http.StatusUnauthorized},
		{"a read-only user's token", path, map[string]string{runnerapi.HeaderPrivateToken: readOnly}, http.StatusForbidden},
		{"the job's token", path, map[string]string{runnerapi.HeaderJobToken: running.Token}, http.StatusUnauthorized},
		{"another project's job", fmt.Sprintf("/api/v4/projects/%d/jobs/%d/artifacts", api.ID, running.ID), map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
		{"an unknown job", fmt.Sprintf("/api/v4/projects/%d/jobs/999999/artifacts", web.ID), map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
	} {
		if r := e.do("DELETE", tt.path, nil, tt.header); r.code != tt.code {
			t.Errorf("delete with %s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
		}
	}
	if n := len(e.storedObjects(running.ID)); n != 2 || !e.listsSnapshot(running.ID) {
		t.Fatalf("a refused delete deleted: %d objects stored, want the snapshot and the archive", n)
	}

	r := e.adminDo("DELETE", path, nil)
	if r.code != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("delete: %d %q, want 204 without a body", r.code, r.body)
	}
	if objects := e.storedObjects(running.ID); len(objects) != 0 {
		t.Errorf("after the delete, objects %v are still stored", keys(objects))
	}
	if arts, err := e.st.ListArtifacts(ctx, running.ID); err != nil || len(arts) != 0 {
		t.Errorf("after the delete, the store records artifacts %v (%v)", arts, err)
	}
	expectCode(t, "snapshot after the delete", e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", running.ID), nil), http.StatusNotFound)
	if e.listsSnapshot(running.ID) {
		t.Error("GET /api/v4/snapshots still lists the deleted snapshot")
	}
	if got := e.trace(t, running.ID); got != string(log) {
		t.Errorf("the log after deleting the artifacts: %q, want it kept", got)
	}
	jj, err := c.Job(ctx, web.ID, running.ID)
	if err != nil || len(jj.Artifacts) != 0 || jj.ErasedAt != nil || jj.Status != "running" {
		t.Errorf("job after the delete: %+v (%v), want running, no artifacts, not erased", jj, err)
	}
	// Nothing left: still 204, as GitLab.
	if err := c.DeleteJobArtifacts(ctx, web.ID, running.ID); err != nil {
		t.Errorf("a second delete: %v", err)
	}

	// A finished job's, through the client; its log left, it may still
	// be erased.
	finished := e.jobWithData(tok, "finished", web.ID, log, true)
	if err := c.DeleteJobArtifacts(ctx, web.ID, finished.ID); err != nil {
		t.Fatal(err)
	}
	if objects := e.storedObjects(finished.ID); len(objects) != 0 {
		t.Errorf("after the delete, objects %v are still stored", keys(objects))
	}
	if _, err := c.EraseJob(ctx, web.ID, finished.ID); err != nil {
		t.Errorf("erasing a job with a log and no artifacts: %v", err)
	}
	if got := e.trace(t, finished.ID); got != "" {
		t.Errorf("the log after the erase: %q", got)
	}
}

func sameInstant(a, b string) bool {
	ta, err1 := time.Parse(time.RFC3339Nano, a)
	tb, err2 := time.Parse(time.RFC3339Nano, b)
	return err1 == nil && err2 == nil && ta.Equal(tb)
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
