package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// TestSnapshotPointAcrossRunners: two runner managers with microVMs
// against one coordinator, each job pinned to one by its tags. build,
// on the first, takes snapshot point end; test, on the second, restores
// build:end: the second runner has no branch point of it, so it fetches
// the bundle from the coordinator, and test's script sees what build's
// script left in its VM (no artifact carries it).
func TestSnapshotPointAcrossRunners(t *testing.T) {
	testenv.VMs(t)
	testenv.DockerImage(t, debugTestImage)
	berth := testenv.Berth(t)
	ctx := context.Background()
	dir := t.TempDir()
	srv, admin, _ := vmCoordinator(t, dir)
	no := false
	for _, tag := range []string{"first", "second"} {
		created, err := admin.CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type", TagList: runnerapi.TagList{tag}, RunUntagged: &no})
		if err != nil {
			t.Fatal(err)
		}
		vmRunner(t, berth, dir, tag, srv.URL, created.Token)
	}
	p, pl := startPipeline(t, srv, dir, "fleet/points", `
stages: [build, test]
variables:
  GIT_STRATEGY: none
build:
  stage: build
  tags: [first]
  image: `+debugTestImage+`
  variables:
    BERTH_SNAPSHOT: end
  script:
    - mkdir -p "$CI_PROJECT_DIR" && cd "$CI_PROJECT_DIR"
    - head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' > built
    - echo "BUILT $(cat built) on $(hostname)"
test:
  stage: test
  tags: [second]
  image: `+debugTestImage+`
  needs: [build]
  variables:
    BERTH_RESTORE: "build:end"
  script:
    - cd "$CI_PROJECT_DIR"
    - echo "TESTED $(cat built) on $(hostname)"
`)
	jobs := map[string]*store.Job{}
	waitFor(t, 8*time.Minute, "the pipeline's jobs to finish", func() bool {
		all, _ := srv.Store.ListJobs(ctx, store.JobFilter{PipelineID: pl.ID})
		done := 0
		for _, j := range all {
			jobs[j.Name] = j
			if j.Status.Finished() {
				done++
			}
		}
		return len(all) == 2 && done == 2
	})
	logs := map[string]string{}
	for name, j := range jobs {
		var b strings.Builder
		admin.Trace(ctx, p.ID, j.ID, &b)
		logs[name] = b.String()
		if j.Status != store.StatusSuccess {
			t.Errorf("job %s: %s\n%s", name, j.Status, logs[name])
		}
	}
	built := regexp.MustCompile(`BUILT (\w+) on (\S+)`).FindStringSubmatch(logs["build"])
	tested := regexp.MustCompile(`TESTED (\w+) on (\S+)`).FindStringSubmatch(logs["test"])
	if built == nil || tested == nil || built[1] != tested[1] {
		t.Fatalf("test does not see what build left: built %v, tested %v\nbuild:\n%s\ntest:\n%s", built, tested, logs["build"], logs["test"])
	}
	if built[2] == tested[2] {
		t.Errorf("both jobs ran on VM %s", built[2])
	}
	if !strings.Contains(logs["build"], "uploaded") || !strings.Contains(logs["test"], "fetched from the coordinator") {
		t.Errorf("the logs do not say the point went through the coordinator:\nbuild:\n%s\ntest:\n%s", logs["build"], logs["test"])
	}
}
