package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/snapshots"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/runnerapi"
)

// snapshotQuery uploads a failed job's VM snapshot, as a runner does.
const snapshotQuery = "?artifact_type=berth_snapshot&artifact_format=raw&expire_in=1+day"

// newSnapshotEnv is an env whose coordinator has a secrets key, as
// embedded coordinators always do.
func newSnapshotEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	return newEnvWith(t, cfg, Options{SecretsKey: key})
}

// snapshotBundle is a bundle of n bytes holding a masked variable's
// value again and again, as a VM's memory would.
func snapshotBundle(n int, secret string) []byte {
	return bytes.Repeat([]byte(secret), n/len(secret)+1)[:n]
}

// uploadSnapshot uploads data as job's VM snapshot with the job's token.
func (e *env) uploadSnapshot(job *runnerapi.JobResponse, query string, data []byte) resp {
	e.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "snapshot.tar")
	_, _ = fw.Write(data)
	_ = mw.Close()
	return e.do("POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts%s", job.ID, query), buf.Bytes(),
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()})
}

// storedObjects reads the objects stored under a job's directory of the
// artifact storage, by name.
func (e *env) storedObjects(jobID int64) map[string][]byte {
	e.t.Helper()
	dir := filepath.Join(e.srv.artifacts.(interface{ Root() string }).Root(), fmt.Sprint(jobID))
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, de := range entries {
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			e.t.Fatal(err)
		}
		out[de.Name()] = b
	}
	return out
}

// runningJob enqueues a job of project projectID and hands it to the
// runner of tok, acknowledged.
func (e *env) runningJob(tok, name string, projectID int64) *runnerapi.JobResponse {
	e.t.Helper()
	spec := simpleSpec(name)
	spec.ProjectID = projectID
	return e.running(tok, spec)
}

