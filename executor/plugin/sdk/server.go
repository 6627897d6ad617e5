package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/executor/plugin/internal/wire"
	"github.com/berthci/berth/runnerapi"
)

// server serves one executor.Provider as berth.executor.v1.Executor.
type server struct {
	pb.UnimplementedExecutorServer

	opts   Options
	logger *slog.Logger

	mu       sync.Mutex
	provider executor.Provider
	config   []byte // what the provider was built from
	execs    map[string]executor.Executor
	next     atomic.Uint64
}

func newServer(opts Options, logger *slog.Logger) *server {
	return &server{opts: opts, logger: logger, execs: map[string]executor.Executor{}}
}

// Describe implements pb.ExecutorServer: the first call builds the
// provider from the configuration; later calls with the same
// configuration describe it again, with another one fail.
func (s *server) Describe(ctx context.Context, req *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	cfg := req.GetConfig()
	if len(bytes.TrimSpace(cfg)) == 0 {
		cfg = []byte("{}")
	}
	s.mu.Lock()
	p := s.provider
	if p != nil && !bytes.Equal(s.config, cfg) {
		s.mu.Unlock()
		return &pb.DescribeResponse{Failure: wire.ToFailure(fmt.Errorf("%w: the plugin is already configured with another configuration", wire.ErrConfig))}, nil
	}
	s.mu.Unlock()
	if p == nil {
		var obj map[string]any
		if err := json.Unmarshal(cfg, &obj); err != nil {
			return &pb.DescribeResponse{Failure: wire.ToFailure(fmt.Errorf("%w: the configuration is not a JSON object: %v", wire.ErrConfig, err))}, nil
		}
		np, err := s.opts.New(ctx, Setup{Config: cfg, Logger: s.logger, HostVersion: req.GetHostVersion(), RunnerName: req.GetRunnerName(), Helper: req.GetHelper()})
		if err != nil {
			if !errors.Is(err, wire.ErrConfig) {
				err = fmt.Errorf("%w: %w", wire.ErrConfig, err)
			}
			return &pb.DescribeResponse{Failure: wire.ToFailure(err)}, nil
		}
		s.mu.Lock()
		if s.provider == nil {
			s.provider, s.config = np, cfg
		}
		p = s.provider
		s.mu.Unlock()
	}
	info := runnerapi.Info{Executor: s.opts.Name, Shell: "bash"}
	executor.RunnerFeatures(&info.Features)
	if d, ok := p.(executor.Describer); ok {
		d.Describe(&info)
	}
	levels := []string{string(executor.IsolationNone)}
	if iso, ok := p.(executor.Isolator); ok {
		levels = levels[:0]
		for _, l := range iso.IsolationLevels() {
			levels = append(levels, string(l))
		}
	}
	var caps []string
	if _, ok := p.(executor.Sweeper); ok {
		caps = append(caps, wire.CapabilitySweep)
	}
	versions := make([]int32, len(wire.ProtocolVersions))
	for i, v := range wire.ProtocolVersions {
		versions[i] = int32(v)
	}
	return &pb.DescribeResponse{
		Name: s.opts.Name, Version: s.opts.Version, ProtocolVersions: versions,
		Executor: info.Executor, Shell: info.Shell, Features: wire.FeaturesToMap(info.Features),
		IsolationLevels: levels, Capabilities: caps,
	}, nil
}

// configured returns the provider, or a failure before Describe.
func (s *server) configured() (executor.Provider, *pb.Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.provider == nil {
		return nil, wire.ToFailure(errors.New("the plugin is not configured: Describe must come first"))
	}
	return s.provider, nil
}

func (s *server) lookup(id string) (executor.Executor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[id]
	if !ok {
		return nil, fmt.Errorf("executor %q: %w (unknown to this plugin process)", id, executor.ErrNotPrepared)
	}
	return e, nil
}

// Create implements pb.ExecutorServer.
func (s *server) Create(ctx context.Context, _ *pb.CreateRequest) (*pb.CreateResponse, error) {
	p, f := s.configured()
	if f != nil {
		return &pb.CreateResponse{Failure: f}, nil
	}
	e, err := p.Create(ctx)
	if err != nil {
		return &pb.CreateResponse{Failure: wire.ToFailure(err)}, nil
	}
	id := "e" + strconv.FormatUint(s.next.Add(1), 10)
	s.mu.Lock()
	s.execs[id] = e
	s.mu.Unlock()
	return &pb.CreateResponse{ExecutorId: id}, nil
}

