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
	p, err := newProvider(slog.New(slog.DiscardHandler))(rc)
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
