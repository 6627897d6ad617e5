package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// TestConformanceOutOfProcess runs the executor conformance suite against
// the shell executor served out of process through the SDK: the protocol
// carries everything the contract asks.
func TestConformanceOutOfProcess(t *testing.T) {
	testenv.LookPath(t, "bash")
	testenv.LookPath(t, "setsid")
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return start(t, opts(t, "shell", shellConfig(dir)))
		},
	})
}

func TestDescribeCarriesTheExecutorsDescription(t *testing.T) {
	p := start(t, opts(t, "shell", shellConfig(t.TempDir())))
	var info runnerapi.Info
	p.Describe(&info)
	if info.Executor != "shell" || !info.Features.Shared || !info.Features.Artifacts || info.Features.Image {
		t.Fatalf("info %+v: want the shell executor's name and features (shared, artifacts, no image)", info)
	}
	if got := p.IsolationLevels(); len(got) != 1 || got[0] != executor.IsolationNone {
		t.Fatalf("isolation levels %v, want [none]", got)
	}
}

func TestConfigRefusedAtStart(t *testing.T) {
	cfg := shellConfig(t.TempDir())
	cfg["no_such_key"] = true
	_, err := plugin.New(t.Context(), opts(t, "shell", cfg))
	if !errors.Is(err, plugin.ErrConfig) || !strings.Contains(err.Error(), "no_such_key") {
		t.Fatalf("New with an unknown key: %v, want ErrConfig naming the key", err)
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	pdir := filepath.Join(dir, "plugins")
	os.MkdirAll(bin, 0o755)
	os.MkdirAll(pdir, 0o755)
	os.WriteFile(filepath.Join(bin, "berth-executor-inpath"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(pdir, "berth-executor-indir"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(pdir, "berth-executor-notexec"), []byte("#!/bin/sh\n"), 0o644)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	builtin := func(name string) (plugin.Command, bool) {
		if name == "shell" {
			return plugin.Command{Path: "/usr/bin/berth", Args: []string{"executor-plugin", "shell"}}, true
		}
		return plugin.Command{}, false
	}
	for _, tc := range []struct {
		name, path string
		want       string
		wantArgs   []string
		err        bool
	}{
		{name: "inpath", want: filepath.Join(bin, "berth-executor-inpath")},
		{name: "indir", want: filepath.Join(pdir, "berth-executor-indir")},
		{name: "shell", want: "/usr/bin/berth", wantArgs: []string{"executor-plugin", "shell", "x"}},
		{name: "notexec", err: true},
		{name: "missing", err: true},
		{name: "../escape", err: true},
		{path: filepath.Join(pdir, "berth-executor-indir"), want: filepath.Join(pdir, "berth-executor-indir")},
		{path: filepath.Join(pdir, "nothing"), err: true},
		{path: pdir, err: true},
	} {
		c, err := plugin.Resolve(tc.name, tc.path, []string{"x"}, pdir, builtin)
		if tc.err {
			if !errors.Is(err, plugin.ErrPluginNotFound) {
				t.Errorf("Resolve(%q, %q) = %+v, %v; want ErrPluginNotFound", tc.name, tc.path, c, err)
			}
			continue
		}
		if err != nil || c.Path != tc.want {
			t.Errorf("Resolve(%q, %q) = %+v, %v; want %s", tc.name, tc.path, c, err, tc.want)
		}
		if tc.wantArgs != nil && strings.Join(c.Args, " ") != strings.Join(tc.wantArgs, " ") {
			t.Errorf("Resolve(%q) args %v, want %v", tc.name, c.Args, tc.wantArgs)
		}
	}
}

func prepare(t *testing.T, p executor.Provider, o executor.PrepareOptions) (executor.Executor, error) {
	t.Helper()
	e, err := p.Create(t.Context())
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { e.Cleanup(context.Background()) })
	_, err = e.Prepare(t.Context(), o)
	return e, err
}

// TestPluginKilledMidStage kills the plugin process under a running stage:
// the stage fails as a system failure naming the dead plugin, what the
// stage started is swept by the restarted process, and the next job runs
// on the new process.
func TestPluginKilledMidStage(t *testing.T) {
	testenv.LookPath(t, "bash")
	p := start(t, opts(t, "shell", shellConfig(t.TempDir())))
	o := executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "killtest1", SystemID: "s_killtest", JobID: 1}
	e, err := prepare(t, p, o)
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- e.Run(context.Background(), executor.Command{Stage: "step_script", Script: "sleep 1000 & echo pid:$!; echo started; wait", Output: &out})
	}()
	waitFor(t, "the stage to start", func() bool { return strings.Contains(out.String(), "started") })
	var orphan int
	for _, f := range strings.Fields(out.String()) {
		if n, ok := strings.CutPrefix(f, "pid:"); ok {
			orphan = atoi(n)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the plugin died")
	}
	var ee *executor.ExitError
	if runErr == nil || errors.As(runErr, &ee) || !errors.Is(runErr, plugin.ErrPluginExited) {
		t.Fatalf("Run under a killed plugin: %v; want a system failure wrapping ErrPluginExited", runErr)
	}
	// The executor of the dead process refuses further stages, and its
	// cleanup does not fail the job.
	if err := e.Run(t.Context(), executor.Command{Stage: "after_script", Script: "true"}); !errors.Is(err, plugin.ErrPluginExited) {
		t.Fatalf("Run on an executor of the dead process: %v", err)
	}
	if err := e.Cleanup(t.Context()); err != nil {
		t.Fatalf("Cleanup of an executor of the dead process: %v", err)
	}
	waitFor(t, "the plugin to restart", func() bool { return p.Pid() != 0 && p.Pid() != pid })
	waitFor(t, "the orphaned stage process to be swept", func() bool { return !alive(orphan) })
	e2, err := prepare(t, p, o)
	if err != nil {
		t.Fatalf("next job on the restarted plugin: %v", err)
	}
	var out2 testenv.SyncBuffer
	if err := e2.Run(t.Context(), executor.Command{Stage: "step_script", Script: "echo fresh", Output: &out2}); err != nil || !strings.Contains(out2.String(), "fresh") {
		t.Fatalf("next job on the restarted plugin: %v %q", err, out2.String())
	}
	if p.Restarts() < 1 {
		t.Fatalf("Restarts() = %d", p.Restarts())
	}
}

func TestWrongProtocolVersion(t *testing.T) {
	p := start(t, opts(t, "v99", nil))
	_, err := p.Create(t.Context())
	if !errors.Is(err, plugin.ErrProtocolVersion) || !strings.Contains(err.Error(), "version 99") || !strings.Contains(err.Error(), "[1]") {
		t.Fatalf("Create on a version-99 plugin: %v; want ErrProtocolVersion naming both versions", err)
	}
}

func TestPluginThatNeverHandshakes(t *testing.T) {
	o := opts(t, "silent", nil)
	o.Config.StartTimeout = 1
	began := time.Now()
	p := start(t, o)
	_, err := p.Create(t.Context())
	if !errors.Is(err, plugin.ErrStartTimeout) || !strings.Contains(err.Error(), "not a plugin, just sleeping") {
		t.Fatalf("Create on a plugin that never handshakes: %v; want ErrStartTimeout with the plugin's stderr", err)
	}
	if time.Since(began) > 20*time.Second {
		t.Fatalf("the failure took %s; start_timeout is 1 s", time.Since(began))
	}
}

func TestPluginThatNeverAnswers(t *testing.T) {
	o := opts(t, "hang", nil)
	o.CallTimeout = 300 * time.Millisecond
	p := start(t, o)
	pid := p.Pid()
	_, err := p.Create(t.Context())
	if !errors.Is(err, plugin.ErrNoAnswer) {
		t.Fatalf("Create on a plugin that never answers: %v; want ErrNoAnswer", err)
	}
	waitFor(t, "the hung plugin to be replaced", func() bool { return !alive(pid) && p.Pid() != 0 })
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}
