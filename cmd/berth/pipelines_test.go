package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// fakeRunner takes jobs over the runner API and finishes each: it writes
// "hello from NAME" to the trace and fails when the job has FAIL=1.
func fakeRunner(ctx context.Context, t *testing.T, base, token string) {
	post := func(method, path string, body any, hdr map[string]string) (*http.Response, []byte) {
		var rd io.Reader
		if b, ok := body.([]byte); ok {
			rd = bytes.NewReader(b)
		} else {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, base+path, rd)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			return nil, nil // canceled at the end of the test
		}
		return res, b
	}
	last := ""
	for ctx.Err() == nil {
		res, body := post("POST", "/api/v4/jobs/request", runnerapi.JobRequest{Token: token, LastUpdate: last}, nil)
		if res == nil {
			return
		}
		if res.StatusCode != http.StatusCreated {
			last = res.Header.Get(runnerapi.HeaderLastUpdate)
			continue
		}
		var job runnerapi.JobResponse
		if err := json.Unmarshal(body, &job); err != nil {
			if ctx.Err() == nil {
				t.Errorf("decoding job: %v", err)
			}
			return
		}
		hdr := map[string]string{runnerapi.HeaderJobToken: job.Token}
		post("PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), runnerapi.UpdateJobRequest{Token: job.Token, State: "running"}, hdr)
		trace := "hello from " + job.JobInfo.Name + "\n"
		post("PATCH", fmt.Sprintf("/api/v4/jobs/%d/trace", job.ID), []byte(trace),
			map[string]string{runnerapi.HeaderJobToken: job.Token, runnerapi.HeaderContentRange: fmt.Sprintf("0-%d", len(trace)-1)})
		state := "success"
		for _, v := range job.Variables {
			if v.Key == "FAIL" && v.Value == "1" {
				state = "failed"
			}
		}
		post("PUT", fmt.Sprintf("/api/v4/jobs/%d", job.ID), runnerapi.UpdateJobRequest{Token: job.Token, State: state, ExitCode: map[string]int{"failed": 3}[state]}, hdr)
	}
}

func TestPipelinesCreateWaitAndLog(t *testing.T) {
	data := t.TempDir()
	url, admin, c := cliCoordinator(t, data)

	dir := t.TempDir()
	files := map[string]string{
		".gitlab-ci.yml": "build:\n  stage: build\n  script: [make]\ntest:\n  stage: test\n  needs: [build]\n  script: [check]\n",
		"src/main.c":     "int main() {}\n",
		"out/junk":       "ignored",
		".gitignore":     "out/\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"--server", url, "--admin-token", admin}
	out, err := runCLI(t, append([]string{"pipelines", "create", "--project", "grp/demo", dir}, common...)...)
	if err != nil {
		t.Fatalf("pipelines create: %v", err)
	}
	id := strings.TrimSpace(out)
	if _, err := parseID(id); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("pipelines create printed %q, want only a pipeline id", out)
	}
	if p, err := c.Project(context.Background(), "grp/demo"); err != nil || p.DefaultBranch != "main" {
		t.Fatalf("project after create: %+v %v", p, err)
	}

	out, err = runCLI(t, append([]string{"pipelines", "wait", id, "--interval", "10ms"}, common...)...)
	if err != nil {
		t.Fatalf("pipelines wait on a passing pipeline: %v (output %q)", err, out)
	}
	for _, want := range []string{"build (build):", "test (test):", "success", "pipeline " + id + ": success"} {
		if !strings.Contains(out, want) {
			t.Errorf("wait output %q lacks %q", out, want)
		}
	}

	// The commit has the files git add -A sees.
	pl, _ := parseID(id)
	pj, err := c.Pipeline(context.Background(), pl)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := exec.Command("git", "--git-dir", filepath.Join(data, "repos", fmt.Sprintf("%d.git", pj.ProjectID)), "ls-tree", "-r", "--name-only", pj.Sha).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(tree)); strings.Join(got, " ") != ".gitignore .gitlab-ci.yml src/main.c" {
		t.Errorf("committed files %v", got)
	}

	jobs, err := c.PipelineJobs(context.Background(), pj.ProjectID, pl)
	if err != nil || len(jobs) != 2 {
		t.Fatalf("jobs %+v %v", jobs, err)
	}
	for _, f := range [][]string{nil, {"-f"}} {
		out, err = runCLI(t, append(append([]string{"jobs", "log", fmt.Sprint(jobs[0].ID)}, f...), common...)...)
		if err != nil || out != "hello from build\n" {
			t.Errorf("jobs log %v: %q %v", f, out, err)
		}
	}

	// Unchanged directory, failing pipeline: no new commit, exit code 1,
	// JSON lines.
	out, err = runCLI(t, append([]string{"pipelines", "create", "--project", "grp/demo", "--var", "FAIL=1", dir}, common...)...)
	if err != nil {
		t.Fatalf("second create: %v", err)
	}
	id2 := strings.TrimSpace(out)
	pl2, _ := parseID(id2)
	pj2, _ := c.Pipeline(context.Background(), pl2)
	if pj2.Sha != pj.Sha {
		t.Errorf("unchanged directory made a new commit: %s, want %s", pj2.Sha, pj.Sha)
	}
	out, err = runCLI(t, append([]string{"pipelines", "wait", id2, "--json", "--interval", "10ms"}, common...)...)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("wait on a failing pipeline: %v, want exit code 1", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last pipelineEvent
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Status != "failed" || fmt.Sprint(last.PipelineID) != id2 {
		t.Errorf("last JSON line %q: %+v %v", lines[len(lines)-1], last, err)
	}
	sawSkip := false
	for _, l := range lines[:len(lines)-1] {
		var ev jobEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Errorf("line %q: %v", l, err)
		}
		if ev.Name == "test" && ev.Status == "skipped" {
			sawSkip = true
		}
	}
	if !sawSkip {
		t.Errorf("JSON lines %q: want test skipped after build failed", lines)
	}

	// A changed directory pushed on top of the shallow fetch of the
	// branch: the push starts with "shallow" lines (issue 9, defect 1).
	if err := os.WriteFile(filepath.Join(dir, "src/main.c"), []byte("int main() { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, append([]string{"pipelines", "create", "--project", "grp/demo", dir}, common...)...)
	if err != nil {
		t.Fatalf("create after a change (second push): %v", err)
	}
	pl3, _ := parseID(strings.TrimSpace(out))
	if pj3, err := c.Pipeline(context.Background(), pl3); err != nil || pj3.Sha == pj.Sha {
		t.Errorf("second push: pipeline %+v %v, want a new commit", pj3, err)
	}

	if _, err := runCLI(t, append([]string{"pipelines", "wait", "nope"}, common...)...); err == nil {
		t.Error("wait with a bad id succeeded")
	}
	if _, err := runCLI(t, append([]string{"jobs", "log", "999"}, common...)...); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("log of a missing job: %v", err)
	}
	out, err = runCLI(t, append([]string{"jobs", "retry", fmt.Sprint(jobs[0].ID)}, common...)...)
	if err != nil || !strings.Contains(out, "build") {
		t.Errorf("jobs retry: %q %v", out, err)
	}

	// delete: refused to a user who does not own the project; the admin's.
	u, err := c.CreateUser(context.Background(), restapi.CreateUserRequest{Name: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, append([]string{"pipelines", "delete", id2, "--project", "grp/demo", "--token", u.Token}, common...)...); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("delete by a non-owner: %v, want 403", err)
	}
	out, err = runCLI(t, append([]string{"pipelines", "delete", id2}, common...)...)
	if err != nil || out != "pipeline "+id2+": deleted\n" {
		t.Errorf("pipelines delete: %q %v", out, err)
	}
	n2, _ := parseID(id2)
	if _, err := c.Pipeline(context.Background(), n2); !client.IsNotFound(err) {
		t.Errorf("the deleted pipeline: %v, want 404", err)
	}
}

