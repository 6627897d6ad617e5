package ssh

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
)

// TestPipelineThroughCoordinatorAndRunner runs a real pipeline — the
// embedded coordinator, the runner manager over the Runner API, git over
// HTTP — with every job on the test sshd: artifacts and the cache go from
// one job to the next through the helper uploaded to the host.
func TestPipelineThroughCoordinatorAndRunner(t *testing.T) {
	needSSHD(t)
	testenv.LookPath(t, "git")
	dir := t.TempDir()
	project := filepath.Join(dir, "project")
	os.MkdirAll(project, 0o755)
	if err := os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
stages: [build, test]
build:
  stage: build
  script:
    - mkdir -p out cache
    - echo made-over-ssh > out/msg.txt
    - echo cached-over-ssh > cache/value.txt
  artifacts:
    paths: [out/]
  cache:
    key: k
    paths: [cache/]
test:
  stage: test
  cache:
    key: k
    paths: [cache/]
    policy: pull
  script:
    - test "$(cat out/msg.txt)" = made-over-ssh
    - test "$(cat cache/value.txt)" = cached-over-ssh
    - echo "build dir $CI_PROJECT_DIR"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	o := testOptions(filepath.Join(dir, "remote"))
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs,
		Provider: newProvider(t, o), ProviderName: Name, ConfigureRunner: func(rc *config.Runner) { rc.SSH = &o.Config }})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	if n := strings.Count(logs.String(), "Using SSH executor with"); n != 2 {
		t.Errorf("%d jobs ran over SSH, want 2:\n%s", n, logs.String())
	}
}
