package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/executor/plugin/internal/wire"
)

// Executor is one job's executor inside the plugin process. It keeps the
// lifecycle of package executor on the host side too, so misuse is
// refused before it reaches the plugin, and an executor whose plugin
// process died answers with ErrPluginExited instead of reaching the new
// process.
type Executor struct {
	p  *Provider
	g  *generation
	id string

	mu    sync.Mutex
	state state
}

type state int

const (
	created state = iota
	prepared
	failed
	cleaned
)

func (s state) String() string {
	return [...]string{"created", "prepared", "failed", "cleaned"}[s]
}

var _ executor.Executor = (*Executor)(nil)

// Prepare implements executor.Executor.
func (e *Executor) Prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	if e.state != created {
		st := e.state
		e.mu.Unlock()
		return executor.Environment{}, fmt.Errorf("prepare: executor already %s", st)
	}
	e.state = failed // until it succeeds
	e.mu.Unlock()
	env, err := e.prepare(ctx, opts)
	if err != nil {
		return executor.Environment{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != failed { // cleaned meanwhile
		return executor.Environment{}, fmt.Errorf("prepare: executor %s meanwhile", e.state)
	}
	e.state = prepared
	e.p.remember(executor.SweepOptions{SystemID: opts.SystemID, ShortToken: opts.ShortToken})
	return env, nil
}

func (e *Executor) prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, fmt.Errorf("preparing: %w", err)
	}
	var job []byte
	if opts.Job != nil {
		var err error
		if job, err = json.Marshal(opts.Job); err != nil {
			return executor.Environment{}, fmt.Errorf("preparing: encoding the job payload: %w", err)
		}
	}
	if !e.g.alive() {
		return executor.Environment{}, fmt.Errorf("preparing: %w", ErrPluginExited)
	}
	stream, err := e.g.rpc.Prepare(ctx, &pb.PrepareRequest{
		ExecutorId: e.id, JobId: opts.JobID, ProjectPath: opts.ProjectPath, ShortToken: opts.ShortToken,
		ConcurrencyId: int32(opts.ConcurrencyID), BuildsDir: opts.BuildsDir, CacheDir: opts.CacheDir,
		Shell: opts.Shell, SystemId: opts.SystemID, Job: job, Isolation: string(opts.Isolation),
		ServerUrl: opts.ServerURL,
	})
	if err != nil {
		return executor.Environment{}, e.transportError(ctx, "preparing", err)
	}
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the plugin ended Prepare without an environment or a failure")
			}
			return executor.Environment{}, e.transportError(ctx, "preparing", err)
		}
		switch x := ev.GetEvent().(type) {
		case *pb.PrepareEvent_Output:
			_, _ = out.Write(x.Output)
		case *pb.PrepareEvent_Environment:
			env, err := wire.EnvironmentFromPB(x.Environment)
			if err != nil {
				return executor.Environment{}, fmt.Errorf("preparing: %w", err)
			}
			return env, nil
		case *pb.PrepareEvent_Failure:
			if ctx.Err() != nil {
				return executor.Environment{}, fmt.Errorf("preparing: %w: %w", ctx.Err(), wire.FromFailure(x.Failure))
			}
			return executor.Environment{}, fmt.Errorf("preparing: %w", wire.FromFailure(x.Failure))
		default:
			return executor.Environment{}, fmt.Errorf("preparing: the plugin sent an unknown event %T", x)
		}
	}
}

// transportError explains a failed call: the caller's context, or the
// process that died under it.
func (e *Executor) transportError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	return fmt.Errorf("%s: executor plugin %s: %w", op, e.p.name, e.p.callError(e.g, err))
}

