package runner

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// flakyStages is a provider whose executors fail the first run of one
// stage, as a network blip fails a clone or a download.
type flakyStages struct {
	executor.Provider
	stage string
	// system: the first run fails as a system failure, not an exit code.
	system bool
	runs   atomic.Int32
}

func (p *flakyStages) Create(ctx context.Context) (executor.Executor, error) {
	e, err := p.Provider.Create(ctx)
	return &flakyExecutor{Executor: e, p: p}, err
}

type flakyExecutor struct {
	executor.Executor
	p *flakyStages
}

// Prepare makes the environment a remote one: every stage, file stages
// included, goes through Run, where it is counted and failed.
func (e *flakyExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	env, err := e.Executor.Prepare(ctx, o)
	env.Local = false
	return env, err
}

func (e *flakyExecutor) Run(ctx context.Context, cmd executor.Command) error {
	if cmd.Stage == e.p.stage && e.p.runs.Add(1) == 1 {
		if e.p.system {
			return errors.New("the environment lost its network")
		}
		return &executor.ExitError{Stage: cmd.Stage, Code: 1}
	}
	if cmd.Stage == e.p.stage {
		return nil // the dependency's artifact "arrived"
	}
	return e.Executor.Run(ctx, cmd)
}

func TestStageAttemptsRetryAFailedDownload(t *testing.T) {
	for _, tc := range []struct {
		name, attempts, want string
		system               bool
		runs                 int32
	}{
		{"GitLab's default: one attempt", "", "failed", false, 1},
		{"ARTIFACT_DOWNLOAD_ATTEMPTS=2", "2", "success", false, 2},
		{"a system failure is retried too", "2", "success", true, 2},
		{"out of range is 1", "11", "failed", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			job := fakeJob(40, "echo script ran")
			job.Dependencies = []runnerapi.Dependency{{ID: 39, Token: job.Token, Name: "build", ArtifactsFile: &runnerapi.ArtifactsFile{Filename: "artifacts.zip", Size: 10}}}
			if tc.attempts != "" {
				job.Variables = append(job.Variables, runnerapi.Variable{Key: "ARTIFACT_DOWNLOAD_ATTEMPTS", Value: tc.attempts})
			}
			p := &flakyStages{stage: executor.StageDownloadArtifacts, system: tc.system}
			_, finals := runOne(t, f, job, func(_ *config.Config, o *Options) {
				o.NewProvider = func(*config.Runner) (executor.Provider, error) {
					p.Provider = shell.New(shell.Config{Helper: helperBinary(t), KillGrace: 500 * time.Millisecond})
					return p, nil
				}
			})
			final := lastFinal(t, finals)
			if final.State != tc.want || p.runs.Load() != tc.runs {
				t.Fatalf("final %s after %d runs of download_artifacts, want %s after %d\n%s", final.State, p.runs.Load(), tc.want, tc.runs, f.trace(40))
			}
			if tc.want == "success" && !strings.Contains(f.trace(40), "retrying, attempt 2 of 2") {
				t.Errorf("the log does not say it retried:\n%s", f.trace(40))
			}
		})
	}
}
