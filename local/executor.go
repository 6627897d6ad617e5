package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/docker"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// byImage is the executor provider of berth run when a Docker engine is
// reachable: a job that names an image runs in it (docker), any other job
// on this machine (shell), as a developer expects of a local run; a job
// that asks for a microVM runs in one (vm, when the run has microVMs).
type byImage struct {
	shell, docker executor.Provider
	vm            executor.Provider // nil: no microVMs here
}

// Create implements executor.Provider.
func (p *byImage) Create(ctx context.Context) (executor.Executor, error) {
	return &pickExecutor{p: p}, nil
}

// Describe implements executor.Describer: the runner offers what both
// offer (images and services come from docker).
func (p *byImage) Describe(info *runnerapi.Info) {
	if d, ok := p.shell.(executor.Describer); ok {
		d.Describe(info)
	}
	if d, ok := p.docker.(executor.Describer); ok {
		shellInfo := *info
		d.Describe(info)
		info.Shell = shellInfo.Shell
	}
}

// IsolationLevels implements executor.Isolator: jobs without an image run
// in the shell, the others (and those that ask for containers) in
// containers.
func (p *byImage) IsolationLevels() []executor.Isolation {
	levels := []executor.Isolation{executor.IsolationNone, executor.IsolationContainer}
	if iso, ok := p.vm.(executor.Isolator); ok {
		levels = append(levels, iso.IsolationLevels()...)
	}
	return levels
}

// Sweep implements executor.Sweeper.
func (p *byImage) Sweep(ctx context.Context, o executor.SweepOptions) error {
	var errs []error
	for _, q := range []executor.Provider{p.shell, p.docker} {
		if s, ok := q.(executor.Sweeper); ok {
			errs = append(errs, s.Sweep(ctx, o))
		}
	}
	return errors.Join(errs...)
}

// Shutdown implements executor.Shutdowner. The microVM provider is the
// caller's (Options.MicroVM), and stays.
func (p *byImage) Shutdown(ctx context.Context) error {
	var errs []error
	for _, q := range []executor.Provider{p.shell, p.docker} {
		if s, ok := q.(executor.Shutdowner); ok {
			errs = append(errs, s.Shutdown(ctx))
		}
	}
	return errors.Join(errs...)
}

// pickExecutor becomes a shell or a docker executor at Prepare, when the
// job is known.
type pickExecutor struct {
	p     *byImage
	inner executor.Executor
}

func (e *pickExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	if e.inner != nil {
		return e.inner.Prepare(ctx, o) // the inner executor refuses a second Prepare
	}
	provider := e.p.shell
	switch {
	case e.p.vm != nil && o.Isolation.Rank() >= executor.IsolationMicroVM.Rank():
		provider = e.p.vm
	case o.Job != nil && o.Job.Image != nil && o.Job.Image.Name != "" || o.Isolation.Rank() >= executor.IsolationContainer.Rank():
		provider = e.p.docker
	}
	inner, err := provider.Create(ctx)
	if err != nil {
		return executor.Environment{}, err
	}
	e.inner = inner
	return inner.Prepare(ctx, o)
}

func (e *pickExecutor) Run(ctx context.Context, cmd executor.Command) error {
	if e.inner == nil {
		return executor.ErrNotPrepared
	}
	return e.inner.Run(ctx, cmd)
}

func (e *pickExecutor) Cleanup(ctx context.Context) error {
	if e.inner == nil {
		return nil
	}
	return e.inner.Cleanup(ctx)
}

// Snapshot implements executor.Snapshotter when the executor it became
// can save its environment (a microVM).
func (e *pickExecutor) Snapshot(ctx context.Context, o executor.SnapshotOptions, w io.Writer) error {
	sn, ok := e.inner.(executor.Snapshotter)
	if !ok {
		return executor.ErrNoSnapshots
	}
	return sn.Snapshot(ctx, o, w)
}

