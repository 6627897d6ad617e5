package taskscaler

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/plugins/fake"
)

// testClock is a manual clock: time moves only with Advance, which fires
// the timers that came due.
type testClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []testTimer
}

type testTimer struct {
	at time.Time
	ch chan time.Time
}

func newTestClock() *testClock { return &testClock{now: t0} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, testTimer{c.now.Add(d), ch})
	return ch
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.timers = slices.DeleteFunc(c.timers, func(t testTimer) bool {
		if !c.now.Before(t.at) {
			t.ch <- c.now
			return true
		}
		return false
	})
}

// waiters is how many timers are pending.
func (c *testClock) waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// jumpClock jumps to every timer at once: for code that waits in
// sequence (shutdown rounds) and needs no other goroutine to move.
type jumpClock struct{ testClock }

func (c *jumpClock) After(d time.Duration) <-chan time.Time {
	c.Advance(d)
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

// recorder wraps a group and records the calls that change it.
type recorder struct {
	fleeting.InstanceGroup
	mu        sync.Mutex
	calls     []string
	increased int
	decreased []string
	// decreaseNone makes Decrease accept nothing (a cloud that ignores it).
	decreaseNone bool
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) Increase(ctx context.Context, n int) (int, error) {
	got, err := r.InstanceGroup.Increase(ctx, n)
	r.mu.Lock()
	r.increased += got
	r.mu.Unlock()
	r.note(fmt.Sprintf("increase %d", got))
	return got, err
}

func (r *recorder) Decrease(ctx context.Context, ids []string) ([]string, error) {
	r.note("decrease " + strings.Join(ids, ","))
	r.mu.Lock()
	r.decreased = append(r.decreased, ids...)
	none := r.decreaseNone
	r.mu.Unlock()
	if none {
		return nil, nil
	}
	return r.InstanceGroup.Decrease(ctx, ids)
}

func (r *recorder) Shutdown(ctx context.Context) error {
	r.note("shutdown")
	return r.InstanceGroup.Shutdown(ctx)
}

func (r *recorder) snapshot() (calls []string, increased int, decreased []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls), r.increased, slices.Clone(r.decreased)
}

// env is a scaler on a fake cloud in virtual time.
type env struct {
	t     *testing.T
	clock *testClock
	cloud *fake.Group
	group *recorder
	s     *Scaler
	ctx   context.Context
}

type envOpt func(*fake.Config, *Config, *Options)

func withBoot(d time.Duration) envOpt {
	return func(f *fake.Config, _ *Config, _ *Options) { f.BootLatency = fake.Fixed(d) }
}

func withReadier(r Readier) envOpt {
	return func(_ *fake.Config, _ *Config, o *Options) { o.Readier = r }
}

// newEnv builds a scaler with cfg on a fake cloud booting in 30s and
// deleting in 5s.
func newEnv(t *testing.T, cfg Config, opts ...envOpt) *env {
	t.Helper()
	fc := fake.Config{Seed: 1, BootLatency: fake.Fixed(30 * time.Second), DeleteLatency: fake.Fixed(5 * time.Second)}
	o := Options{Inline: true, DefaultLocation: time.UTC, Logger: testLogger(t)}
	if cfg.Prediction == nil {
		// Most tests pin GitLab's behaviour; prediction has its own.
		cfg.Prediction = ptr(false)
	}
	for _, f := range opts {
		f(&fc, &cfg, &o)
	}
	clock := newTestClock()
	cloud := fake.New(fc, clock)
	e := &env{t: t, clock: clock, cloud: cloud, group: &recorder{InstanceGroup: cloud}, ctx: context.Background()}
	o.Clock = clock
	s, err := New(e.ctx, e.group, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	return e
}

// step advances the clock by one second and ticks, n times.
func (e *env) step(n int) {
	e.t.Helper()
	for range n {
		e.clock.Advance(time.Second)
		e.s.Tick(e.ctx)
	}
}

// stepUntil steps until cond holds, at most limit seconds.
func (e *env) stepUntil(limit time.Duration, what string, cond func() bool) {
	e.t.Helper()
	for i := 0; !cond(); i++ {
		if time.Duration(i)*time.Second > limit {
			e.t.Fatalf("after %s of virtual time: still not %s (stats %+v)", limit, what, e.s.Stats())
		}
		e.step(1)
	}
}

// live counts the cloud's instances not being deleted.
func (e *env) live() int {
	n := 0
	for _, in := range e.cloud.Instances() {
		if in.State == fleeting.StateCreating || in.State == fleeting.StateRunning {
			n++
		}
	}
	return n
}

func (e *env) acquire(key string) *Acquisition {
	e.t.Helper()
	a, ok, err := e.s.TryAcquire(key)
	if err != nil || !ok {
		e.t.Fatalf("TryAcquire(%s) = %v, %v (stats %+v)", key, ok, err, e.s.Stats())
	}
	return a
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func ptr[T any](v T) *T { return &v }
