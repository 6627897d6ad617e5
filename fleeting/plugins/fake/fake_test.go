package fake_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/fleetingtest"
	"github.com/berthci/berth/fleeting/plugins/fake"
)

func TestConformance(t *testing.T) {
	fleetingtest.Run(t, func(t *testing.T) fleeting.InstanceGroup {
		return fake.New(fake.Config{
			Seed:          1,
			MaxSize:       4,
			BootLatency:   fake.Uniform(time.Millisecond, 20*time.Millisecond),
			DeleteLatency: fake.Fixed(10 * time.Millisecond),
		}, nil)
	})
}

// manualClock is a virtual clock moved by the test.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func states(t *testing.T, g fleeting.InstanceGroup) map[string]fleeting.State {
	t.Helper()
	out := map[string]fleeting.State{}
	if err := g.Update(context.Background(), func(id string, s fleeting.State) { out[id] = s }); err != nil {
		t.Fatal(err)
	}
	return out
}

func newInit(t *testing.T, cfg fake.Config, clock fake.Clock) *fake.Group {
	t.Helper()
	g := fake.New(cfg, clock)
	if _, err := g.Init(context.Background(), slog.New(slog.DiscardHandler), fleeting.Settings{}); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestVirtualTimeBoot(t *testing.T) {
	clock := &manualClock{now: time.Unix(1000, 0)}
	g := newInit(t, fake.Config{BootLatency: fake.Fixed(30 * time.Second), DeleteLatency: fake.Fixed(10 * time.Second)}, clock)
	ctx := context.Background()
	if n, err := g.Increase(ctx, 2); n != 2 || err != nil {
		t.Fatalf("Increase = %d, %v", n, err)
	}
	want := func(exp map[string]fleeting.State) {
		t.Helper()
		got := states(t, g)
		if len(got) != len(exp) {
			t.Fatalf("states = %v, want %v", got, exp)
		}
		for id, s := range exp {
			if got[id] != s {
				t.Fatalf("states = %v, want %v", got, exp)
			}
		}
	}
	want(map[string]fleeting.State{"fake-1": fleeting.StateCreating, "fake-2": fleeting.StateCreating})
	clock.Advance(29 * time.Second)
	want(map[string]fleeting.State{"fake-1": fleeting.StateCreating, "fake-2": fleeting.StateCreating})
	clock.Advance(time.Second)
	want(map[string]fleeting.State{"fake-1": fleeting.StateRunning, "fake-2": fleeting.StateRunning})
	if got, _ := g.Decrease(ctx, []string{"fake-1"}); len(got) != 1 {
		t.Fatalf("Decrease = %v", got)
	}
	want(map[string]fleeting.State{"fake-1": fleeting.StateDeleting, "fake-2": fleeting.StateRunning})
	clock.Advance(10 * time.Second)
	want(map[string]fleeting.State{"fake-1": fleeting.StateDeleted, "fake-2": fleeting.StateRunning})
	want(map[string]fleeting.State{"fake-2": fleeting.StateRunning}) // deleted is reported once
}

func TestSameSeedSameRun(t *testing.T) {
	run := func(seed uint64) []fake.Instance {
		clock := &manualClock{now: time.Unix(0, 0)}
		g := newInit(t, fake.Config{
			Seed:             seed,
			BootLatency:      fake.Distribution{Kind: "lognormal", Mean: fake.Duration(30 * time.Second), StdDev: fake.Duration(10 * time.Second)},
			NeverRunningRate: 0.2,
		}, clock)
		for range 5 {
			if _, err := g.Increase(context.Background(), 3); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Second)
		}
		return g.Instances()
	}
	a, b, c := run(7), run(7), run(8)
	if len(a) != 15 {
		t.Fatalf("got %d instances, want 15", len(a))
	}
	same := func(x, y []fake.Instance) bool {
		for i := range x {
			if !x[i].RunningAt.Equal(y[i].RunningAt) {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Errorf("two runs with seed 7 differ")
	}
	if same(a, c) {
		t.Errorf("runs with seeds 7 and 8 are identical")
	}
}

func TestFailureInjection(t *testing.T) {
	ctx := context.Background()
	t.Run("scripted increase error", func(t *testing.T) {
		g := newInit(t, fake.Config{}, &manualClock{})
		boom := errors.New("boom")
		g.FailIncrease(boom)
		if n, err := g.Increase(ctx, 1); n != 0 || !errors.Is(err, boom) {
			t.Fatalf("Increase = %d, %v; want 0, boom", n, err)
		}
		if n, err := g.Increase(ctx, 1); n != 1 || err != nil {
			t.Fatalf("second Increase = %d, %v", n, err)
		}
	})
	t.Run("increase error rate 1", func(t *testing.T) {
		g := newInit(t, fake.Config{IncreaseErrorRate: 1}, &manualClock{})
		if n, err := g.Increase(ctx, 1); n != 0 || !errors.Is(err, fake.ErrInjected) {
			t.Fatalf("Increase = %d, %v; want ErrInjected", n, err)
		}
	})
	t.Run("never running", func(t *testing.T) {
		clock := &manualClock{}
		g := newInit(t, fake.Config{NeverRunningRate: 1}, clock)
		g.Increase(ctx, 1)
		clock.Advance(1000 * time.Hour)
		if s := states(t, g); s["fake-1"] != fleeting.StateCreating {
			t.Fatalf("states = %v, want fake-1 creating forever", s)
		}
	})
	t.Run("vanish rate", func(t *testing.T) {
		clock := &manualClock{}
		g := newInit(t, fake.Config{VanishRate: 1, VanishAfter: fake.Fixed(time.Minute)}, clock)
		g.Increase(ctx, 1)
		if s := states(t, g); s["fake-1"] != fleeting.StateRunning {
			t.Fatalf("states = %v, want fake-1 running", s)
		}
		clock.Advance(time.Minute)
		if s := states(t, g); len(s) != 0 {
			t.Fatalf("states = %v, want fake-1 vanished", s)
		}
	})
	t.Run("vanish now and unhealthy", func(t *testing.T) {
		g := newInit(t, fake.Config{}, &manualClock{})
		g.Increase(ctx, 2)
		if err := g.SetUnhealthy("fake-2", true); err != nil {
			t.Fatal(err)
		}
		if err := g.Heartbeat(ctx, "fake-2"); !errors.Is(err, fleeting.ErrInstanceUnhealthy) {
			t.Fatalf("Heartbeat = %v, want ErrInstanceUnhealthy", err)
		}
		if err := g.Vanish("fake-1"); err != nil {
			t.Fatal(err)
		}
		if s := states(t, g); len(s) != 1 {
			t.Fatalf("states = %v, want only fake-2", s)
		}
	})
	t.Run("quota", func(t *testing.T) {
		g := newInit(t, fake.Config{MaxSize: 3}, &manualClock{})
		if n, err := g.Increase(ctx, 5); n != 3 || err != nil {
			t.Fatalf("Increase(5) = %d, %v; want 3, nil", n, err)
		}
		g.SetMaxSize(4)
		if n, err := g.Increase(ctx, 5); n != 1 || err != nil {
			t.Fatalf("Increase(5) = %d, %v; want 1, nil", n, err)
		}
		if n, err := g.Increase(ctx, 1); n != 0 || !errors.Is(err, fleeting.ErrQuotaExceeded) {
			t.Fatalf("Increase(1) = %d, %v; want ErrQuotaExceeded", n, err)
		}
	})
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []fake.Config{
		{MaxSize: -1},
		{IncreaseErrorRate: 1.5},
		{BootLatency: fake.Distribution{Kind: "zipf"}},
		{BootLatency: fake.Uniform(2*time.Second, time.Second)},
	} {
		if _, err := fake.New(cfg, nil).Init(context.Background(), slog.New(slog.DiscardHandler), fleeting.Settings{}); err == nil {
			t.Errorf("Init with %+v succeeded", cfg)
		}
	}
}