// Branch implements executor.Brancher when the executor it became can
// branch its environment (a microVM).
func (e *pickExecutor) Branch(ctx context.Context) (executor.Branch, error) {
	br, ok := e.inner.(executor.Brancher)
	if !ok {
		return nil, executor.ErrNoBranching
	}
	return br.Branch(ctx)
}

// CanBranch implements executor.BranchDecider: a job it runs in a
// microVM can be branched.
func (e *pickExecutor) CanBranch(_ *runnerapi.JobResponse, isolation executor.Isolation) bool {
	return e.p.vm != nil && isolation.Rank() >= executor.IsolationMicroVM.Rank()
}

// executors is what berth run runs jobs with.
type executors struct {
	provider executor.Provider
	// name is the runner's executor (docker when containers are used).
	name string
	// listenHost is where the embedded coordinator listens: loopback, or
	// this host's address on Docker's bridge when jobs run in containers.
	listenHost string
	// close releases the executors; with the runner's identity it also
	// removes what the run's one-off runner kept for later jobs (docker
	// build and cache volumes).
	close func(executor.SweepOptions)
}

// newExecutors picks the executors of a run (see Options.Executor).
func newExecutors(ctx context.Context, o Options, log *slog.Logger) (*executors, error) {
	sh := shell.New(shell.Config{Logger: log})
	if o.Executor == "shell" {
		return &executors{provider: &imageIgnored{Provider: sh, why: "--executor shell", out: o.Warnings}, name: shell.Name,
			listenHost: "127.0.0.1", close: func(executor.SweepOptions) {}}, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Local images only: a developer's run does not pull what is there.
	dcfg := config.Docker{Image: o.DockerImage, PullPolicy: config.StringList{config.PullIfNotPresent}}
	dp, err := docker.New(dctx, docker.Options{Config: dcfg, Logger: log})
	if err != nil {
		if o.Executor == "docker" {
			return nil, fmt.Errorf("--executor docker: %w", err)
		}
		return &executors{provider: &imageIgnored{Provider: sh, why: "no Docker engine is reachable (" + err.Error() + ")", out: o.Warnings},
			name: shell.Name, listenHost: "127.0.0.1", close: func(executor.SweepOptions) {}}, nil
	}
	host, err := dp.HostAddress(ctx)
	if err != nil {
		dp.Shutdown(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("finding this host's address for containers: %w", err)
	}
	var p executor.Provider = dp
	if o.Executor == "" {
		p = &byImage{shell: sh, docker: dp, vm: o.MicroVM}
	}
	return &executors{provider: p, name: docker.Name, listenHost: host, close: func(runner executor.SweepOptions) {
		bg := context.WithoutCancel(ctx)
		if err := dp.RemoveVolumes(bg, runner); err != nil {
			log.Warn("removing the run's docker volumes", "err", err)
		}
		dp.Shutdown(bg)
	}}, nil
}

// imageIgnored is the shell executor of a run whose jobs' images cannot be
// honoured: each such job's log says so, and the run says it once.
type imageIgnored struct {
	executor.Provider
	why  string
	out  io.Writer
	once sync.Once
}

func (p *imageIgnored) Create(ctx context.Context) (executor.Executor, error) {
	e, err := p.Provider.Create(ctx)
	return &imageIgnoredExecutor{Executor: e, p: p}, err
}

type imageIgnoredExecutor struct {
	executor.Executor
	p *imageIgnored
}

func (e *imageIgnoredExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	if o.Job != nil && o.Job.Image != nil && o.Job.Image.Name != "" {
		msg := fmt.Sprintf("image %s ignored: %s; the job runs in the shell on this machine", o.Job.Image.Name, e.p.why)
		if o.Output != nil {
			fmt.Fprintf(o.Output, "WARNING: %s\n", msg)
		}
		e.p.once.Do(func() {
			fmt.Fprintf(e.p.out, "berth run: jobs with image: run in the shell: %s\n", e.p.why)
		})
	}
	return e.Executor.Prepare(ctx, o)
}
