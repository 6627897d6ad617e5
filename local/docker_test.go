package local

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/internal/testenv"
)

const (
	debianImage = "berth-test/debian:bookworm"
	httpdImage  = "berth-test/httpd:latest"
	bbImage     = "berth-test/busybox:latest"
)

// needDocker skips (or fails in CI) unless a Docker engine and the test
// images built by .ci/images are there.
func needDocker(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "git")
	docker := testenv.LookPath(t, "docker")
	if out, err := exec.Command(docker, "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		testenv.Missing(t, "no Docker engine: %v %s", err, out)
	}
	for _, img := range []string{debianImage, httpdImage, bbImage} {
		if err := exec.Command(docker, "image", "inspect", img).Run(); err != nil {
			testenv.Missing(t, "image %s missing (run .ci/images)", img)
		}
	}
}

// uniqueDir is a project directory whose name (and so project path,
// local/<name>) no other test shares.
func uniqueDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir, err := os.MkdirTemp(t.TempDir(), "berthrun-*")
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// left lists what the engine still has of a project.
func left(t *testing.T, project string) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"ps", "-a", "--format", "container {{.Names}}"},
		{"network", "ls", "--format", "network {{.Name}}"},
		{"volume", "ls", "--format", "volume {{.Name}}"},
	} {
		args = append(args[:len(args)-2:len(args)-2], "--filter", "label=com.berth.project.path="+project, args[len(args)-2], args[len(args)-1])
		out, err := exec.Command("docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %v: %v %s", args, err, out)
		}
		b.Write(out)
	}
	return strings.TrimSpace(b.String())
}

// TestRunImagesServicesArtifactsAndCache: jobs that name an image run in
// it, a job talks to two services by their aliases (one service has two),
// artifacts and the cache go from one container job to the next, a job
// without image runs in the shell, and nothing of the run stays in the
// engine.
func TestRunImagesServicesArtifactsAndCache(t *testing.T) {
	needDocker(t)
	dir := uniqueDir(t, map[string]string{".gitlab-ci.yml": `
stages: [build, test]
build:
  stage: build
  image: ` + debianImage + `
  script:
    - test -f /etc/debian_version
    - mkdir -p out cache
    - echo built-in-a-container > out/msg.txt
    - echo cached-value > cache/value.txt
  artifacts:
    paths: [out/]
  cache:
    key: k
    paths: [cache/]
test:
  stage: test
  image: ` + debianImage + `
  services:
    - name: ` + httpdImage + `
      alias: web,www
    - name: ` + bbImage + `
      alias: other
      command: ["httpd", "-f", "-p", "9090", "-h", "/www"]
  cache:
    key: k
    paths: [cache/]
    policy: pull
  script:
    - test "$(cat out/msg.txt)" = built-in-a-container
    - test "$(cat cache/value.txt)" = cached-value
    - for host in web www; do exec 3<>/dev/tcp/$host/8080; printf 'GET / HTTP/1.0\r\n\r\n' >&3; cat <&3 | tail -1; exec 3<&-; done
    - for i in $(seq 1 50); do (exec 3<>/dev/tcp/other/9090) 2>/dev/null && break; sleep 0.2; done; exec 3<>/dev/tcp/other/9090; printf 'GET / HTTP/1.0\r\n\r\n' >&3; cat <&3 | tail -1
host:
  stage: test
  script:
    - touch "$HOST_MARK"
`})
	var logs bytes.Buffer
	mark := filepath.Join(t.TempDir(), "ran-on-the-host")
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Variables: []pipelines.PipelineVariable{{Key: "HOST_MARK", Value: mark}}})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	out := logs.String()
	if strings.Count(out, "hello from the httpd service") != 3 {
		t.Errorf("the services were not reached by their aliases:\n%s", out)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("the job without image did not run on this host: %v", err)
	}
	if l := left(t, "local/"+filepath.Base(dir)); l != "" {
		t.Errorf("the run left in the engine:\n%s", l)
	}
}

// TestCanceledContainerJobLeavesNothing: a run canceled while a job's
// script runs in a container leaves no container, network or volume.
func TestCanceledContainerJobLeavesNothing(t *testing.T) {
	needDocker(t)
	dir := uniqueDir(t, map[string]string{".gitlab-ci.yml": `
slow:
  image: ` + debianImage + `
  services:
    - name: ` + httpdImage + `
      alias: web
  script:
    - echo the-script-runs
    - sleep 300
`})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &watchBuffer{}
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Options{Dir: dir, Logs: logs})
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(logs.String(), "the-script-runs") {
		if time.Now().After(deadline) {
			t.Fatalf("the job never started:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	project := "local/" + filepath.Base(dir)
	if l := left(t, project); !strings.Contains(l, "container") || !strings.Contains(l, "network") {
		t.Fatalf("while the job runs the engine has %q: want its containers and network", l)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return after cancel")
	}
	if l := left(t, project); l != "" {
		t.Errorf("the canceled run left in the engine:\n%s", l)
	}
}

type watchBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *watchBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *watchBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// A checkout one job's image user made (uid 1000) is fetched into by the
// next job's root: git calls that "dubious ownership" and refuses, unless
// the project directory is marked safe, which Berth does in containers as
// gitlab-runner's safe_directory_checkout does; a shell job on this host
// leaves the host's git configuration alone.
func TestSafeDirectoryCheckout(t *testing.T) {
	needDocker(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	dir := uniqueDir(t, map[string]string{".gitlab-ci.yml": `
stages: [one, two, three]
variables:
  GIT_STRATEGY: fetch
first:
  stage: one
  image:
    name: ` + debianImage + `
    docker:
      user: "1000"
  script: [id -u]
second:
  stage: two
  image: ` + debianImage + `
  script: [git log --oneline -1]
host:
  stage: three
  script: [git log --oneline -1]
`})
	var logs bytes.Buffer
	res, err := Run(t.Context(), Options{Dir: dir, Logs: &logs, Concurrency: 1})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() || strings.Contains(logs.String(), "dubious ownership") {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	if b, err := os.ReadFile(filepath.Join(home, ".gitconfig")); err == nil && strings.Contains(string(b), "safe") {
		t.Errorf("a shell job changed this host's git configuration:\n%s", b)
	}
}
