package bench

import (
	"context"
	"testing"
	"time"
)

// TestDispatchThroughCells: the dispatch bench through a router in front
// of two cells, long polling and push, hands every job out and reports
// the cells (the figures themselves are measured, never asserted).
func TestDispatchThroughCells(t *testing.T) {
	if testing.Short() {
		t.Skip("bench smoke test skipped in -short mode")
	}
	for _, push := range []bool{false, true} {
		res, err := Dispatch(context.Background(), DispatchOptions{Runners: 6, Jobs: 60, LatencyJobs: 10, Cells: 2, Push: push})
		if err != nil {
			t.Fatalf("push %v: %v", push, err)
		}
		want := ChannelLongPoll
		if push {
			want = ChannelPush
		}
		if res.Channel != want || res.Cells != 2 || res.Jobs != 60 || res.PickupP99Ms <= 0 || res.CrossPickups != 0 {
			t.Fatalf("push %v: %+v", push, res)
		}
	}
	if _, err := Dispatch(context.Background(), DispatchOptions{Runners: 2, Jobs: 2, Cells: 2, Replicas: 2}); err == nil {
		t.Error("cells with replicas were accepted")
	}
}

// TestDispatchCapacityAndBursts: runner managers with room for several
// jobs, long polling with several polls or on push streams, take every
// job of the throughput phase and of bursts of the latency phase.
func TestDispatchCapacityAndBursts(t *testing.T) {
	for _, push := range []bool{false, true} {
		res, err := Dispatch(t.Context(), DispatchOptions{Runners: 3, Capacity: 4, RequestConcurrency: 2, Burst: 5,
			Jobs: 60, LatencyJobs: 20, Push: push})
		if err != nil {
			t.Fatalf("push %v: %v", push, err)
		}
		if res.Jobs != 60 || res.LatencyJobs != 20 || res.Burst != 5 || res.Capacity != 4 || res.PickupP99Ms <= 0 {
			t.Errorf("push %v: %+v", push, res)
		}
		if (res.RequestConcurrency == 2) == push {
			t.Errorf("push %v: request concurrency %d", push, res.RequestConcurrency)
		}
	}
	if _, err := Dispatch(t.Context(), DispatchOptions{Runners: 1, Jobs: 1, LatencyJobs: 3, Burst: 5}); err == nil {
		t.Error("fewer latency jobs than a burst: no error")
	}
}

// TestDispatchOverANetwork: with --rtt every runner connection (polls,
// acknowledgements, push streams) crosses the delay line, so no pickup —
// the job out and its acknowledgement's round trip — comes sooner than
// one and a half round trips.
func TestDispatchOverANetwork(t *testing.T) {
	const rtt = 20 * time.Millisecond
	for _, push := range []bool{false, true} {
		res, err := Dispatch(t.Context(), DispatchOptions{Runners: 3, Capacity: 2, Jobs: 20, LatencyJobs: 6, Push: push, RTT: rtt})
		if err != nil {
			t.Fatalf("push %v: %v", push, err)
		}
		if res.RTTMs != 20 || res.Jobs != 20 {
			t.Errorf("push %v: %+v", push, res)
		}
		if min := float64(3*rtt/2) / float64(time.Millisecond); res.PickupP50Ms < min {
			t.Errorf("push %v: pickup p50 %.2f ms over a %v round trip, under %.0f ms: a connection skipped the delay line", push, res.PickupP50Ms, rtt, min)
		}
	}
}
