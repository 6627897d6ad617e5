package custom

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

// TestPipelineWithTheShippedDriver runs a real pipeline — the embedded
// coordinator, the runner manager over the Runner API, git over HTTP —
// with every job in a container of examples/custom-executor: artifacts
// and the cache go from one job's container to the next.
func TestPipelineWithTheShippedDriver(t *testing.T) {
	needDocker(t)
	testenv.LookPath(t, "git")
	host := testenv.DockerBridge(t)
	base := t.TempDir()
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	if err := os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
stages: [build, test]
build:
  stage: build
  image: `+exampleImage+`
  script:
    - test -f /.dockerenv
    - mkdir -p out cache
    - echo made-in-a-driver-container > out/msg.txt
    - echo cached > cache/value.txt
  artifacts:
    paths: [out/]
  cache:
    key: k
    paths: [cache/]
test:
  stage: test
  image: `+exampleImage+`
  cache:
    key: k
    paths: [cache/]
    policy: pull
  script:
    - test "$(cat out/msg.txt)" = made-in-a-driver-container
    - test "$(cat cache/value.txt)" = cached
`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := exampleProvider(t, filepath.Join(base, "driver"))
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: Name, ListenHost: host,
		ConfigureRunner: func(rc *config.Runner) { rc.Custom = &p.o.Config }})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	if n := strings.Count(logs.String(), "Using Custom executor with driver"); n != 2 {
		t.Errorf("%d jobs ran with the driver, want 2:\n%s", n, logs.String())
	}
	if left := containers(t, filepath.Join(base, "driver"), true); len(left) != 0 {
		t.Errorf("the driver left containers: %v", left)
	}
}
