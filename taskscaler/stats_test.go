package taskscaler

import (
	"math"
	"testing"
	"time"
)

// Stats counts boots, deletions and instance time since the scaler
// started: what the coordinator's fleet page shows as cost so far.
func TestStatsCountsBootsDeletionsAndInstanceTime(t *testing.T) {
	e := newEnv(t, Config{CapacityPerInstance: 1, MaxInstances: 4, Policies: []Policy{{IdleCount: 0, IdleTime: time.Minute}}})
	start := e.clock.Now()
	if st := e.s.Stats(); st.Boots != 0 || st.Deletions != 0 || st.InstanceSeconds != 0 || !st.Started.Equal(start) {
		t.Fatalf("fresh scaler: %+v", st)
	}
	jobs := e.runJobs(2*time.Minute, keys("j", 2)...)
	st := e.s.Stats()
	if st.Boots != 2 || st.Acquired != 2 || st.Capacity != 1 || st.MaxInstances != 4 {
		t.Fatalf("two jobs placed: %+v", st)
	}
	for _, a := range jobs {
		e.s.Release(a.Key)
	}
	e.stepUntil(5*time.Minute, "scaled to zero", func() bool { return e.live() == 0 && e.s.Stats().Deletions == 2 })
	st = e.s.Stats()
	if st.Boots != 2 || st.Deletions != 2 {
		t.Fatalf("after scaling to zero: boots %d, deletions %d; want 2 and 2", st.Boots, st.Deletions)
	}
	// Two instances lived at most as long as the test ran, and at least
	// their idle time.
	elapsed := e.clock.Now().Sub(start).Seconds()
	if st.InstanceSeconds < 2*60 || st.InstanceSeconds > 2*elapsed {
		t.Fatalf("instance seconds %.0f after %.0f s with two instances idle a minute", st.InstanceSeconds, elapsed)
	}
	// Nothing lives: the count stands still.
	e.step(60)
	if again := e.s.Stats().InstanceSeconds; math.Abs(again-st.InstanceSeconds) > 1e-9 {
		t.Fatalf("instance seconds grew with no instance: %.0f → %.0f", st.InstanceSeconds, again)
	}
}
