package plugin_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/berthci/berth/executor"
	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
)

// The Python plugin of examples/executor-plugin-python needs a python3
// with grpcio and grpc_tools (Debian: python3-grpcio, python3-grpc-tools);
// its stubs are generated from executor.proto for every test, as a user
// would.
const pythonPlugin = "../../examples/executor-plugin-python/berth_executor_python.py"

// The stubs are generated once per test binary.
var (
	stubsOnce sync.Once
	stubsDir  string
	stubsErr  error
)

func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import grpc, grpc_tools.protoc").Run() == nil {
			return path
		}
	}
	testenv.Missing(t, "no python3 with grpcio and grpc_tools (apt-get install python3-grpcio python3-grpc-tools)")
	return ""
}

// pythonOptions generates the stubs and returns Options that start the
// Python plugin with cfg.
func pythonOptions(t *testing.T, cfg map[string]any) plugin.Options {
	t.Helper()
	py := pythonWithGRPC(t)
	stubsOnce.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		protoDir := filepath.Join(filepath.Dir(self), "internal", "pb")
		dir, err := os.MkdirTemp("", "berth-python-stubs-")
		if err != nil {
			stubsErr = err
			return
		}
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
		out, err := exec.Command(py, "-m", "grpc_tools.protoc", "-I", protoDir, "--python_out="+dir, "--grpc_python_out="+dir, "executor.proto").CombinedOutput()
		if err != nil {
			stubsErr = fmt.Errorf("generating the Python stubs: %v\n%s", err, out)
		}
		stubsDir = dir
	})
	if stubsErr != nil {
		t.Fatal(stubsErr)
	}
	stubs := stubsDir
	script, err := filepath.Abs(pythonPlugin)
	if err != nil {
		t.Fatal(err)
	}
	return plugin.Options{
		Config: econfig.Plugin{Path: py, Args: []string{script}, Config: cfg, StartTimeout: 30},
		Env:    []string{"PYTHONPATH=" + stubs, "PYTHONDONTWRITEBYTECODE=1"},
	}
}

// TestPythonPluginConformance: the executor conformance suite against an
// executor written in Python.
func TestPythonPluginConformance(t *testing.T) {
	testenv.LookPath(t, "setsid")
	pythonWithGRPC(t)
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return start(t, pythonOptions(t, map[string]any{
				"builds_dir": filepath.Join(dir, "builds"), "cache_dir": filepath.Join(dir, "cache"),
				"kill_grace": 0.2, "helper": "/bin/true",
			}))
		},
	})
}

func TestPythonPluginRefusesUnknownKeys(t *testing.T) {
	_, err := plugin.New(t.Context(), pythonOptions(t, map[string]any{"bulds_dir": "/tmp"}))
	if err == nil || !strings.Contains(err.Error(), "bulds_dir") {
		t.Fatalf("New with a misspelt key: %v, want an error naming it", err)
	}
}

// TestPipelineOnPythonPlugin runs a pipeline through the real coordinator
// (embedded, Runner API, git over HTTP) with every job on the Python
// plugin: sources, artifacts and the cache go from one job to the next.
func TestPipelineOnPythonPlugin(t *testing.T) {
	testenv.LookPath(t, "git")
	base := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := pythonOptions(t, map[string]any{"helper": exe})
	p := start(t, o)
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, "input.txt"), []byte("from git\n"), 0o644)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
stages: [build, test]
build:
  stage: build
  script:
    - test "$(cat input.txt)" = "from git"
    - mkdir -p out cache
    - echo built-by-python-plugin > out/msg.txt
    - echo cached > cache/value.txt
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
    - test "$(cat out/msg.txt)" = built-by-python-plugin
    - test "$(cat cache/value.txt)" = cached
    - echo "ran on $CI_RUNNER_EXECUTABLE_ARCH"
`), 0o644)
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: plugin.Name,
		ConfigureRunner: func(rc *config.Runner) {
			rc.BuildsDir = filepath.Join(base, "builds")
			rc.CacheDir = filepath.Join(base, "cache")
			rc.Plugin = &o.Config
		}})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	if !res.Succeeded() {
		t.Fatalf("pipeline %s\n%s", res.Status, logs.String())
	}
	if n := strings.Count(logs.String(), "Using the Python executor plugin"); n != 2 {
		t.Errorf("%d jobs ran on the Python plugin, want 2:\n%s", n, logs.String())
	}
}
