package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/runnerapi"
)

// pointQuery uploads the bundle of snapshot point end, as a runner does.
const pointQuery = "?artifact_type=berth_snapshot_end&artifact_format=raw&expire_in=1+day"

// pipelineJob enqueues a job of pipeline pipelineID (of project 1) and
// hands it to the runner of tok, acknowledged.
func (e *env) pipelineJob(tok, name string, pipelineID int64) *runnerapi.JobResponse {
	e.t.Helper()
	spec := simpleSpec(name)
	spec.PipelineID = pipelineID
	return e.running(tok, spec)
}

// getPoint asks, as job (with its token unless header says), for the
// bundle of point that job name of its pipeline took.
func (e *env) getPoint(job *runnerapi.JobResponse, point, name string, header map[string]string) resp {
	e.t.Helper()
	if header == nil {
		header = map[string]string{runnerapi.HeaderJobToken: job.Token}
	}
	return e.do("GET", fmt.Sprintf("/api/v4/jobs/%d/berth_snapshots/%s?job=%s", job.ID, point, url.QueryEscape(name)), nil, header)
}

// message is the message of an error answer, "" for another body.
func message(r resp) string {
	var m struct{ Message string }
	_ = json.Unmarshal(r.body, &m)
	return m.Message
}

// TestSnapshotPointResumed: a job's snapshot point is stored encrypted,
// and a later job of the same pipeline gets the exact bundle back; no
// artifact path serves it and it is not the job's failed-job snapshot.
func TestSnapshotPointResumed(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	build := e.pipelineJob(tok, "build", 7)
	bundle := snapshotBundle(2*snapshots.ChunkSize+77, "MASKED-TOKEN-in-memory;")
	r := e.uploadSnapshot(build, pointQuery, bundle)
	expectCode(t, "upload", r, http.StatusCreated)
	if !strings.Contains(string(r.body), `"file_type":"berth_snapshot_end"`) {
		t.Errorf("upload answered %s", r.body)
	}
	objects := e.storedObjects(build.ID)
	if len(objects) != 1 {
		t.Fatalf("%d objects stored for the job, want 1", len(objects))
	}
	for name, b := range objects {
		if !strings.HasPrefix(name, "berth_snapshot_end-") || int64(len(b)) != snapshots.SealedSize(int64(len(bundle))) {
			t.Errorf("stored %s of %d bytes", name, len(b))
		}
		if bytes.Contains(b, []byte("MASKED-TOKEN")) {
			t.Error("the stored snapshot point holds the plaintext")
		}
	}

	test := e.pipelineJob(tok, "test", 7)
	r = e.getPoint(test, "end", "build", nil)
	if r.code != http.StatusOK || !bytes.Equal(r.body, bundle) {
		t.Fatalf("the later job's download: %d, %d bytes, equal %v; want the %d uploaded", r.code, len(r.body), bytes.Equal(r.body, bundle), len(bundle))
	}
	if r.header.Get("Content-Type") != "application/octet-stream" || r.header.Get("Content-Length") != fmt.Sprint(len(bundle)) {
		t.Errorf("the later job's download: headers %v", r.header)
	}

	// Not an artifact: GET /jobs/:id/artifacts serves it to nobody.
	path := fmt.Sprintf("/api/v4/jobs/%d/artifacts", build.ID)
	for _, tt := range []struct {
		name   string
		header map[string]string
		code   int
	}{
		{"its own job's token", map[string]string{runnerapi.HeaderJobToken: build.Token}, http.StatusNotFound},
		{"the later job's token", map[string]string{runnerapi.HeaderJobToken: test.Token}, http.StatusForbidden},
		{"the admin token", map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
	} {
		for _, q := range []string{"", "?artifact_type=berth_snapshot_end"} {
			r := e.do("GET", path+q, nil, tt.header)
			if r.code != tt.code || bytes.Contains(r.body, []byte("MASKED-TOKEN")) {
				t.Errorf("GET %s%s with %s: %d %.200s, want %d", path, q, tt.name, r.code, r.body, tt.code)
			}
		}
	}
	// Nor the failed-job snapshot the admins read.
	expectCode(t, "the admin's snapshot of the job", e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", build.ID), nil), http.StatusNotFound)
	var list []restapi.SnapshotJSON
	e.adminDo("GET", "/api/v4/snapshots", nil).json(t, &list)
	if len(list) != 0 {
		t.Errorf("the admins' list of failed jobs' snapshots holds %+v", list)
	}
}

// TestSnapshotPointRefused: only a running job of the same pipeline, with
// the runner's token, gets a snapshot point; every other ask is refused
// without a byte of it.
func TestSnapshotPointRefused(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	build := e.pipelineJob(tok, "build", 7)
	expectCode(t, "upload", e.uploadSnapshot(build, pointQuery, snapshotBundle(1000, "secret-in-memory;")), http.StatusCreated)
	test := e.pipelineJob(tok, "test", 7)
	otherPipeline := e.pipelineJob(tok, "test", 8) // same project, another pipeline
	noPipeline := e.runningJob(tok, "test", 1)
	for _, tt := range []struct {
		name        string
		job         *runnerapi.JobResponse
		point, from string
		header      map[string]string
		code        int
		says        string
	}{
		{"a job of another pipeline", otherPipeline, "end", "build", nil, http.StatusNotFound, `no other job named "build"`},
		{"a job of no pipeline", noPipeline, "end", "build", nil, http.StatusNotFound, "of no pipeline"},
		{"a point not taken", test, "before_script", "build", nil, http.StatusNotFound, `job "build" of this pipeline has no before_script snapshot`},
		{"a job not in the pipeline", test, "end", "deploy", nil, http.StatusNotFound, `no other job named "deploy"`},
		{"the asking job itself", build, "end", "build", nil, http.StatusNotFound, `no other job named "build"`},
		{"an unknown point", test, "after_script", "build", nil, http.StatusBadRequest, `snapshot point "after_script" is not one of get_sources, before_script, end`},
		{"no job named", test, "end", "", nil, http.StatusBadRequest, "job parameter"},
		{"no token", test, "end", "build", map[string]string{}, http.StatusUnauthorized, ""},
		{"a made-up token", test, "end", "build", map[string]string{runnerapi.HeaderJobToken: "nope"}, http.StatusForbidden, ""},
		{"another job's token", test, "end", "build", map[string]string{runnerapi.HeaderJobToken: otherPipeline.Token}, http.StatusForbidden, ""},
		{"the script's token", test, "end", "build", map[string]string{runnerapi.HeaderJobToken: scriptToken(t, test)}, http.StatusForbidden, "does not allow job"},
		{"the admin token", test, "end", "build", map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusUnauthorized, ""},
	} {
		r := e.getPoint(tt.job, tt.point, tt.from, tt.header)
		if r.code != tt.code || !strings.Contains(message(r), tt.says) || bytes.Contains(r.body, []byte("secret-in-memory")) {
			t.Errorf("%s: %d %.200s, want %d saying %q", tt.name, r.code, r.body, tt.code, tt.says)
		}
	}

	// Once the asking job ended, its token reads nothing.
	expectCode(t, "finish", e.update(test, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	r := e.getPoint(test, "end", "build", nil)
	if r.code != http.StatusForbidden || !strings.Contains(string(r.body), "not running") || bytes.Contains(r.body, []byte("secret-in-memory")) {
		t.Errorf("a finished job's ask: %d %.200s, want 403 saying it is not running", r.code, r.body)
	}
}

// TestSnapshotPointExpired: an expired snapshot point is not served,
// though the reaper has not run yet.
func TestSnapshotPointExpired(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	build := e.pipelineJob(tok, "build", 7)
	expectCode(t, "upload", e.uploadSnapshot(build, "?artifact_type=berth_snapshot_end&artifact_format=raw&expire_in=1+minute", snapshotBundle(100, "m")), http.StatusCreated)
	test := e.pipelineJob(tok, "test", 7)
	expectCode(t, "before expiry", e.getPoint(test, "end", "build", nil), http.StatusOK)
	e.clock.Advance(2 * time.Minute) // the job's token lives on
	r := e.getPoint(test, "end", "build", nil)
	if r.code != http.StatusNotFound || !strings.Contains(string(r.body), "expired") {
		t.Errorf("after expiry: %d %s, want 404 saying it may have expired", r.code, r.body)
	}
	if len(e.storedObjects(build.ID)) != 1 {
		t.Error("the expired snapshot's object went before the reaper ran")
	}
}

// TestSnapshotPointLatestAttempt: of several jobs of the name (retries),
// the latest that took the point serves it; a re-upload replaces a
// point's bundle and leaves the job's other snapshots.
func TestSnapshotPointLatestAttempt(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	first := e.pipelineJob(tok, "build", 7)
	expectCode(t, "first", e.uploadSnapshot(first, pointQuery, []byte("first attempt")), http.StatusCreated)
	retry := e.pipelineJob(tok, "build", 7)
	expectCode(t, "the retry's other point", e.uploadSnapshot(retry, "?artifact_type=berth_snapshot_get_sources&artifact_format=raw", []byte("sources")), http.StatusCreated)
	test := e.pipelineJob(tok, "test", 7)
	if r := e.getPoint(test, "end", "build", nil); r.code != http.StatusOK || string(r.body) != "first attempt" {
		t.Errorf("the retry without an end point: %d %q, want the first attempt's", r.code, r.body)
	}
	expectCode(t, "the retry's end", e.uploadSnapshot(retry, pointQuery, []byte("retry, once")), http.StatusCreated)
	expectCode(t, "the retry's end again", e.uploadSnapshot(retry, pointQuery, []byte("retry, twice")), http.StatusCreated)
	expectCode(t, "the retry's failed-job snapshot", e.uploadSnapshot(retry, snapshotQuery, []byte("failed")), http.StatusCreated)
	if r := e.getPoint(test, "end", "build", nil); r.code != http.StatusOK || string(r.body) != "retry, twice" {
		t.Errorf("the retry's end point: %d %q, want its second upload", r.code, r.body)
	}
	if r := e.getPoint(test, "get_sources", "build", nil); r.code != http.StatusOK || string(r.body) != "sources" {
		t.Errorf("the retry's get_sources point: %d %q", r.code, r.body)
	}
	if n := len(e.storedObjects(retry.ID)); n != 3 {
		t.Errorf("%d objects stored for the retry, want 3 (get_sources, end, the failed-job snapshot)", n)
	}
}

// TestSnapshotPointUploads: snapshot points are snapshots on upload (the
// snapshots' size limit, maximum age and key); a berth_snapshot_ type of
// no known point is refused, naming it.
func TestSnapshotPointUploads(t *testing.T) {
	e := newSnapshotEnv(t, Config{MaxArtifactSize: 100})
	job := e.pipelineJob(e.createRunner(restapi.CreateRunnerRequest{}), "build", 7)
	r := e.uploadSnapshot(job, "?artifact_type=berth_snapshot_foo&artifact_format=raw", []byte("memory"))
	if r.code != http.StatusBadRequest || !strings.Contains(message(r), `"berth_snapshot_foo" is not a snapshot type`) {
		t.Errorf("a berth_snapshot_foo upload: %d %s, want 400 naming the type", r.code, r.body)
	}
	if n := len(e.storedObjects(job.ID)); n != 0 {
		t.Errorf("a refused upload left %d objects", n)
	}
	// Past the artifacts' limit, within the snapshots'; no expire_in:
	// max_snapshot_age.
	expectCode(t, "a point past the artifacts' limit", e.uploadSnapshot(job, "?artifact_type=berth_snapshot_before_script&artifact_format=raw", snapshotBundle(1000, "m")), http.StatusCreated)
	arts, err := e.st.ListArtifacts(t.Context(), job.ID)
	if err != nil || len(arts) != 1 {
		t.Fatalf("artifacts %v (%v)", arts, err)
	}
	if want := e.clock.Now().UTC().Add(30 * 24 * time.Hour); !arts[0].ExpireAt.Equal(want) {
		t.Errorf("a point without expire_in expires at %v, want %v", arts[0].ExpireAt, want)
	}

	noKey := newEnv(t, Config{})
	job = noKey.pipelineJob(noKey.createRunner(restapi.CreateRunnerRequest{}), "build", 7)
	r = noKey.uploadSnapshot(job, pointQuery, []byte("memory"))
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "no secrets key") {
		t.Errorf("a point upload without a key: %d %s, want 400 saying why", r.code, r.body)
	}
}
