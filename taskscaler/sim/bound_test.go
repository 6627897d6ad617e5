package sim

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestWholeBound(t *testing.T) {
	s := time.Second
	job := func(at, d time.Duration) Job { return Job{Arrival: at * s, Duration: d * s} }
	const boot, del = 45 * time.Second, 10 * time.Second
	for _, tt := range []struct {
		name     string
		jobs     []Job
		capacity int
		want     float64
		days     map[int]float64
	}{
		{"one job: a boot, its time, a deletion", []Job{job(0, 100)}, 4, 45 + 100 + 10, nil},
		{"a short gap is cheaper kept", []Job{job(0, 100), job(130, 100)}, 4, 45 + 100 + 30 + 100 + 10, nil},
		{"a long gap is cheaper gone", []Job{job(0, 100), job(400, 100)}, 4, 45 + 100 + (10 + 45) + 100 + 10, nil},
		{"three at once on twos: two whole instances", []Job{job(0, 100), job(0, 100), job(0, 100)}, 2, 2 * (45 + 100 + 10), nil},
		{"a slot freed at t takes the job arriving at t", []Job{job(0, 100), job(100, 100)}, 1, 45 + 200 + 10, nil},
		{"split by day", []Job{{Arrival: day - 50*s, Duration: 100 * s}}, 4, 45 + 100 + 10, map[int]float64{0: 45 + 50, 1: 50 + 10}},
	} {
		got, days := wholeBound(tt.jobs, tt.capacity, boot, del)
		if math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
		sum := 0.0
		for _, v := range days {
			sum += v
		}
		if math.Abs(sum-got) > 1e-9 {
			t.Errorf("%s: days %v sum to %v, not %v", tt.name, days, sum, got)
		}
		for d, v := range tt.days {
			if math.Abs(days[d]-v) > 1e-9 {
				t.Errorf("%s: day %d %v, want %v", tt.name, d, days[d], v)
			}
		}
	}
	if got, _ := wholeBound(nil, 4, boot, del); got != 0 {
		t.Errorf("no jobs: %v", got)
	}
}

// TestWholeBoundHolds: on every built-in workload the whole-instance
// bound lies between the fluid bound and what the scaler pays.
func TestWholeBoundHolds(t *testing.T) {
	for _, name := range Workloads {
		jobs, err := Generate(name, 6*time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(context.Background(), Config{Autoscaler: defaultConfig(t), Cloud: cloud45s(), Jobs: jobs, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		if !(r.LowerBound <= r.WholeBound && r.WholeBound <= r.InstanceSeconds) {
			t.Errorf("%s: fluid bound %.0f, whole-instance bound %.0f, cost %.0f: want them in that order", name, r.LowerBound, r.WholeBound, r.InstanceSeconds)
		}
	}
}
