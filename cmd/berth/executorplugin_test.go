package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// TestBuiltinExecutorAsPlugin: executor = "plugin" with [runners.plugin]
// name = "shell" and no berth-executor-shell program runs the built-in
// shell executor out of process (berth executor-plugin shell), and a
// pipeline runs on it through the real coordinator.
func TestBuiltinExecutorAsPlugin(t *testing.T) {
	testenv.LookPath(t, "git")
	testenv.LookPath(t, "bash")
	t.Setenv(plugin.DirEnv, t.TempDir())
	rc := &config.Runner{Name: "plugin-shell", Executor: plugin.Name, Plugin: &config.Plugin{Name: "shell"}}
	p, err := newProvider(t.Context(), slog.New(slog.DiscardHandler))(rc)
	if err != nil {
		t.Fatal(err)
	}
	pp := p.(*plugin.Provider)
	defer pp.Shutdown(t.Context())
	var info runnerapi.Info
	pp.Describe(&info)
	if info.Executor != "shell" || !info.Features.Shared {
		t.Fatalf("describe: %+v", info)
	}
	base := t.TempDir()
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte("hello:\n  script:\n    - 'echo \"pid of my executor: $PPID\"'\n"), 0o644)
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: plugin.Name,
		ConfigureRunner: func(r *config.Runner) {
			r.BuildsDir, r.CacheDir, r.Plugin = filepath.Join(base, "b"), filepath.Join(base, "c"), rc.Plugin
		}})
	if err != nil || !res.Succeeded() {
		t.Fatalf("%v %+v\n%s", err, res, logs.String())
	}
	if pid := os.Getpid(); strings.Contains(logs.String(), "pid of my executor: "+strconv.Itoa(pid)+"\n") {
		t.Fatalf("the job ran in the runner's own process (%d), not in the plugin:\n%s", pid, logs.String())
	}
	if !strings.Contains(logs.String(), "pid of my executor: "+strconv.Itoa(pp.Pid())) {
		t.Fatalf("the job's shell is not a child of the plugin process %d:\n%s", pp.Pid(), logs.String())
	}
}

func TestExecutorPluginCommandByHand(t *testing.T) {
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs([]string{"executor-plugin", "shell"})
	t.Setenv("BERTH_EXECUTOR_PLUGIN", "")
	err := root.Execute()
	if err == nil || !strings.Contains(errb.String(), "runner manager starts it") {
		t.Fatalf("by hand: %v, stderr %q; want a refusal that says who starts it", err, errb.String())
	}
	if _, err := runCLI(t, "executor-plugin", "nosuch"); err == nil || !strings.Contains(err.Error(), "no built-in executor") {
		t.Fatalf("unknown executor: %v", err)
	}
	out.Reset()
	root = newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"executor-plugin", "shell", "version"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "executor protocol 1") {
		t.Fatalf("version: %v %q", err, out.String())
	}
}

func TestDecodeSectionForBuiltinPlugins(t *testing.T) {
	var d config.Docker
	if err := decodeSection([]byte(`{"image":"busybox","pull_policy":["never"],"tmpfs":{"/tmp":"rw"},"wait_for_services_timeout":5}`), "docker", &d); err != nil {
		t.Fatal(err)
	}
	if d.Image != "busybox" || len(d.PullPolicy) != 1 || d.PullPolicy[0] != "never" || d.Tmpfs["/tmp"] != "rw" || d.WaitForServicesTimeout != 5 {
		t.Fatalf("%+v", d)
	}
	if err := decodeSection([]byte(`{"imgae":"busybox"}`), "docker", &d); err == nil || !strings.Contains(err.Error(), "imgae") {
		t.Fatalf("misspelt key: %v", err)
	}
	var s config.SSH
	if err := decodeSection([]byte(`{"host":"h","port":"22","disable_strict_host_key_checking":true}`), "ssh", &s); err != nil || s.Host != "h" || s.DisableStrictHostKeyChecking == nil || !*s.DisableStrictHostKeyChecking {
		t.Fatalf("%+v %v", s, err)
	}
	var none struct{}
	if err := decodeSection([]byte(`{"x":1}`), "shell", &none); err == nil {
		t.Fatal("the shell executor took a key it does not have")
	}
}