// Run implements executor.Executor. When ctx is done the plugin is asked to
// stop the stage and Run returns once the plugin says the stage's process
// tree is gone (or after Options.CancelWait, if it never says so).
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	st := e.state
	e.mu.Unlock()
	if st != prepared {
		return fmt.Errorf("stage %s: %w (executor %s)", cmd.Stage, executor.ErrNotPrepared, st)
	}
	if !e.g.alive() {
		return fmt.Errorf("stage %s: %w", cmd.Stage, ErrPluginExited)
	}
	if err := ctx.Err(); err != nil {
		return stopped(ctx, cmd.Stage)
	}
	out := cmd.Output
	if out == nil {
		out = io.Discard
	}
	// The stream has its own context: a canceled stage is stopped by a
	// message, so that the plugin can say when its process tree is gone.
	sctx, cancelStream := context.WithCancel(context.Background())
	defer cancelStream()
	stream, err := e.g.rpc.Run(sctx)
	if err != nil {
		return fmt.Errorf("stage %s: executor plugin %s: %w", cmd.Stage, e.p.name, e.p.callError(e.g, err))
	}
	if err := stream.Send(&pb.RunInput{Input: &pb.RunInput_Start{Start: &pb.RunStart{ExecutorId: e.id, Stage: cmd.Stage, Script: cmd.Script}}}); err != nil {
		return fmt.Errorf("stage %s: executor plugin %s: %w", cmd.Stage, e.p.name, e.p.callError(e.g, err))
	}
	ended := make(chan struct{})
	defer close(ended)
	gaveUp := make(chan struct{})
	go func() {
		select {
		case <-ended:
			return
		case <-ctx.Done():
		}
		reason := "canceled"
		if c := context.Cause(ctx); c != nil {
			reason = c.Error()
		}
		_ = stream.Send(&pb.RunInput{Input: &pb.RunInput_Cancel{Cancel: &pb.RunCancel{Reason: reason}}})
		t := time.NewTimer(e.p.opts.CancelWait)
		defer t.Stop()
		select {
		case <-ended:
		case <-t.C:
			close(gaveUp)
			cancelStream()
		}
	}()
	for {
		ev, err := stream.Recv()
		if err != nil {
			select {
			case <-gaveUp:
				return fmt.Errorf("stage %s: executor plugin %s did not stop the stage within %s of the cancel: %w", cmd.Stage, e.p.name, e.p.opts.CancelWait, stopped(ctx, cmd.Stage))
			default:
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("the plugin ended the stage without an exit status or a failure")
			}
			return fmt.Errorf("stage %s: executor plugin %s: %w", cmd.Stage, e.p.name, e.p.callError(e.g, err))
		}
		switch x := ev.GetEvent().(type) {
		case *pb.RunEvent_Output:
			_, _ = out.Write(x.Output)
		case *pb.RunEvent_Exit:
			if ctx.Err() != nil {
				return stopped(ctx, cmd.Stage)
			}
			if x.Exit.GetCode() == 0 {
				return nil
			}
			return &executor.ExitError{Stage: cmd.Stage, Code: int(x.Exit.GetCode())}
		case *pb.RunEvent_Failure:
			if ctx.Err() != nil {
				return stopped(ctx, cmd.Stage)
			}
			return fmt.Errorf("stage %s: %w", cmd.Stage, wire.FromFailure(x.Failure))
		default:
			return fmt.Errorf("stage %s: the plugin sent an unknown event %T", cmd.Stage, x)
		}
	}
}

// stopped is the error of a stage stopped because ctx is done: it wraps
// ctx's error and its cause, as the in-process executors' do.
func stopped(ctx context.Context, stage string) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("stage %s: stopped: %w: %w", stage, err, cause)
	}
	return fmt.Errorf("stage %s: stopped: %w", stage, err)
}

// Cleanup implements executor.Executor. An executor whose plugin process
// died has nothing left to clean in it: the restarted process sweeps.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	if e.state == cleaned {
		e.mu.Unlock()
		return nil
	}
	e.state = cleaned
	e.mu.Unlock()
	if !e.g.alive() {
		return nil
	}
	resp, err := e.g.rpc.Cleanup(ctx, &pb.CleanupRequest{ExecutorId: e.id})
	if err != nil {
		err = e.p.callError(e.g, err)
		if errors.Is(err, ErrPluginExited) {
			return nil
		}
		return fmt.Errorf("cleanup: executor plugin %s: %w", e.p.name, err)
	}
	if f := resp.GetFailure(); f != nil {
		return fmt.Errorf("cleanup: %w", wire.FromFailure(f))
	}
	return nil
}
