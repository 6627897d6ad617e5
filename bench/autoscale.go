package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/autoscaler"
	"github.com/berthci/berth/executor/instance"
	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
	"github.com/berthci/berth/taskscaler"
)

// AutoscaleOptions configure Autoscale.
type AutoscaleOptions struct {
	// Group is the instance group jobs run on (the local plugin); it is
	// owned by Autoscale from here on.
	Group fleeting.InstanceGroup
	// Dir is a scratch directory.
	Dir string
	// WarmJobs and ColdJobs are how many jobs each phase measures.
	WarmJobs, ColdJobs int
	// Progress receives a line per phase (nil: none).
	Progress io.Writer
	// Logger receives the components' logs (nil: discarded).
	Logger *slog.Logger
}

// AutoscaleResult are the figures of one phase: the time from a job's
// enqueue on the coordinator to its first script line running on an
// instance.
type AutoscaleResult struct {
	Phase string  `json:"phase"` // warm or cold
	Jobs  int     `json:"jobs"`
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Autoscale measures the autoscaled instance executor end to end: an
// embedded coordinator, a runner manager (production poll settings) and
// its autoscaler on opts.Group, the coordinator and the runner talking
// the Runner API over loopback. Each job's first script line writes the
// time; the figure is that time minus the moment the job was enqueued.
//
//   - warm: the policy keeps one idle slot (idle_count 1) on an instance
//     that already ran a job (the helper is there): what a job waits for
//     when capacity is ready.
//   - cold: no instance exists (idle_count 0, every instance gone before
//     each job): the instance is created, readied, the helper uploaded.
//
// Jobs skip the git checkout (GIT_STRATEGY none) so that the figure is
// the scheduling and the executor, not the repository.
func Autoscale(ctx context.Context, o AutoscaleOptions) ([]AutoscaleResult, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.WarmJobs <= 0 {
		o.WarmJobs = 20
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(o.Dir, "coordinator"), Listener: ln, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown(context.Background())
	adminTok, err := srv.EnsureAdminToken(ctx, "")
	if err != nil {
		return nil, err
	}
	created, err := client.New(srv.URL, adminTok).CreateRunner(ctx, restapi.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		return nil, err
	}
	x, err := instance.New(instance.Options{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	warm := []taskscaler.Policy{{IdleCount: 1, IdleTime: time.Hour}}
	p, err := autoscaler.New(ctx, autoscaler.Options{
		Config: taskscaler.Config{Plugin: "local", CapacityPerInstance: 1, MaxInstances: 3, Policies: warm,
			DeleteInstancesOnShutdown: true, ShutdownDeletionInterval: 200 * time.Millisecond,
			UpdateInterval: time.Second, UpdateIntervalWhenExpecting: 100 * time.Millisecond},
		Group: o.Group, Instances: x, Name: "bench", Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	defer p.Shutdown(context.WithoutCancel(ctx))
	cfg := &config.Config{Concurrent: 2, Runners: []*config.Runner{{Name: "bench", URL: srv.URL, Token: created.Token,
		Executor: instance.Name, Autoscaler: &taskscaler.Config{Plugin: "local"}}}}
	m, err := runner.New(cfg, runner.Options{Logger: o.Logger, Version: "bench",
		NewProvider: func(*config.Runner) (executor.Provider, error) { return p, nil }})
	if err != nil {
		return nil, err
	}
	rctx, stopRunner := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- m.Run(rctx) }()
	defer func() {
		stopRunner()
		<-done
	}()

	b := &autoscaleBench{srv: srv, dir: o.Dir, p: p}
	// Warm-up: an instance becomes ready and gets the helper.
	fmt.Fprintln(progress, "bench autoscale: warming up")
	if _, err := b.job(ctx); err != nil {
		return nil, err
	}
	var out []AutoscaleResult
	var warmTimes []time.Duration
	for range o.WarmJobs {
		if err := b.waitIdleSlot(ctx); err != nil {
			return nil, err
		}
		d, err := b.job(ctx)
		if err != nil {
			return nil, err
		}
		warmTimes = append(warmTimes, d)
	}
	out = append(out, summary("warm", warmTimes))
	fmt.Fprintf(progress, "bench autoscale: warm done (%d jobs)\n", len(warmTimes))
	if o.ColdJobs > 0 {
		if err := p.Scaler().SetPolicies([]taskscaler.Policy{{IdleCount: 0, IdleTime: time.Second}}); err != nil {
			return nil, err
		}
		var cold []time.Duration
		for range o.ColdJobs {
			if err := b.waitNoInstance(ctx); err != nil {
				return nil, err
			}
			d, err := b.job(ctx)
			if err != nil {
				return nil, err
			}
			cold = append(cold, d)
		}
		out = append(out, summary("cold", cold))
		fmt.Fprintf(progress, "bench autoscale: cold done (%d jobs)\n", len(cold))
	}
	return out, nil
}

type autoscaleBench struct {
	srv *embedded.Coordinator
	dir string
	p   *autoscaler.Provider
	n   int
}

// job enqueues one job and returns the time until its first script line
// ran, once the job has finished.
func (b *autoscaleBench) job(ctx context.Context) (time.Duration, error) {
	b.n++
	mark := filepath.Join(b.dir, "first-line-"+strconv.Itoa(b.n))
	spec := dispatch.JobSpec{Name: "bench-" + strconv.Itoa(b.n), ProjectID: 1, ProjectFullPath: "bench/autoscale", Timeout: 600,
		Variables: []runnerapi.Variable{{Key: "GIT_STRATEGY", Value: "none", Public: true}},
		Steps:     []runnerapi.Step{{Name: "script", Script: []string{"date +%s%N > " + mark}, When: "on_success", Timeout: 600}}}
	start := time.Now()
	j, err := b.srv.Enqueue(ctx, spec)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		got, err := b.srv.Store.GetJob(ctx, j.ID)
		if err != nil {
			return 0, err
		}
		if got.Status.Finished() {
			if got.Status != store.StatusSuccess {
				return 0, fmt.Errorf("bench job %d %s (%s)", j.ID, got.Status, got.FailureReason)
			}
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bench job %d did not finish", j.ID)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	raw, err := os.ReadFile(mark)
	if err != nil {
		return 0, fmt.Errorf("the job's first line left no time: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the job's first line wrote %q", raw)
	}
	return time.Unix(0, ns).Sub(start), nil
}

// waitIdleSlot waits for a ready, idle slot and the runner's request for
// it: what "warm" means.
func (b *autoscaleBench) waitIdleSlot(ctx context.Context) error {
	return waitUntil(ctx, time.Minute, "an idle ready slot", func() bool {
		st := b.p.Scaler().Stats()
		return st.ReadyFree >= 1 && st.Reserved >= 1
	})
}

// waitNoInstance waits until the fleet is empty: what "cold" means.
func (b *autoscaleBench) waitNoInstance(ctx context.Context) error {
	return waitUntil(ctx, 2*time.Minute, "the fleet to shrink to zero", func() bool {
		st := b.p.Scaler().Stats()
		n := st.Requested
		for _, c := range st.Instances {
			n += c
		}
		return n == 0
	})
}

func waitUntil(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench autoscale: timed out waiting for %s", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func summary(phase string, ds []time.Duration) AutoscaleResult {
	r := AutoscaleResult{Phase: phase, Jobs: len(ds)}
	if len(ds) == 0 {
		return r
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r.P50Ms = ms(s[len(s)/2])
	r.P95Ms = ms(s[min(len(s)-1, len(s)*95/100)])
	r.MaxMs = ms(s[len(s)-1])
	return r
}