// running enqueues spec and hands the job to the runner of tok,
// acknowledged.
func (e *env) running(tok string, spec dispatch.JobSpec) *runnerapi.JobResponse {
	e.t.Helper()
	e.enqueue(spec)
	job := e.take(tok)
	expectCode(e.t, "ack "+spec.Name, e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	return job
}

func (e *env) project(path string) *store.Project {
	e.t.Helper()
	p := &store.Project{Path: path, Name: filepath.Base(path), Visibility: "private", CreatedAt: e.clock.Now().UTC()}
	if err := e.st.CreateProject(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// newUser creates a user with a role and returns its token.
func (e *env) newUser(name, role string) string {
	e.t.Helper()
	r := e.adminDo("POST", "/api/v4/berth/users", restapi.CreateUserRequest{Name: name, Role: role})
	expectCode(e.t, "create user "+name, r, http.StatusCreated)
	var u restapi.UserJSON
	r.json(e.t, &u)
	return u.Token
}

// TestSnapshotStoredEncrypted: a runner uploads a failed job's snapshot
// with the job's token; the storage holds no plaintext; an admin, with
// the admin token or an admin user's, gets the exact bundle back, and
// nobody else gets it.
func TestSnapshotStoredEncrypted(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	ctx := t.Context()
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	job := e.runningJob(tok, "failing", 1)
	bundle := snapshotBundle(3*snapshots.ChunkSize+123, "MASKED-DB-PASSWORD-hunter2;")

	expectCode(t, "upload with the script's token", e.uploadSnapshot(as(job, scriptToken(t, job)), snapshotQuery, bundle), http.StatusForbidden)
	r := e.uploadSnapshot(job, snapshotQuery, bundle)
	expectCode(t, "upload", r, http.StatusCreated)
	var up struct {
		FileType string `json:"file_type"`
		Size     int64  `json:"size"`
	}
	r.json(t, &up)
	if up.FileType != snapshots.ArtifactType || up.Size != int64(len(bundle)) {
		t.Errorf("upload answered %+v, want the snapshot's type and its %d bytes", up, len(bundle))
	}
	objects := e.storedObjects(job.ID)
	if len(objects) != 1 {
		t.Fatalf("%d objects stored for the job, want 1", len(objects))
	}
	for name, b := range objects {
		if !strings.HasPrefix(name, snapshots.ArtifactType+"-") || int64(len(b)) != snapshots.SealedSize(int64(len(bundle))) {
			t.Errorf("stored %s of %d bytes", name, len(b))
		}
		if bytes.Contains(b, []byte("hunter2")) {
			t.Error("the stored snapshot holds the plaintext")
		}
	}
	expectCode(t, "failed", e.update(job, runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1}), http.StatusOK)

	// The admin token, through the client.
	var got bytes.Buffer
	n, err := client.New(e.http.URL, e.admin).Snapshot(ctx, job.ID, &got)
	if err != nil || n != int64(len(bundle)) || !bytes.Equal(got.Bytes(), bundle) {
		t.Fatalf("admin download: %d bytes (%v), equal %v; want the %d uploaded", n, err, bytes.Equal(got.Bytes(), bundle), len(bundle))
	}
	path := fmt.Sprintf("/api/v4/jobs/%d/snapshot", job.ID)
	r = e.adminDo("GET", path, nil)
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/octet-stream" ||
		r.header.Get("Content-Length") != fmt.Sprint(len(bundle)) || !strings.Contains(r.header.Get("Content-Disposition"), "snapshot.tar") {
		t.Errorf("admin download: %d %v", r.code, r.header)
	}

	// An admin user's token; a read-only user's, another token, none.
	adminUser := e.newUser("ops", "admin")
	readOnly := e.newUser("viewer", "read-only")
	if _, err := client.New(e.http.URL, adminUser).Snapshot(ctx, job.ID, &bytes.Buffer{}); err != nil {
		t.Errorf("an admin user's download: %v", err)
	}
	for _, tt := range []struct {
		name   string
		header map[string]string
		code   int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"a read-only user's token", map[string]string{runnerapi.HeaderPrivateToken: readOnly}, http.StatusForbidden},
		{"a read-only user's bearer token", map[string]string{"Authorization": "Bearer " + readOnly}, http.StatusForbidden},
		{"a made-up token", map[string]string{runnerapi.HeaderPrivateToken: "glpat-nope"}, http.StatusForbidden},
		{"the job's token as a private token", map[string]string{runnerapi.HeaderPrivateToken: job.Token}, http.StatusForbidden},
		{"the job's token", map[string]string{runnerapi.HeaderJobToken: job.Token}, http.StatusUnauthorized},
	} {
		for _, p := range []string{path, "/api/v4/snapshots"} {
			r := e.do("GET", p, nil, tt.header)
			if r.code != tt.code || bytes.Contains(r.body, []byte("hunter2")) || bytes.Contains(r.body, []byte(`"job_id"`)) {
				t.Errorf("GET %s with %s: %d %.200s, want %d", p, tt.name, r.code, r.body, tt.code)
			}
		}
	}
	r = e.do("GET", path, nil, map[string]string{runnerapi.HeaderPrivateToken: readOnly})
	if !strings.Contains(string(r.body), "user viewer is neither an admin nor a maintainer of project 1") {
		t.Errorf("a read-only user's refusal says %s", r.body)
	}

	// The REST API's job tells that the snapshot exists, not what it
	// holds.
	var jj restapi.JobJSON
	e.adminDo("GET", fmt.Sprintf("/api/v4/projects/1/jobs/%d", job.ID), nil).json(t, &jj)
	if len(jj.Artifacts) != 1 || jj.Artifacts[0].FileType != snapshots.ArtifactType || jj.Artifacts[0].Size != int64(len(bundle)) {
		t.Errorf("job JSON artifacts %+v", jj.Artifacts)
	}

	expectCode(t, "a job without a snapshot", e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", e.enqueue(simpleSpec("other"))), nil), http.StatusNotFound)
	expectCode(t, "a job that does not exist", e.adminDo("GET", "/api/v4/jobs/999999/snapshot", nil), http.StatusNotFound)
}

// TestSnapshotNotAnArtifact: no artifact path of the Runner API serves a
// snapshot: not its own job's token, not a dependent job's, not another
// job's, not the admin token; a dependent job is not told of it.
func TestSnapshotNotAnArtifact(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	build := e.runningJob(tok, "build", 1)
	bundle := snapshotBundle(1000, "secret-in-memory;")
	expectCode(t, "upload", e.uploadSnapshot(build, snapshotQuery, bundle), http.StatusCreated)
	path := fmt.Sprintf("/api/v4/jobs/%d/artifacts", build.ID)
	r := e.do("GET", path, nil, map[string]string{runnerapi.HeaderJobToken: build.Token})
	if r.code != http.StatusNotFound || bytes.Contains(r.body, []byte("secret-in-memory")) {
		t.Errorf("download by its own job: %d %.200s, want 404", r.code, r.body)
	}
	expectCode(t, "finish", e.update(build, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)

	spec := simpleSpec("test")
	spec.Dependencies = []int64{build.ID}
	e.enqueue(spec)
	dependent := e.take(tok)
	if len(dependent.Dependencies) != 1 || dependent.Dependencies[0].ArtifactsFile != nil {
		t.Errorf("the dependent job is told of artifacts: %+v", dependent.Dependencies)
	}
	other := e.runningJob(tok, "other", 1)
	for _, tt := range []struct {
		name   string
		header map[string]string
		code   int
	}{
		{"a dependent job's token", map[string]string{runnerapi.HeaderJobToken: dependent.Token}, http.StatusNotFound},
		{"a dependent job's script token", map[string]string{runnerapi.HeaderJobToken: dependent.Dependencies[0].Token}, http.StatusNotFound},
		{"another job's token", map[string]string{runnerapi.HeaderJobToken: other.Token}, http.StatusForbidden},
		{"the admin token", map[string]string{runnerapi.HeaderPrivateToken: e.admin}, http.StatusNotFound},
	} {
		for _, q := range []string{"", "?artifact_type=berth_snapshot"} {
			r := e.do("GET", path+q, nil, tt.header)
			if r.code != tt.code || bytes.Contains(r.body, []byte("secret-in-memory")) {
				t.Errorf("GET %s%s with %s: %d %.200s, want %d", path, q, tt.name, r.code, r.body, tt.code)
			}
		}
	}
}

// TestSnapshotReplaced: a second snapshot of a job replaces the first,
// whose object goes.
func TestSnapshotReplaced(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	job := e.runningJob(e.createRunner(restapi.CreateRunnerRequest{}), "j", 1)
	expectCode(t, "first", e.uploadSnapshot(job, snapshotQuery, snapshotBundle(5000, "first;")), http.StatusCreated)
	second := snapshotBundle(7000, "second;")
	expectCode(t, "second", e.uploadSnapshot(job, snapshotQuery, second), http.StatusCreated)
	if objects := e.storedObjects(job.ID); len(objects) != 1 {
		t.Errorf("%d objects stored, want the second snapshot's alone", len(objects))
	}
	var got bytes.Buffer
	if _, err := client.New(e.http.URL, e.admin).Snapshot(t.Context(), job.ID, &got); err != nil || !bytes.Equal(got.Bytes(), second) {
		t.Errorf("download after a replace: %v, the second: %v", err, bytes.Equal(got.Bytes(), second))
	}
}

// TestSnapshotListAndExpiry: the list shows the snapshots not expired,
// newest first, of one project when asked; an expired snapshot is gone
// from it and from the download at once, and from the storage at the
// reaper's next round.
func TestSnapshotListAndExpiry(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	ctx := t.Context()
	c := client.New(e.http.URL, e.admin)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	web, api := e.project("acme/web"), e.project("acme/api")

	a := e.runningJob(tok, "web-test", web.ID)
	expectCode(t, "upload a", e.uploadSnapshot(a, "?artifact_type=berth_snapshot&expire_in=1+hour", snapshotBundle(100, "a")), http.StatusCreated)
	e.clock.Advance(time.Minute)
	b := e.runningJob(tok, "api-test", api.ID)
	expectCode(t, "upload b", e.uploadSnapshot(b, "?artifact_type=berth_snapshot&expire_in=1+day", snapshotBundle(200, "b")), http.StatusCreated)
	e.clock.Advance(time.Minute)
	never := e.runningJob(tok, "web-lint", web.ID)
	expectCode(t, "upload never", e.uploadSnapshot(never, "?artifact_type=berth_snapshot", snapshotBundle(300, "n")), http.StatusCreated)
	archived := e.runningJob(tok, "web-build", web.ID)
	expectCode(t, "an archive", uploadArtifact(e, archived, "?artifact_type=archive", []byte("PK")), http.StatusCreated)

	list, err := c.Snapshots(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := snapshotJobs(list); !equalIDs(got, never.ID, b.ID, a.ID) {
		t.Fatalf("snapshots %v, want jobs %d, %d, %d (newest first)", got, never.ID, b.ID, a.ID)
	}
	wantB := restapi.SnapshotJSON{JobID: b.ID, JobName: "api-test", ProjectID: api.ID, ProjectPath: "acme/api", PipelineID: 0, Size: 200,
		CreatedAt: e.clock.Now().UTC().Add(-time.Minute), ExpireAt: e.clock.Now().UTC().Add(24*time.Hour - time.Minute)}
	if list[1] != wantB {
		t.Errorf("snapshot %+v, want %+v", list[1], wantB)
	}
	// Without expire_in (or "never"), max_snapshot_age (30 days).
	if want := e.clock.Now().UTC().Add(30 * 24 * time.Hour); !list[0].ExpireAt.Equal(want) {
		t.Errorf("a snapshot without expire_in expires at %v, want %v (the longest a snapshot is kept)", list[0].ExpireAt, want)
	}
	list, err = c.Snapshots(ctx, web.ID)
	if got := snapshotJobs(list); err != nil || !equalIDs(got, never.ID, a.ID) {
		t.Errorf("the web project's snapshots %v (%v), want jobs %d, %d", got, err, never.ID, a.ID)
	}
	expectCode(t, "an unknown project", e.adminDo("GET", "/api/v4/snapshots?project_id=999999", nil), http.StatusNotFound)
	expectCode(t, "a project path", e.adminDo("GET", "/api/v4/snapshots?project_id=acme%2Fweb", nil), http.StatusBadRequest)

	// Two hours on, a's snapshot expired: not listed, not served, though
	// the reaper has not run yet.
	e.clock.Advance(2 * time.Hour)
	list, err = c.Snapshots(ctx, 0)
	if got := snapshotJobs(list); err != nil || !equalIDs(got, never.ID, b.ID) {
		t.Errorf("snapshots after a's expiry %v (%v), want jobs %d, %d", got, err, never.ID, b.ID)
	}
	if _, err := c.Snapshot(ctx, a.ID, &bytes.Buffer{}); !client.IsNotFound(err) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("downloading an expired snapshot: %v, want 404 saying it may have expired", err)
	}
	if len(e.storedObjects(a.ID)) != 1 {
		t.Fatal("the expired snapshot's object went before the reaper ran")
	}
	if err := e.srv.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if objects := e.storedObjects(a.ID); len(objects) != 0 {
		t.Errorf("after the reaper, the expired snapshot's object is still stored: %d objects", len(objects))
	}
	if arts, err := e.st.ListArtifacts(ctx, a.ID); err != nil || len(arts) != 0 {
		t.Errorf("after the reaper, job %d has artifacts %v (%v)", a.ID, arts, err)
	}
	if len(e.storedObjects(b.ID)) != 1 || len(e.storedObjects(never.ID)) != 1 {
		t.Error("the reaper removed snapshots that had not expired")
	}
}

func snapshotJobs(list []restapi.SnapshotJSON) []int64 {
	var ids []int64
	for _, s := range list {
		ids = append(ids, s.JobID)
	}
	return ids
}

func equalIDs(got []int64, want ...int64) bool {
	return fmt.Sprint(got) == fmt.Sprint(want)
}

// TestSnapshotAltered: a stored snapshot altered in the storage is not
// served as if whole: a changed header is refused before the answer, a
// changed chunk cuts the answer short, which the client reports.
func TestSnapshotAltered(t *testing.T) {
	e := newSnapshotEnv(t, Config{})
	c := client.New(e.http.URL, e.admin)
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	bundle := snapshotBundle(3*snapshots.ChunkSize, "x")
	for _, tt := range []struct {
		name string
		at   int // the byte flipped
		read int // the bytes the client gets
	}{
		{"header", snapshots.HeaderSize - 1, 0},
		{"second chunk", snapshots.HeaderSize + snapshots.ChunkSize + 100, snapshots.ChunkSize},
	} {
		job := e.runningJob(tok, tt.name, 1)
		expectCode(t, "upload", e.uploadSnapshot(job, snapshotQuery, bundle), http.StatusCreated)
		for name, b := range e.storedObjects(job.ID) {
			b[tt.at] ^= 1
			p := filepath.Join(e.srv.artifacts.(interface{ Root() string }).Root(), fmt.Sprint(job.ID), name)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var got bytes.Buffer
		n, err := c.Snapshot(t.Context(), job.ID, &got)
		if err == nil || n != int64(tt.read) || !bytes.Equal(got.Bytes(), bundle[:tt.read]) {
			t.Errorf("%s altered: %d bytes, %v; want an error after the %d bytes that open", tt.name, n, err, tt.read)
		}
	}
}

// TestSnapshotWithoutKey: a coordinator without a secrets key refuses
// snapshots, saying why, and takes other artifacts.
func TestSnapshotWithoutKey(t *testing.T) {
	e := newEnv(t, Config{})
	job := e.runningJob(e.createRunner(restapi.CreateRunnerRequest{}), "j", 1)
	r := e.uploadSnapshot(job, snapshotQuery, []byte("memory"))
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "no secrets key") {
		t.Errorf("snapshot upload without a key: %d %s, want 400 saying why", r.code, r.body)
	}
	if objects := e.storedObjects(job.ID); len(objects) != 0 {
		t.Errorf("a refused snapshot left %d objects", len(objects))
	}
	expectCode(t, "an archive", uploadArtifact(e, job, "", []byte("PK")), http.StatusCreated)
	expectCode(t, "download", e.adminDo("GET", fmt.Sprintf("/api/v4/jobs/%d/snapshot", job.ID), nil), http.StatusNotFound)
}

// TestSnapshotSizeLimit: snapshots have a limit of their own, not the
// other artifacts'; it holds for a body of unknown length too (the
// limit is then found while encrypting).
func TestSnapshotSizeLimit(t *testing.T) {
	const limit = 2 * snapshots.ChunkSize
	e := newSnapshotEnv(t, Config{MaxArtifactSize: 100, MaxSnapshotSize: limit})
	job := e.runningJob(e.createRunner(restapi.CreateRunnerRequest{}), "j", 1)
	// (The body's multipart framing counts against the limit when the
	// request tells its length, as for every artifact.)
	expectCode(t, "a snapshot within its limit", e.uploadSnapshot(job, snapshotQuery, snapshotBundle(limit-1024, "m")), http.StatusCreated)
	expectCode(t, "a snapshot past its limit", e.uploadSnapshot(job, snapshotQuery, snapshotBundle(limit+1, "m")), http.StatusRequestEntityTooLarge)
	expectCode(t, "an archive past its limit", uploadArtifact(e, job, "", make([]byte, 200)), http.StatusRequestEntityTooLarge)
	for n, code := range map[int]int{limit: http.StatusCreated, limit + 1: http.StatusRequestEntityTooLarge} {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		fw, _ := mw.CreateFormFile("file", "snapshot.tar")
		_, _ = fw.Write(snapshotBundle(n, "u"))
		_ = mw.Close()
		// Not a *bytes.Reader: the request goes chunked, its length unknown.
		req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v4/jobs/%d/artifacts%s", e.http.URL, job.ID, snapshotQuery), io.MultiReader(&buf))
		req.Header.Set(runnerapi.HeaderJobToken, job.Token)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		res, err := e.http.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != code {
			t.Errorf("a snapshot of %d bytes, of unknown length: %d, want %d", n, res.StatusCode, code)
		}
	}
	var got bytes.Buffer
	if n, err := client.New(e.http.URL, e.admin).Snapshot(t.Context(), job.ID, &got); err != nil || n != limit || !bytes.Equal(got.Bytes(), snapshotBundle(limit, "u")) {
		t.Errorf("the snapshot at its limit: %d bytes, %v", n, err)
	}
	if objects := e.storedObjects(job.ID); len(objects) != 1 {
		t.Errorf("%d objects stored, want the one snapshot within its limit", len(objects))
	}
}

// TestSnapshotNotADownstreamInclude: a child pipeline's include:artifact
// does not read a job's snapshot: to it, the job has no artifacts.
func TestSnapshotNotADownstreamInclude(t *testing.T) {
	needGit(t)
	key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, Config{ExternalURL: ownURL}, Options{SecretsKey: key})
	e.createProject(t, "p")
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": `
generate:
  stage: build
  script: [x]
child:
  stage: test
  trigger:
    include: [{artifact: child.yml, job: generate}]
`}, "-o", "ci.skip")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	pl := e.createPipeline(t, "p", "main")
	job := e.takeWait(tok)
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	// A bundle that would be a valid child configuration, were it read.
	expectCode(t, "upload", e.uploadSnapshot(job, snapshotQuery, []byte("leaked:\n  script: [echo leaked]\n")), http.StatusCreated)
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	st := waitPipeline(t, e, pl.ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
	b := st.Latest("child")
	if b.Status != store.StatusFailed || b.FailureReason != pipelines.ReasonDownstreamCreationFailed {
		t.Errorf("bridge %s %s, want it failed for want of artifacts", b.Status, b.FailureReason)
	}
	if tr := e.trace(t, b.ID); !strings.Contains(tr, "Job `generate` not found in parent pipeline or does not have artifacts!") {
		t.Errorf("bridge log %q", tr)
	}
}