// Prepare implements pb.ExecutorServer.
func (s *server) Prepare(req *pb.PrepareRequest, stream grpc.ServerStreamingServer[pb.PrepareEvent]) error {
	e, err := s.lookup(req.GetExecutorId())
	if err != nil {
		return stream.Send(&pb.PrepareEvent{Event: &pb.PrepareEvent_Failure{Failure: wire.ToFailure(err)}})
	}
	var job *runnerapi.JobResponse
	if len(req.GetJob()) > 0 {
		job = new(runnerapi.JobResponse)
		if err := json.Unmarshal(req.GetJob(), job); err != nil {
			return stream.Send(&pb.PrepareEvent{Event: &pb.PrepareEvent_Failure{Failure: wire.ToFailure(fmt.Errorf("decoding the job payload: %w", err))}})
		}
	}
	out := &eventWriter{send: func(p []byte) error {
		return stream.Send(&pb.PrepareEvent{Event: &pb.PrepareEvent_Output{Output: p}})
	}}
	env, err := e.Prepare(stream.Context(), executor.PrepareOptions{
		JobID: req.GetJobId(), ProjectPath: req.GetProjectPath(), ShortToken: req.GetShortToken(),
		ConcurrencyID: int(req.GetConcurrencyId()), BuildsDir: req.GetBuildsDir(), CacheDir: req.GetCacheDir(),
		Shell: req.GetShell(), Output: out, Job: job, SystemID: req.GetSystemId(),
		Isolation: executor.Isolation(req.GetIsolation()), ServerURL: req.GetServerUrl(),
	})
	out.close()
	if err != nil {
		return stream.Send(&pb.PrepareEvent{Event: &pb.PrepareEvent_Failure{Failure: wire.ToFailure(err)}})
	}
	return stream.Send(&pb.PrepareEvent{Event: &pb.PrepareEvent_Environment{Environment: wire.EnvironmentToPB(env)}})
}

// errHostGone cancels a stage whose host went away.
var errHostGone = errors.New("the runner manager went away")

// Run implements pb.ExecutorServer.
func (s *server) Run(stream grpc.BidiStreamingServer[pb.RunInput, pb.RunEvent]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Failure{Failure: wire.ToFailure(errors.New("protocol: the first message of Run must be start"))}})
	}
	e, err := s.lookup(start.GetExecutorId())
	if err != nil {
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Failure{Failure: wire.ToFailure(err)}})
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// The host cancels with a message; a host that goes away (the
	// stream's context ends or its input closes) cancels too.
	go func() {
		for {
			in, err := stream.Recv()
			if err != nil {
				cancel(errHostGone)
				return
			}
			if c := in.GetCancel(); c != nil {
				reason := c.GetReason()
				if reason == "" {
					reason = "no reason given"
				}
				cancel(fmt.Errorf("canceled by the runner: %s", reason))
			}
		}
	}()
	go func() {
		select {
		case <-stream.Context().Done():
			cancel(errHostGone)
		case <-ctx.Done():
		}
	}()
	out := &eventWriter{send: func(p []byte) error {
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Output{Output: p}})
	}}
	err = e.Run(ctx, executor.Command{Stage: start.GetStage(), Script: start.GetScript(), Output: out})
	out.close()
	var ee *executor.ExitError
	switch {
	case err == nil:
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Exit{Exit: &pb.Exit{Code: 0}}})
	case errors.As(err, &ee):
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Exit{Exit: &pb.Exit{Code: int32(ee.Code)}}})
	}
	return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Failure{Failure: wire.ToFailure(err)}})
}

// Cleanup implements pb.ExecutorServer.
func (s *server) Cleanup(ctx context.Context, req *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	s.mu.Lock()
	e, ok := s.execs[req.GetExecutorId()]
	s.mu.Unlock()
	if !ok {
		return &pb.CleanupResponse{}, nil
	}
	err := e.Cleanup(ctx)
	s.mu.Lock()
	delete(s.execs, req.GetExecutorId())
	s.mu.Unlock()
	return &pb.CleanupResponse{Failure: wire.ToFailure(err)}, nil
}

// Sweep implements pb.ExecutorServer.
func (s *server) Sweep(ctx context.Context, req *pb.SweepRequest) (*pb.SweepResponse, error) {
	p, f := s.configured()
	if f != nil {
		return &pb.SweepResponse{Failure: f}, nil
	}
	sw, ok := p.(executor.Sweeper)
	if !ok {
		return &pb.SweepResponse{}, nil
	}
	err := sw.Sweep(ctx, executor.SweepOptions{SystemID: req.GetSystemId(), ShortToken: req.GetShortToken()})
	return &pb.SweepResponse{Failure: wire.ToFailure(err)}, nil
}

// Shutdown implements pb.ExecutorServer: executors the host never cleaned
// up are cleaned now, then the provider shuts down.
func (s *server) Shutdown(ctx context.Context, _ *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	return &pb.ShutdownResponse{Failure: wire.ToFailure(s.shutdown(ctx))}, nil
}

func (s *server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	execs := s.execs
	s.execs = map[string]executor.Executor{}
	p := s.provider
	s.mu.Unlock()
	var errs []error
	for id, e := range execs {
		if err := e.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up executor %s: %w", id, err))
		}
	}
	if sd, ok := p.(executor.Shutdowner); ok {
		errs = append(errs, sd.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// eventWriter sends each Write as one output event. After close (or a
// failed send) writes are dropped: the stage's output goes nowhere once
// its stream is gone, and the executor must not block on it.
type eventWriter struct {
	mu     sync.Mutex
	send   func([]byte) error
	closed bool
}

var _ io.Writer = (*eventWriter)(nil)

func (w *eventWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || len(p) == 0 {
		return len(p), nil
	}
	// The message must own its bytes: the executor reuses p.
	if err := w.send(bytes.Clone(p)); err != nil {
		w.closed = true
	}
	return len(p), nil
}

func (w *eventWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
