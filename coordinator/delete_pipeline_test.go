package coordinator

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/runnerapi"
)

// TestDeletePipeline: DELETE /projects/:id/pipelines/:pipeline_id, as
// GitLab's (owners and instance admins): every object the pipeline's
// jobs stored — archives, VM snapshots, archived logs — is gone from the
// artifact storage, and the pipeline, its jobs and their logs from the
// store; another pipeline of the project is untouched. A running
// pipeline is canceled first: its pending jobs leave the queue at once,
// its runner's next update is refused and nothing of it is handed out.
func TestDeletePipeline(t *testing.T) {
	needGit(t)
	key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, Config{ExternalURL: ownURL, TraceArchiveAfter: 10 * time.Minute}, Options{SecretsKey: key})
	ctx := t.Context()
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	proj := e.createProject(t, "acme/app")
	const ci = "stages: [build, test]\nbuild:\n  stage: build\n  script: [make]\ntest:\n  stage: test\n  script: [make check]\n"

	// runPipeline pushes a commit and runs its two jobs, each logging,
	// uploading an archive and a VM snapshot; test fails.
	runPipeline := func(n int) (int64, []*runnerapi.JobResponse) {
		t.Helper()
		e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": ci, "n": fmt.Sprint(n)})
		var jobs []*runnerapi.JobResponse
		for _, state := range []string{"success", "failed"} {
			job := e.takeWait(tok)
			expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
			log := []byte(fmt.Sprintf("log of %s in pipeline %d\n", job.JobInfo.Name, n))
			expectCode(t, "trace", e.patch(job, fmt.Sprintf("0-%d", len(log)-1), log), http.StatusAccepted)
			expectCode(t, "snapshot", e.uploadSnapshot(job, snapshotQuery, snapshotBundle(4000, "in-memory;")), http.StatusCreated)
			expectCode(t, "archive", uploadArtifact(e, job, "?artifact_type=archive&artifact_format=zip", []byte("PK-zip")), http.StatusCreated)
			upd := runnerapi.UpdateJobRequest{State: state, Output: &runnerapi.Output{Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(log)), Bytesize: int64(len(log))}}
			if state == "failed" {
				upd.FailureReason, upd.ExitCode = "script_failure", 1
			}
			expectCode(t, "finish", e.update(job, upd), http.StatusOK)
			jobs = append(jobs, job)
		}
		return e.job(jobs[0].ID).PipelineID, jobs
	}
	gone, goneJobs := runPipeline(1)
	kept, keptJobs := runPipeline(2)
	// The logs are archived: objects in the storage too.
	e.clock.Advance(11 * time.Minute)
	if err := e.srv.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	var archives []string
	for _, j := range append(append([]*runnerapi.JobResponse{}, goneJobs...), keptJobs...) {
		ti, err := e.st.TraceInfo(ctx, j.ID)
		if err != nil || ti.ArchiveKey == "" {
			t.Fatalf("job %d's log not archived: %+v %v", j.ID, ti, err)
		}
		archives = append(archives, ti.ArchiveKey)
		if n := len(e.storedObjects(j.ID)); n != 3 {
			t.Fatalf("job %d has %d objects, want its archive, its snapshot and its log", j.ID, n)
		}
	}

	path := fmt.Sprintf("/api/v4/projects/%d/pipelines/%d", proj.ID, gone)
	e.newUser("mo", "read-only")
	maint := e.newUser("mt", "read-only")
	owner := e.newUser("ow", "read-only")
	p := &store.Project{ID: proj.ID, Path: "acme/app"}
	e.addMember(p, "mt", store.AccessMaintainer)
	e.addMember(p, "ow", store.AccessOwner)
	r := e.do("DELETE", path, nil, map[string]string{runnerapi.HeaderPrivateToken: maint})
	if r.code != http.StatusForbidden || !bytes.Contains(r.body, []byte("neither an admin nor an owner of project acme/app")) {
		t.Errorf("a maintainer's delete: %d %s, want 403 (owners only)", r.code, r.body)
	}
	expectCode(t, "another project's pipeline", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/pipelines/%d", proj.ID+100, gone), nil), http.StatusNotFound)
	expectCode(t, "the owner's delete", e.do("DELETE", path, nil, map[string]string{runnerapi.HeaderPrivateToken: owner}), http.StatusNoContent)
	expectCode(t, "again", e.adminDo("DELETE", path, nil), http.StatusNotFound)
	expectCode(t, "the pipeline", e.adminDo("GET", path, nil), http.StatusNotFound)

	for i, j := range goneJobs {
		if n := len(e.storedObjects(j.ID)); n != 0 {
			t.Errorf("deleted job %d: %d objects left in the storage", j.ID, n)
		}
		if _, err := e.objectBytes(archives[i]); err == nil {
			t.Errorf("deleted job %d: its archived log is still stored", j.ID)
		}
		if _, err := e.st.GetJob(ctx, j.ID); err == nil {
			t.Errorf("deleted job %d is still in the store", j.ID)
		}
		expectCode(t, "its snapshot", e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", j.ID), nil), http.StatusNotFound)
		if e.listsSnapshot(j.ID) {
			t.Errorf("deleted job %d's snapshot is still listed", j.ID)
		}
	}
	for i, j := range keptJobs {
		if n := len(e.storedObjects(j.ID)); n != 3 {
			t.Errorf("the other pipeline's job %d: %d objects, want 3", j.ID, n)
		}
		if _, err := e.objectBytes(archives[len(goneJobs)+i]); err != nil {
			t.Errorf("the other pipeline's job %d lost its archived log: %v", j.ID, err)
		}
	}
	expectCode(t, "the other pipeline", e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/pipelines/%d", proj.ID, kept), nil), http.StatusOK)

	// A running pipeline: canceled, then deleted.
	e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": "a:\n  script: [x]\nb:\n  script: [y]\n"})
	running := e.takeWait(tok)
	expectCode(t, "ack", e.update(running, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	pid := e.job(running.ID).PipelineID
	var pending int64
	if js, err := e.st.ListJobs(ctx, store.JobFilter{PipelineID: pid, Statuses: []store.Status{store.StatusPending}}); err != nil || len(js) != 1 || !e.srv.Queue().Has(js[0].ID) {
		t.Fatalf("the running pipeline's other job: %v %v, want one queued", js, err)
	} else {
		pending = js[0].ID
	}
	expectCode(t, "delete a running pipeline", e.adminDo("DELETE", fmt.Sprintf("/api/v4/projects/%d/pipelines/%d", proj.ID, pid), nil), http.StatusNoContent)
	// Canceled first: its queued job left the queue with it.
	if e.srv.Queue().Has(pending) {
		t.Errorf("the deleted pipeline's pending job %d is still queued", pending)
	}
	if r := e.update(running, runnerapi.UpdateJobRequest{State: "success"}); r.code < 400 {
		t.Errorf("the deleted pipeline's runner updated its job: %d", r.code)
	}
	if r, job := e.request(tok, "", ""); job != nil {
		t.Errorf("a deleted pipeline's pending job was handed out: %d %+v", r.code, job.JobInfo)
	}
}