// TestBuiltinDockerAsPlugin: the docker executor out of process (berth
// executor-plugin docker) runs a job in its image through the coordinator.
func TestBuiltinDockerAsPlugin(t *testing.T) {
	testenv.LookPath(t, "git")
	testenv.DockerImage(t, "berth-test/debian:bookworm")
	host := testenv.DockerBridge(t)
	t.Setenv(plugin.DirEnv, t.TempDir())
	rc := &config.Runner{Name: "plugin-docker", Executor: plugin.Name, Plugin: &config.Plugin{Name: "docker",
		Config: map[string]any{"image": "berth-test/debian:bookworm", "pull_policy": []any{"never"}}}}
	p, err := newProvider(t.Context(), slog.New(slog.DiscardHandler))(rc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.(*plugin.Provider).Shutdown(t.Context())
	var info runnerapi.Info
	p.(*plugin.Provider).Describe(&info)
	if info.Executor != "docker" || !info.Features.Image || !info.Features.Services {
		t.Fatalf("describe: %+v", info)
	}
	base := t.TempDir()
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
build:
  script:
    - test -f /.dockerenv
    - mkdir out && echo from-a-container > out/x
  artifacts:
    paths: [out/]
check:
  needs: [build]
  script:
    - test "$(cat out/x)" = from-a-container
`), 0o644)
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: plugin.Name, ListenHost: host,
		ConfigureRunner: func(r *config.Runner) { r.Plugin = rc.Plugin }})
	if err != nil || !res.Succeeded() {
		t.Fatalf("%v %+v\n%s", err, res, logs.String())
	}
}

// TestBuiltinMicroVMAsPlugin: the microvm executor out of process (berth
// executor-plugin microvm, its nesting daemon inside the plugin) runs a
// job in a VM of its own through the coordinator, and offers the microvm
// isolation level across the plugin boundary.
func TestBuiltinMicroVMAsPlugin(t *testing.T) {
	needMicroVMs(t)
	testenv.DockerImage(t, "berth-test/busybox:latest")
	state, err := os.MkdirTemp("", "bp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	t.Setenv(plugin.DirEnv, t.TempDir())
	rc := &config.Runner{Name: "plugin-microvm", Executor: plugin.Name, Plugin: &config.Plugin{Name: "microvm",
		Config: map[string]any{"image": "berth-test/busybox:latest", "nesting_config": map[string]any{
			"accel": "tcg", "memory_mb": 256, "state_dir": state, "image_dir": filepath.Join(t.TempDir(), "images"), "agent": testenv.Berth(t)}}}}
	p, err := newProvider(t.Context(), slog.New(slog.DiscardHandler))(rc)
	if err != nil {
		t.Fatal(err)
	}
	pp := p.(*plugin.Provider)
	defer pp.Shutdown(t.Context())
	var info runnerapi.Info
	pp.Describe(&info)
	if info.Executor != "microvm" || !info.Features.Image {
		t.Fatalf("describe: %+v", info)
	}
	if levels := pp.IsolationLevels(); len(levels) != 1 || levels[0] != "microvm" {
		t.Fatalf("isolation levels across the plugin boundary: %v", levels)
	}
	base := t.TempDir()
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(`
in-a-vm:
  isolation: microvm
  variables: {GIT_STRATEGY: none}
  script:
    - echo "kernel args $(cat /proc/cmdline)"
`), 0o644)
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: plugin.Name,
		ConfigureRunner: func(r *config.Runner) { r.Plugin = rc.Plugin }})
	if err != nil || !res.Succeeded() {
		t.Fatalf("%v %+v\n%s", err, res, logs.String())
	}
	if !strings.Contains(logs.String(), "kernel args console=ttyS0") || !strings.Contains(logs.String(), "berth.hostname=nesting-") {
		t.Errorf("the job did not run in a VM:\n%s", logs.String())
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
		t.Errorf("VMs left: %v", ents)
	}
}
