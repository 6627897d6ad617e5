package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// TestReplicasShareObjectStore: two replicas on one PostgreSQL database
// and one S3 bucket. A job handed out by one uploads its artifact there;
// the artifact is stored in the bucket, not in either data directory, and
// is downloaded through the other replica.
func TestReplicasShareObjectStore(t *testing.T) {
	dsn := testenv.Postgres(t)
	endpoint, access, secret, bucket := testenv.S3(t)
	t.Setenv("AWS_ACCESS_KEY_ID", access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	objects := fmt.Sprintf("s3://%s/arts?endpoint=%s&region=us-east-1&insecure=true", bucket, endpoint)
	ctx := t.Context()
	var (
		reps []*Coordinator
		dirs []string
	)
	for i := range 2 {
		dirs = append(dirs, filepath.Join(t.TempDir(), fmt.Sprint(i)))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := Open(ctx, Options{DataDir: dirs[i], Listener: ln, Store: dsn, ObjectStore: objects,
			Config: coordinator.Config{NoGitHosting: i > 0, TraceArchiveAfter: time.Nanosecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Shutdown(context.Background()) })
		reps = append(reps, c)
	}
	const admin = "admin-token-for-the-test"
	if _, err := reps[0].EnsureAdminToken(ctx, admin); err != nil {
		t.Fatal(err)
	}
	api := client.New(reps[0].URL, admin)
	tok, err := api.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Enqueue(ctx, dispatch.JobSpec{Name: "build", ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	do := func(base, method, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, base+path, body)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	var job runnerapi.JobResponse
	for deadline := time.Now().Add(10 * time.Second); job.ID == 0; {
		b, _ := json.Marshal(runnerapi.JobRequest{Token: tok.Token, SystemID: "s_1"})
		resp, body := do(reps[1].URL, "POST", "/api/v4/jobs/request", bytes.NewReader(b), map[string]string{"Content-Type": "application/json"})
		if resp.StatusCode == http.StatusCreated {
			if err := json.Unmarshal(body, &job); err != nil {
				t.Fatal(err)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("no job from replica 1: %d", resp.StatusCode)
		}
	}
	b, _ := json.Marshal(runnerapi.UpdateJobRequest{Token: job.Token, State: "running"})
	if resp, body := do(reps[1].URL, "PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), bytes.NewReader(b), map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("ack: %d %s", resp.StatusCode, body)
	}
	content := []byte("PK artifact bytes of job " + fmt.Sprint(job.ID))
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "artifacts.zip")
	fw.Write(content)
	mw.Close()
	if resp, body := do(reps[1].URL, "POST", fmt.Sprintf("/api/v4/jobs/%d/artifacts?artifact_format=zip&artifact_type=archive", job.ID), &buf,
		map[string]string{runnerapi.HeaderJobToken: job.Token, "Content-Type": mw.FormDataContentType()}); resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload through replica 1: %d %s", resp.StatusCode, body)
	}
	resp, got := do(reps[0].URL, "GET", fmt.Sprintf("/api/v4/jobs/%d/artifacts", job.ID), nil, map[string]string{runnerapi.HeaderPrivateToken: admin})
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, content) {
		t.Fatalf("download through replica 0: %d %q, want %q", resp.StatusCode, got, content)
	}
	// The job's log, written through replica 1, is archived into the
	// bucket once the job is finished, and replica 0 serves it from there.
	log := []byte("Running with berth\nJob succeeded\n")
	if resp, body := do(reps[1].URL, "PATCH", fmt.Sprintf("/api/v4/jobs/%d/trace", job.ID), bytes.NewReader(log),
		map[string]string{runnerapi.HeaderJobToken: job.Token, runnerapi.HeaderContentRange: fmt.Sprintf("0-%d", len(log)-1)}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("trace through replica 1: %d %s", resp.StatusCode, body)
	}
	b, _ = json.Marshal(runnerapi.UpdateJobRequest{Token: job.Token, State: "success",
		Output: &runnerapi.Output{Checksum: fmt.Sprintf("crc32:%08x", crc32.ChecksumIEEE(log)), Bytesize: int64(len(log))}})
	if resp, body := do(reps[1].URL, "PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), bytes.NewReader(b), map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("success: %d %s", resp.StatusCode, body)
	}
	time.Sleep(time.Millisecond) // past TraceArchiveAfter
	if err := reps[1].Reap(ctx); err != nil {
		t.Fatal(err)
	}
	ti, err := reps[0].Store.TraceInfo(ctx, job.ID)
	if err != nil || ti.ArchiveKey == "" {
		t.Fatalf("trace after the reaper: %+v, %v; want archived", ti, err)
	}
	resp, got = do(reps[0].URL, "GET", fmt.Sprintf("/api/v4/projects/1/jobs/%d/trace", job.ID), nil, map[string]string{runnerapi.HeaderPrivateToken: admin})
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, log) {
		t.Fatalf("archived log through replica 0: %d %q, want %q", resp.StatusCode, got, log)
	}
	for i, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "artifacts")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("replica %d has an artifacts directory (%v): artifacts belong in the bucket", i, err)
		}
	}
}
