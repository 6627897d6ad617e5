package custom

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// exampleImage is the default image of the example driver, built by
// .ci/images.
const exampleImage = "berth-test/debian:bookworm"

// binDir holds what TestMain builds for the tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "custom-executor-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	berthOnce sync.Once
	berthBin  string
	berthErr  error
)

// berthBinary builds the berth binary once, for the jobs that run it as
// their helper inside the driver's containers.
func berthBinary(t *testing.T) string {
	t.Helper()
	berthOnce.Do(func() {
		bin := filepath.Join(binDir, "berth")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/berth")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			berthErr = fmt.Errorf("go build ./cmd/berth: %w\n%s", err, out)
			return
		}
		berthBin = bin
	})
	if berthErr != nil {
		t.Fatal(berthErr)
	}
	return berthBin
}

// needDocker skips (fails with BERTH_REQUIRE_DEPS=1) without a Docker
// daemon and the example's image.
func needDocker(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "docker")
	testenv.LookPath(t, "go")
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		testenv.Missing(t, "docker daemon not reachable: %v: %s", err, out)
	}
	if err := exec.Command("docker", "image", "inspect", exampleImage).Run(); err != nil {
		testenv.Missing(t, "image %s is missing (build it with .ci/images)", exampleImage)
	}
}

// exampleProvider is a provider running the shipped driver with its builds and
// cache under base.
func exampleProvider(t *testing.T, base string) *Provider {
	t.Helper()
	drv, err := filepath.Abs(filepath.Join("..", "..", "examples", "custom-executor"))
	if err != nil {
		t.Fatal(err)
	}
	graceful, force := 30, 10
	p, err := New(Options{
		Config: config.Custom{
			ConfigExec: filepath.Join(drv, "config.sh"), PrepareExec: filepath.Join(drv, "prepare.sh"),
			RunExec: filepath.Join(drv, "run.sh"), CleanupExec: filepath.Join(drv, "cleanup.sh"),
			GracefulKillTimeout: &graceful, ForceKillTimeout: &force,
		},
		Helper: berthBinary(t),
		Env: []string{
			"BERTH_CUSTOM_DOCKER_DIR=" + base,
			"BERTH_CUSTOM_DOCKER_PULL=never",
			"BERTH_CUSTOM_DOCKER_STOP_TIMEOUT=2",
		},
		PrepareRetryDelay: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// containers lists the containers the driver made for base (-a: also
// stopped ones).
func containers(t testing.TB, base string, all bool) []string {
	args := []string{"ps", "-q", "--filter", "label=com.berthci.custom-docker.dir=" + base}
	if all {
		args = append(args, "-a")
	}
	out, err := exec.Command("docker", args...).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(string(out))
}

// aliveInContainer is a process check inside a container: the pid exists
// and is no zombie.
const aliveInContainer = `s=$(cat /proc/$1/stat 2>/dev/null) || exit 1
s=${s##*) }
case $s in Z*) exit 1 ;; esac`

func TestExampleDriver(t *testing.T) {
	needDocker(t)
	berthBinary(t)

	t.Run("Conformance", func(t *testing.T) {
		var mu sync.Mutex
		var bases []string
		executortest.Run(t, executortest.Config{
			NewProvider: func(t *testing.T, dir string) executor.Provider {
				mu.Lock()
				bases = append(bases, dir)
				mu.Unlock()
				return exampleProvider(t, dir)
			},
			// Scripts print pids of the container's namespace: look
			// there. The builds and cache directories are bind-mounted
			// at the same paths, so files are checked on the host.
			ProcessAlive: func(pid int) bool {
				mu.Lock()
				base := bases[len(bases)-1]
				mu.Unlock()
				for _, id := range containers(t, base, false) {
					if exec.Command("docker", "exec", id, "sh", "-c", aliveInContainer, "alive", strconv.Itoa(pid)).Run() == nil {
						return true
					}
				}
				return false
			},
			Job: func() *runnerapi.JobResponse {
				return &runnerapi.JobResponse{Image: &runnerapi.Image{Name: exampleImage}}
			},
		})
		for _, b := range bases {
			if c := containers(t, b, true); len(c) > 0 {
				t.Errorf("containers left behind for %s: %v", b, c)
			}
		}
	})

	t.Run("ImageHelperAndCache", func(t *testing.T) {
		base := t.TempDir()
		p := exampleProvider(t, base)
		for _, tc := range []struct {
			image, want string
		}{
			{"", "debian"},
			{"berth-test/busybox:latest", "busybox"},
		} {
			e, _ := p.Create(context.Background())
			o := opts(nil)
			var out testenv.SyncBuffer
			o.Output = &out
			o.Job = &runnerapi.JobResponse{ID: 77}
			if tc.image != "" {
				o.Job.Image = &runnerapi.Image{Name: tc.image}
			}
			env, err := e.Prepare(context.Background(), o)
			if err != nil {
				t.Fatalf("%s: Prepare: %v\n%s", tc.image, err, out.String())
			}
			if !strings.Contains(out.String(), "Using Custom executor with driver berth-docker-example 1.0.0...") {
				t.Errorf("job log %q", out.String())
			}
			name := "berth-custom-abcdefghi-job-77"
			if env.Hostname != name {
				t.Errorf("hostname %q, want the container's name %s", env.Hostname, name)
			}
			labels, err := exec.Command("docker", "inspect", "--format", `{{index .Config.Labels "com.berthci.custom-docker.job-id"}} {{index .Config.Labels "com.berthci.custom-docker.runner"}}`, name).Output()
			if err != nil || strings.TrimSpace(string(labels)) != "77 abcdefghi" {
				t.Errorf("labels of %s: %q %v", name, labels, err)
			}
			script := `if test -e /etc/debian_version; then echo os=debian; else echo os=busybox; fi
echo cached >` + shq(env.CacheDir+"/group/project/from-job")
			if tc.want == "debian" {
				script += "\n" + shq(env.Helper) + " --version"
			}
			got, err := run(e, executor.StageStepScript, script)
			if err != nil || !strings.Contains(got, "os="+tc.want) {
				t.Errorf("%s: %v %q, want os=%s", tc.image, err, got, tc.want)
			}
			if tc.want == "debian" && !strings.Contains(got, "berth version") {
				t.Errorf("the helper does not run in the container: %q", got)
			}
			if b, err := os.ReadFile(filepath.Join(base, "cache", "group", "project", "from-job")); err != nil || string(b) != "cached\n" {
				t.Errorf("the cache directory is not shared with the host: %q %v", b, err)
			}
			if err := e.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if c := containers(t, base, true); len(c) > 0 {
			t.Errorf("containers left behind: %v", c)
		}
	})

	t.Run("BadImageIsTheJobsFault", func(t *testing.T) {
		base := t.TempDir()
		p := exampleProvider(t, base)
		for image, msg := range map[string]string{
			"berth-test/no-such-image:1": "image berth-test/no-such-image:1 is not present",
			"--privileged":               "image name '--privileged' is not valid",
		} {
			e, _ := p.Create(context.Background())
			o := opts(nil)
			var out testenv.SyncBuffer
			o.Output = &out
			o.Job = &runnerapi.JobResponse{Image: &runnerapi.Image{Name: image}}
			_, err := e.Prepare(context.Background(), o)
			var ee *executor.ExitError
			if !errors.As(err, &ee) || !strings.Contains(out.String(), msg) {
				t.Errorf("Prepare with image %s: %v, log %q; want a build failure saying %q", image, err, out.String(), msg)
			}
			if strings.Contains(out.String(), "Will be retried") {
				t.Errorf("image %s: a build failure was retried", image)
			}
			if err := e.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
			if c := containers(t, base, true); len(c) > 0 {
				t.Errorf("image %s: containers %v", image, c)
			}
		}
	})

	t.Run("CancelIsGraceful", func(t *testing.T) {
		base := t.TempDir()
		p := exampleProvider(t, base)
		e, _ := p.Create(context.Background())
		defer e.Cleanup(context.Background())
		env, err := e.Prepare(context.Background(), opts(nil))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var out testenv.SyncBuffer
		done := make(chan error, 1)
		// One process finishes its work on SIGTERM, one ignores it; the
		// stage's shell itself dies at once.
		script := `sh -c 'trap "sleep 1; echo finished > graceful.txt; exit 0" TERM; echo ready-1; while :; do sleep 0.2; done' &
sh -c 'trap "" TERM; echo ready-2; while :; do sleep 0.2; done' & echo "pid:$!"
wait`
		go func() {
			done <- e.Run(ctx, executor.Command{Stage: executor.StageStepScript, Script: script, Output: &out})
		}()
		waitFor(t, func() bool {
			return strings.Contains(out.String(), "ready-1") && strings.Contains(out.String(), "ready-2") && strings.Contains(out.String(), "pid:")
		})
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
		if !strings.Contains(out.String(), "stage build_script stopped") {
			t.Errorf("output %q: the driver did not stop the stage", out.String())
		}
		if b, err := os.ReadFile(filepath.Join(env.BuildDir, "graceful.txt")); err != nil || string(b) != "finished\n" {
			t.Errorf("the process handling SIGTERM did not get to finish: %q %v", b, err)
		}
		pid := strings.TrimSpace(strings.SplitN(strings.SplitN(out.String(), "pid:", 2)[1], "\n", 2)[0])
		if exec.Command("docker", "exec", "berth-custom-abcdefghi-job-77", "sh", "-c", aliveInContainer, "alive", pid).Run() == nil {
			t.Fatalf("process %s ignoring SIGTERM survives the canceled stage", pid)
		}
	})

	t.Run("ContainerGoneIsSystemFailure", func(t *testing.T) {
		base := t.TempDir()
		p := exampleProvider(t, base)
		e, _ := p.Create(context.Background())
		defer e.Cleanup(context.Background())
		o := opts(nil)
		if _, err := e.Prepare(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("docker", "rm", "-f", "berth-custom-abcdefghi-job-77").CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		out, err := run(e, executor.StageStepScript, "echo should-not-run")
		var ee *executor.ExitError
		if !errors.Is(err, ErrSystemFailure) || errors.As(err, &ee) || !strings.Contains(out, "did not run to its end") {
			t.Fatalf("Run without the container: %v %q", err, out)
		}
	})
}