func TestPipelinesShowTree(t *testing.T) {
	url, admin, _ := cliCoordinator(t, "")

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
build:
  stage: build
  script: [make]
child:
  stage: test
  trigger:
    include: child.yml
    strategy: depend
`), 0o644)
	os.WriteFile(filepath.Join(dir, "child.yml"), []byte("unit:\n  script: [x]\nnested:\n  stage: deploy\n  trigger: {include: grandchild.yml}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "grandchild.yml"), []byte("deep:\n  script: [x]\n"), 0o644)
	common := []string{"--server", url, "--admin-token", admin}
	out, err := runCLI(t, append([]string{"pipelines", "create", "--project", "tree", dir}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if out, err := runCLI(t, append([]string{"pipelines", "wait", id, "--interval", "10ms"}, common...)...); err != nil {
		t.Fatalf("wait: %v\n%s", err, out)
	}
	// The grandchild has no strategy above it: wait for it too.
	var tr *pipelineTree
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err = runCLI(t, append([]string{"pipelines", "show", id, "--json"}, common...)...)
		if err != nil {
			t.Fatal(err)
		}
		tr = &pipelineTree{}
		if err := json.Unmarshal([]byte(out), tr); err != nil {
			t.Fatalf("show --json %q: %v", out, err)
		}
		if len(tr.Bridges) == 1 && tr.Bridges[0].Downstream != nil && len(tr.Bridges[0].Downstream.Bridges) == 1 &&
			tr.Bridges[0].Downstream.Bridges[0].Downstream != nil && tr.Bridges[0].Downstream.Bridges[0].Downstream.Pipeline.Status == "success" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree never finished: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	child := tr.Bridges[0].Downstream
	if tr.Pipeline.Status != "success" || len(tr.Jobs) != 1 || tr.Bridges[0].Name != "child" || child.Pipeline.Source != "parent_pipeline" ||
		len(child.Jobs) != 1 || child.Jobs[0].Name != "unit" || child.Pipeline.UpstreamPipelineID != tr.Pipeline.ID {
		t.Errorf("tree %s", out)
	}
	out, err = runCLI(t, append([]string{"pipelines", "show", id}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"pipeline #" + id + " success",
		"\n  build  build  success\n",
		"\n  child  test   success  (trigger → pipeline #",
		"\n    pipeline #", "source parent_pipeline",
		"\n      unit    test    success\n",
		"\n      nested  deploy  success  (trigger → pipeline #",
		"\n          deep  test  success\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
}

// cliCoordinator starts a real coordinator (data in data, or a temporary
// directory) behind an HTTP server with a fake runner taking its jobs, for
// CLI tests; it skips without git. It returns the server URL, the admin
// token and a client; everything stops when the test ends.
func cliCoordinator(t *testing.T, data string) (url, admin string, c *client.Client) {
	t.Helper()
	testenv.LookPath(t, "git")
	if data == "" {
		data = t.TempDir()
	}
	srv, closeSrv, err := openCoordinator(context.Background(), slog.New(slog.DiscardHandler), data, coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeSrv)
	admin, err = srv.EnsureAdminToken(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	c = client.New(hs.URL, admin)
	rn, err := c.CreateRunner(context.Background(), restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fakeRunner(ctx, t, hs.URL, rn.Token) }()
	t.Cleanup(func() { stop(); srv.Close(); <-done })
	return hs.URL, admin, c
}
