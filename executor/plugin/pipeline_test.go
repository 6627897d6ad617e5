package plugin_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/executor/plugin"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/local"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// runPipeline runs ci through the embedded coordinator and a runner
// manager whose executor is p.
func runPipeline(t *testing.T, p *plugin.Provider, ci string) (*local.Result, string) {
	t.Helper()
	testenv.LookPath(t, "git")
	base := t.TempDir()
	project := filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	if err := os.WriteFile(filepath.Join(project, ".gitlab-ci.yml"), []byte(ci), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	res, err := local.Run(t.Context(), local.Options{Dir: project, Logs: &logs, Provider: p, ProviderName: plugin.Name,
		ConfigureRunner: func(rc *config.Runner) {
			rc.BuildsDir = filepath.Join(base, "builds")
			rc.CacheDir = filepath.Join(base, "cache")
			rc.Plugin = &config.Plugin{Name: "test"}
		}})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	return res, logs.String()
}

func job(res *local.Result, name string) local.JobResult {
	for _, j := range res.Jobs {
		if j.Name == name {
			return j
		}
	}
	return local.JobResult{}
}

// TestPipelineSurvivesPluginDeath: a job kills its own plugin process in
// the middle of its script. That job fails as a system failure; the
// runner stays healthy and the next job runs on a fresh plugin process.
func TestPipelineSurvivesPluginDeath(t *testing.T) {
	testenv.LookPath(t, "bash")
	exe, _ := os.Executable()
	o := opts(t, "shell", shellConfig(t.TempDir()))
	o.Helper = exe
	p := start(t, o)
	first := p.Pid()
	res, logs := runPipeline(t, p, `
stages: [one, two]
dies:
  stage: one
  script:
    - echo killing the plugin that runs me
    - kill -9 $PPID
    - sleep 30
next:
  stage: two
  when: always
  script:
    - echo on a fresh plugin
`)
	dies, next := job(res, "dies"), job(res, "next")
	if dies.Status != "failed" || dies.FailureReason != runnerapi.RunnerSystemFailure {
		t.Errorf("job dies: %s (%s), want failed with runner_system_failure\n%s", dies.Status, dies.FailureReason, logs)
	}
	if !strings.Contains(logs, "executor plugin process exited") {
		t.Errorf("the log does not say the plugin died:\n%s", logs)
	}
	if next.Status != "success" {
		t.Errorf("job next: %s, want success on the restarted plugin\n%s", next.Status, logs)
	}
	if p.Pid() == first || p.Restarts() < 1 {
		t.Errorf("plugin pid %d (first %d), restarts %d: the plugin was not restarted", p.Pid(), first, p.Restarts())
	}
}

// TestPipelineOnABrokenPlugin: with a plugin that speaks another protocol
// version every job fails with a clear reason, and the runner keeps taking
// jobs (both jobs are taken and reported).
func TestPipelineOnABrokenPlugin(t *testing.T) {
	p := start(t, opts(t, "v99", nil))
	res, logs := runPipeline(t, p, `
a:
  script: [echo never]
b:
  script: [echo never]
`)
	for _, name := range []string{"a", "b"} {
		j := job(res, name)
		if j.Status != "failed" || j.FailureReason != runnerapi.RunnerSystemFailure {
			t.Errorf("job %s: %s (%s), want failed with runner_system_failure", name, j.Status, j.FailureReason)
		}
	}
	if strings.Count(logs, "speaks executor protocol version 99") < 2 {
		t.Errorf("each job's log should name the protocol mismatch:\n%s", logs)
	}
}
