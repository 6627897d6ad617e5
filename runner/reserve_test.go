package runner

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// reservingProvider is a shell provider with limited capacity that must
// be reserved, and that fails on misuse of the Reserver protocol.
type reservingProvider struct {
	executor.Provider
	t *testing.T

	mu       sync.Mutex
	capacity int
	held     map[string]bool // reserved or in use
	claimed  map[string]bool
	log      []string
	prepared []executor.PrepareOptions
}

func (p *reservingProvider) Reserve(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[key] {
		p.t.Errorf("key %s reserved twice", key)
	}
	if len(p.held) >= p.capacity {
		p.log = append(p.log, "refused")
		return fmt.Errorf("test: %w", executor.ErrNoCapacity)
	}
	p.held[key] = true
	p.log = append(p.log, "reserve "+key)
	return nil
}

func (p *reservingProvider) Unreserve(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[key] {
		p.log = append(p.log, "unreserve "+key)
	}
	delete(p.held, key)
}

func (p *reservingProvider) Claim(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held[key] {
		p.t.Errorf("Claim(%s) of a key not reserved", key)
	}
	if p.claimed == nil {
		p.claimed = map[string]bool{}
	}
	p.claimed[key] = true
	p.log = append(p.log, "claim "+key)
}

func (p *reservingProvider) IsolationLevels() []executor.Isolation {
	return []executor.Isolation{executor.IsolationCgroups}
}

func (p *reservingProvider) Create(ctx context.Context) (executor.Executor, error) {
	e, err := p.Provider.Create(ctx)
	return &recordingExecutor{Executor: e, p: p}, err
}

type recordingExecutor struct {
	executor.Executor
	p *reservingProvider
}

func (e *recordingExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	e.p.mu.Lock()
	if !e.p.held[o.Reservation] {
		e.p.t.Errorf("Prepare with reservation %q, which is not held", o.Reservation)
	}
	if !e.p.claimed[o.Reservation] {
		e.p.t.Errorf("Prepare with reservation %q, which the runner did not claim for its job", o.Reservation)
	}
	e.p.prepared = append(e.p.prepared, o)
	e.p.mu.Unlock()
	return e.Executor.Prepare(ctx, o)
}

func (p *reservingProvider) heldKeys() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// TestReserverGatesJobRequests: a runner whose executor has no capacity
// does not ask for jobs; a request that brings no job gives its
// reservation back; a job's reservation is claimed, reaches Prepare and is
// given back when the job ends; the runner advertises its executor's isolation
// levels, and the job's requested level reaches Prepare.
func TestReserverGatesJobRequests(t *testing.T) {
	f := newFake(t)
	var p *reservingProvider
	h := newHarness(t, f, func(c *config.Config, o *Options) {
		c.Concurrent = 4
		next := o.NewProvider
		o.NewProvider = func(rc *config.Runner) (executor.Provider, error) {
			inner, err := next(rc)
			p = &reservingProvider{Provider: inner, t: t, held: map[string]bool{}}
			return p, err
		}
	})
	h.start()
	// No capacity: no request at all, however long we wait.
	time.Sleep(200 * time.Millisecond)
	f.mu.Lock()
	n := len(f.requests)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d job requests without capacity", n)
	}
	// Capacity for one: requests come, and each 204 gives the key back.
	p.mu.Lock()
	p.capacity = 1
	p.mu.Unlock()
	waitFor(t, "requests with capacity", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.requests) >= 2
	})
	if p.heldKeys() > 1 {
		t.Fatalf("%d keys held with capacity 1", p.heldKeys())
	}
	job := fakeJob(9, "echo reserved")
	job.Variables = append(job.Variables, runnerapi.Variable{Key: runnerapi.IsolationVariable, Value: "cgroups", Public: true})
	f.add(job)
	select {
	case <-f.finalDone:
	case <-time.After(30 * time.Second):
		t.Fatal("job did not finish")
	}
	if st := lastFinal(t, f.finalsOf(9)).State; st != "success" {
		t.Fatalf("job %s", st)
	}
	p.mu.Lock()
	prepared := slices.Clone(p.prepared)
	p.mu.Unlock()
	if len(prepared) != 1 || prepared[0].Reservation == "" || prepared[0].Isolation != executor.IsolationCgroups {
		t.Fatalf("Prepare options %+v: want the reservation and isolation cgroups", prepared)
	}
	waitFor(t, "the job's reservation to be given back", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.held[prepared[0].Reservation]
	})
	f.mu.Lock()
	info := f.requests[0].Info
	f.mu.Unlock()
	if info == nil || !slices.Equal(info.IsolationLevels, []string{"cgroups"}) {
		t.Fatalf("info.isolation_levels %+v, want [cgroups]", info)
	}
}
