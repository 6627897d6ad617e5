package dockerautoscaler_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/berthci/berth/executor/autoscaler"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/dockerautoscaler"
	"github.com/berthci/berth/fleeting/plugins/local"
	"github.com/berthci/berth/internal/testenv"
	localrun "github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/helper"
	"github.com/berthci/berth/taskscaler"
)

// The test binary is also the local plugin's instance server and, in the
// helper volume, the berth helper of the jobs.
func TestMain(m *testing.M) {
	local.RunServerIfAsked()
	if len(os.Args) > 1 && os.Args[1] == "helper" {
		os.Exit(helper.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr, "test"))
	}
	os.Exit(m.Run())
}

const image = "berth-test/debian:bookworm"

// needDocker returns a client of this machine's engine, or skips.
func needDocker(t *testing.T) *client.Client {
	t.Helper()
	testenv.LookPath(t, "git")
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		testenv.Missing(t, "docker client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		testenv.Missing(t, "Docker Engine not reachable: %v", err)
	}
	if _, err := cli.ImageInspect(ctx, image); err != nil {
		testenv.Missing(t, "image %s missing (build it with .ci/images): %v", image, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var usingRE = regexp.MustCompile(`Using instance (\S+), slot (\d+), job (\d+) on it`)

// TestContainersOnAutoscaledInstances: the docker-autoscaler executor on
// the local plugin, whose instances reach this machine's engine through
// the connector: a fan-out of container jobs scales the fleet from zero,
// artifacts go from job to job, every container carries its instance and
// slot, and after idle_time the fleet is back to zero with no container,
// network or instance left.
func TestContainersOnAutoscaledInstances(t *testing.T) {
	cli := needDocker(t)
	host := testenv.DockerBridge(t)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g := local.New(local.Config{StateDir: filepath.Join(dir, "fleeting"), Name: "dae2e", MaxInstances: 4})
	x, err := dockerautoscaler.New(dockerautoscaler.Options{
		Config:   econfig.Docker{Image: image, PullPolicy: econfig.StringList{econfig.PullNever}},
		StateDir: filepath.Join(dir, "docker"), KillGrace: time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := autoscaler.New(context.Background(), autoscaler.Options{
		Config: taskscaler.Config{Plugin: "local", CapacityPerInstance: 2, MaxInstances: 3, DeleteInstancesOnShutdown: true,
			ShutdownDeletionInterval: 200 * time.Millisecond,
			Policies:                 []taskscaler.Policy{{IdleTime: 2 * time.Second}},
			UpdateInterval:           time.Second, UpdateIntervalWhenExpecting: 100 * time.Millisecond},
		Group: g, Instances: x, Name: "dae2e", Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("autoscaler shutdown: %v", err)
		}
	})
	project := filepath.Join(dir, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
stages: [build, test]
build:
  stage: build
  parallel: 5
  script:
    - test -f /.dockerenv
    - mkdir -p out && echo "from $CI_NODE_INDEX" > out/part-$CI_NODE_INDEX
    - sleep 2
  artifacts:
    paths: [out/]
check:
  stage: test
  script:
    - test "$(cat out/part-* | wc -l)" -eq 5
`), 0o644)
	var logs bytes.Buffer
	res, err := localrun.Run(t.Context(), localrun.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: dockerautoscaler.Name,
		ListenHost: host, Concurrency: 6, ConfigureRunner: func(rc *config.Runner) {
			rc.BuildsDir, rc.CacheDir = "", ""
			rc.Autoscaler = &taskscaler.Config{Plugin: "local"}
		}})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	instances := map[string]bool{}
	for _, m := range usingRE.FindAllStringSubmatch(logs.String(), -1) {
		instances[m[1]] = true
	}
	if len(instances) < 2 {
		t.Errorf("5 parallel jobs at capacity 2 ran on %d instances: %v", len(instances), instances)
	}
	if !strings.Contains(logs.String(), "Using Docker executor with image "+image) {
		t.Errorf("no job ran in a container:\n%s", logs.String())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st := p.Scaler().Stats()
		n := st.Instances[taskscaler.PhaseCreating] + st.Instances[taskscaler.PhaseBooted] + st.Instances[taskscaler.PhaseReady] +
			st.Instances[taskscaler.PhaseRemoving] + st.Instances[taskscaler.PhaseDeleting] + st.Requested
		dirs, _ := filepath.Glob(filepath.Join(dir, "fleeting", "instances", "*"))
		if n == 0 && len(dirs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after idle_time: stats %+v, %d instances on disk", st, len(dirs))
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", docker.LabelManaged+"=true"), filters.Arg("label", docker.LabelHost))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if strings.HasPrefix(c.Labels[docker.LabelHost], "dae2e-") {
			t.Errorf("container %v of instance %s left behind", c.Names, c.Labels[docker.LabelHost])
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
