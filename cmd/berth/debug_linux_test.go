package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
)

const debugTestImage = "berth-test/busybox:latest" // built by .ci/images

// TestDebugAFailedJob: a pipeline job with BERTH_SNAPSHOT=on_failure runs
// in a microVM (a runner manager with the microvm executor against a real
// coordinator), writes a file and fails. The
// runner uploads the VM's snapshot; `berth debug --list` shows it; `berth
// debug JOB -c …` restores it on this machine and the command sees the
// file (after_script, which removes it, ran after the snapshot) and the
// job's environment, without its masked
// variable; it does so with the token of a maintainer of the job's
// project. A read-only user can neither list nor fetch it, nor can
// another project's maintainer.
func TestDebugAFailedJob(t *testing.T) {
	testenv.VMs(t)
	testenv.DockerImage(t, debugTestImage)
	berth := testenv.Berth(t)
	ctx := context.Background()
	dir := t.TempDir()
	srv, admin, adminTok := vmCoordinator(t, dir)
	created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	vmRunner(t, berth, dir, "vms", srv.URL, created.Token)
	p, pl := startPipeline(t, srv, dir, "debug/test", `
variables:
  GIT_STRATEGY: none
  BERTH_SNAPSHOT: on_failure
  GREETING: hello-from-the-job
broken:
  image: `+debugTestImage+`
  script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - echo "written before failing" > evidence.txt
    - echo "the job fails now"; exit 3
  after_script:
    - rm -f "$CI_PROJECT_DIR/evidence.txt"
`, &store.Variable{Key: "SECRET_TOKEN", Value: "s3cr3t-value-xyz", Masked: true})
	var job *store.Job
	waitFor(t, 5*time.Minute, "the job to fail", func() bool {
		jobs, _ := srv.Store.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
		if len(jobs) == 1 && jobs[0].Status == store.StatusFailed {
			job = jobs[0]
		}
		return job != nil
	})
	var trace strings.Builder
	admin.Trace(ctx, p.ID, job.ID, &trace)
	if !strings.Contains(trace.String(), "Saved a snapshot of the job's VM") {
		t.Fatalf("the job's log does not say it saved a snapshot:\n%s", trace.String())
	}
	for _, line := range strings.Split(trace.String(), "\n") {
		if strings.Contains(line, "snapshot") {
			t.Log(strings.TrimSpace(line))
		}
	}
	id := strconv.FormatInt(job.ID, 10)
	out, err := runCLI(t, "debug", "--list", "--server", srv.URL, "--admin-token", adminTok)
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "broken") {
		t.Fatalf("debug --list: %v\n%s", err, out)
	}
	// Project members: a maintainer of debug/test, one of another project.
	maint, err := admin.CreateUser(ctx, restapi.CreateUserRequest{Name: "maint"})
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := admin.CreateUser(ctx, restapi.CreateUserRequest{Name: "stranger"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateProject(ctx, restapi.CreateProjectRequest{Path: "other/app"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ project, user string }{{"debug/test", "maint"}, {"other/app", "stranger"}} {
		if _, err := admin.AddProjectMember(ctx, m.project, restapi.MemberRequest{Username: m.user, AccessLevel: int(store.AccessMaintainer)}); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := runCLI(t, "debug", "--list", "--server", srv.URL, "--token", stranger.Token); err != nil || strings.Contains(out, "broken") {
		t.Errorf("another project's maintainer lists: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "debug", id, "--server", srv.URL, "--token", stranger.Token, "-c", "true"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("another project's maintainer restored the snapshot: %v\n%s", err, out)
	}
	out, err = runCLI(t, "debug", id, "--server", srv.URL, "--token", maint.Token, "-c",
		`cat evidence.txt; pwd; echo "greeting=$GREETING secret=$SECRET_TOKEN"; exit 5`)
	if ee, ok := err.(*exitError); !ok || ee.code != 5 {
		t.Errorf("debug -c ... exit 5: %v", err)
	}
	for _, want := range []string{"written before failing", "/debug/test", "greeting=hello-from-the-job secret=\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("in the restored VM, the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cr3t") {
		t.Errorf("the masked variable reached the debug shell:\n%s", out)
	}

	viewer, err := admin.CreateUser(ctx, restapi.CreateUserRequest{Name: "viewer", Role: "read-only"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, "debug", "--list", "--server", srv.URL, "--admin-token", viewer.Token); err == nil {
		t.Errorf("a read-only user listed the snapshots:\n%s", out)
	}
	if out, err := runCLI(t, "debug", id, "--server", srv.URL, "--admin-token", viewer.Token, "-c", "true"); err == nil {
		t.Errorf("a read-only user restored the snapshot:\n%s", out)
	}
}

// TestRunKeepsTheSnapshot: berth run's coordinator goes with the run, so
// the snapshot a failed microVM job left is saved to the user's cache
// first; berth run prints the path, and berth debug --bundle restores it
// without any coordinator.
func TestRunKeepsTheSnapshot(t *testing.T) {
	testenv.VMs(t)
	testenv.DockerImage(t, debugTestImage)
	env := append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
broken:
  isolation: microvm
  image: `+debugTestImage+`
  variables:
    GIT_STRATEGY: none
    BERTH_SNAPSHOT: on_failure
  script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - echo "left by the local job" > evidence.txt
    - exit 1
`), 0o644)
	out, err := berthCmd(t, env, "run", dir).CombinedOutput()
	if err == nil {
		t.Fatalf("berth run of a failing job succeeded:\n%s", out)
	}
	_, after, ok := strings.Cut(string(out), "berth debug --bundle ")
	if !ok {
		t.Fatalf("berth run does not say where the snapshot is:\n%s", out)
	}
	file, _, _ := strings.Cut(after, "\n")
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the snapshot file %s: %v (want mode 0600: it holds the job's memory)", file, err)
	}
	got, err := berthCmd(t, env, "debug", "--bundle", file, "-c", "cat evidence.txt").CombinedOutput()
	if err != nil || !strings.Contains(string(got), "left by the local job") {
		t.Errorf("berth debug --bundle: %v\n%s", err, got)
	}
}
