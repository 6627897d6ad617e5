package taskscaler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC) // a Monday, noon

func policies(t testing.TB, ps ...Policy) []Policy {
	t.Helper()
	for i := range ps {
		ps[i].setDefaults()
		if err := ps[i].compile(time.UTC); err != nil {
			t.Fatal(err)
		}
	}
	return ps
}

// ready returns a ready instance idle since idle ago.
func ready(id string, acquired int, idle time.Duration) InstanceView {
	return InstanceView{ID: id, Phase: PhaseReady, Acquired: acquired, Uses: acquired, Created: t0.Add(-time.Hour), IdleSince: t0.Add(-idle)}
}

// booting returns an instance in phase ph (creating or booted), asked for
// ago before t0.
func booting(id string, ph Phase, ago time.Duration) InstanceView {
	return InstanceView{ID: id, Phase: ph, Created: t0.Add(-ago + time.Second), Requested: t0.Add(-ago)}
}

func TestDecide(t *testing.T) {
	p4 := Params{Capacity: 4, ThrottleLimit: -1, CreatingTimeout: 10 * time.Minute, DeletionRetry: time.Minute}
	p1 := p4
	p1.Capacity = 1
	idle := func(n int) Policy { return Policy{IdleCount: n, IdleTime: 10 * time.Minute} }
	tests := []struct {
		name     string
		p        Params
		pols     []Policy
		st       State
		now      time.Time
		increase int
		remove   []string // "id:reason"
		decrease []string
		reason   string // a substring of the reasons, if set
	}{
		{name: "nothing to do", p: p4, st: State{}},
		{name: "idle slots from nothing", p: p4, pols: []Policy{idle(4)}, increase: 1},
		{name: "idle slots round up to instances", p: p4, pols: []Policy{idle(5)}, increase: 2},
		{name: "requested instances count as supply", p: p4, pols: []Policy{idle(5)}, st: State{Requested: make([]time.Time, 2)}},
		{name: "booting instances count as supply", p: p4, pols: []Policy{idle(4)},
			st: State{Instances: []InstanceView{{ID: "a", Phase: PhaseCreating, Created: t0}}}},
		{name: "reservations add to idle target", p: p4, pols: []Policy{idle(4)},
			st: State{Instances: []InstanceView{ready("a", 0, 0)}, Reserved: 3}, increase: 1},
		{name: "partly used instance supplies its free slots", p: p4, pols: []Policy{idle(3)},
			st: State{Instances: []InstanceView{ready("a", 1, 0)}}},
		{name: "refused reservations are demand", p: p4, pols: []Policy{idle(4)},
			st: State{Instances: []InstanceView{ready("a", 0, 0)}, Refused: 9}, increase: 3},
		{name: "queued jobs in the coordinator are demand", p: p4,
			st: State{Instances: []InstanceView{ready("a", 0, 0)}, Queued: 9}, increase: 2},
		{name: "queued and refused are the same jobs: the larger counts", p: p4,
			st: State{Instances: []InstanceView{ready("a", 0, 0)}, Queued: 9, Refused: 5}, increase: 2},
		{name: "queued jobs covered by free slots ask for nothing", p: p4,
			st: State{Instances: []InstanceView{ready("a", 0, 0)}, Queued: 3}},
		{name: "max_instances counts instances in every phase", p: Params{Capacity: 4, MaxInstances: 3, ThrottleLimit: -1},
			pols: []Policy{idle(40)}, st: State{Requested: make([]time.Time, 1), Instances: []InstanceView{{ID: "d", Phase: PhaseDeleting}}},
			increase: 1, reason: "max_instances 3 allows 1"},
		{name: "ready-up backoff holds increases", p: p4, pols: []Policy{idle(4)},
			st: State{BackoffUntil: t0.Add(time.Minute)}, reason: "ready-up backoff"},
		{name: "backoff over", p: p4, pols: []Policy{idle(4)}, st: State{BackoffUntil: t0}, increase: 1},
		{name: "scale_throttle", p: Params{Capacity: 1, ThrottleLimit: 1, ThrottleBurst: 2}, pols: []Policy{idle(5)},
			increase: 2, reason: "scale_throttle allows 2"},
		{name: "scale_factor with limit", p: p1, pols: []Policy{{IdleCount: 1, ScaleFactor: 0.5, ScaleFactorLimit: 3, IdleTime: time.Hour}},
			st: State{Instances: []InstanceView{ready("a", 1, 0), ready("b", 1, 0), ready("c", 1, 0), ready("d", 1, 0),
				ready("e", 1, 0), ready("f", 1, 0), ready("g", 1, 0), ready("h", 1, 0)}},
			increase: 3},
		{name: "scale_factor below idle_count", p: p1, pols: []Policy{{IdleCount: 2, ScaleFactor: 0.1, IdleTime: time.Hour}},
			st: State{Instances: []InstanceView{ready("a", 1, 0)}}, increase: 2},
		{name: "idle removal after idle_time", p: p4, pols: []Policy{idle(0)},
			st:     State{Instances: []InstanceView{ready("a", 0, 11*time.Minute), ready("b", 0, 9*time.Minute)}},
			remove: []string{"a:idle"}},
		{name: "idle removal keeps idle_count", p: p4, pols: []Policy{idle(4)},
			st:     State{Instances: []InstanceView{ready("a", 0, 20*time.Minute), ready("b", 0, 30*time.Minute)}},
			remove: []string{"b:idle"}},
		{name: "idle removal keeps capacity for reservations", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 0, time.Hour)}, Reserved: 1}},
		{name: "polling reservations are not demand", p: p4, st: State{Polling: 3}},
		{name: "polling reservations do not keep an idle instance", p: p4, pols: []Policy{idle(0)},
			st:     State{Instances: []InstanceView{ready("a", 0, time.Hour)}, Polling: 1},
			remove: []string{"a:idle"}},
		{name: "preemptive: a poll holds its ready slot, beyond idle_count", p: p1, pols: []Policy{idle(1)},
			st: State{Instances: []InstanceView{ready("a", 0, time.Hour), ready("b", 0, time.Hour), ready("c", 0, time.Hour)},
				Polling: 1},
			remove: []string{"a:idle"}},
		{name: "preemptive: polls holding every ready slot make room for idle_count", p: p1, pols: []Policy{idle(1)},
			st:       State{Instances: []InstanceView{ready("a", 0, 0)}, Polling: 1},
			increase: 1},
		{name: "partly free instance covers idle_count", p: p4, pols: []Policy{idle(2)},
			st:     State{Instances: []InstanceView{ready("a", 2, 0), ready("b", 0, time.Hour)}},
			remove: []string{"b:idle"}},
		{name: "busy instance is never idle", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 1, 2*time.Hour)}}},
		{name: "max_use_count reached and released", p: Params{Capacity: 2, MaxUseCount: 3, ThrottleLimit: -1},
			st:     State{Instances: []InstanceView{{ID: "a", Phase: PhaseReady, Uses: 3, IdleSince: t0}}},
			remove: []string{"a:max_use_count"}},
		{name: "max_use_count reached, last job running", p: Params{Capacity: 2, MaxUseCount: 3, ThrottleLimit: -1},
			pols: []Policy{idle(1)},
			st:   State{Instances: []InstanceView{{ID: "a", Phase: PhaseReady, Uses: 3, Acquired: 1, IdleSince: t0}}},
			// a has no usable slot left: one new instance for idle_count 1.
			increase: 1},
		{name: "uses left bound the free slots", p: Params{Capacity: 4, MaxUseCount: 5, ThrottleLimit: -1},
			pols: []Policy{idle(3)},
			st:   State{Instances: []InstanceView{{ID: "a", Phase: PhaseReady, Uses: 3, IdleSince: t0}}},
			// a can take 2 more jobs; a fresh instance brings 4.
			increase: 1},
		{name: "unhealthy idle instance is replaced", p: p4, pols: []Policy{idle(4)},
			st:       State{Instances: []InstanceView{{ID: "a", Phase: PhaseReady, Unhealthy: true, IdleSince: t0}}},
			increase: 1, remove: []string{"a:unhealthy"}},
		{name: "unhealthy busy instance waits for its jobs", p: p4,
			st: State{Instances: []InstanceView{{ID: "a", Phase: PhaseReady, Unhealthy: true, Acquired: 1}}}},
		{name: "failed ready-up", p: p4,
			st:     State{Instances: []InstanceView{{ID: "a", Phase: PhaseBooted, ReadyFailed: true}}},
			remove: []string{"a:ready_up_failed"}},
		{name: "creating too long", p: p4,
			st:     State{Instances: []InstanceView{{ID: "a", Phase: PhaseCreating, Created: t0.Add(-10 * time.Minute)}}},
			remove: []string{"a:creating_timeout"}},
		{name: "removing: Decrease due, retry not yet due", p: p4, st: State{Instances: []InstanceView{
			{ID: "a", Phase: PhaseRemoving}, {ID: "b", Phase: PhaseRemoving, DecreasedAt: t0.Add(-time.Minute)},
			{ID: "c", Phase: PhaseRemoving, DecreasedAt: t0.Add(-59 * time.Second)}, {ID: "d", Phase: PhaseDeleting}}},
			decrease: []string{"a", "b"}},
		{name: "stopping", p: p4, pols: []Policy{idle(8)}, st: State{Stopping: true,
			Instances: []InstanceView{ready("a", 0, time.Hour)}}, reason: "stopping"},
		{name: "last matching policy wins", p: p4,
			pols:     []Policy{idle(4), {Periods: []string{"* 12 * * *"}, IdleCount: 8}, {Periods: []string{"* 13 * * *"}, IdleCount: 12}},
			increase: 2},
		{name: "no policy matches: default, scale to zero", p: p4,
			pols: []Policy{{Periods: []string{"* 8-11 * * *"}, IdleCount: 8}},
			st:   State{Instances: []InstanceView{ready("a", 0, 6*time.Minute), ready("b", 0, 4*time.Minute)}},
			// DefaultPolicy: idle_count 0, idle_time 5m
			remove: []string{"a:idle"}},
		// With a forecast (prediction on).
		{name: "forecast: demand expected within a boot is provisioned now", p: p4,
			st:       State{Forecast: &Forecast{Create: 9, Keep: 9}},
			increase: 3, reason: "forecast: 9 slots"},
		{name: "forecast counts held slots as already provided", p: p4,
			st:       State{Instances: []InstanceView{ready("a", 3, 0)}, Forecast: &Forecast{Create: 5, Keep: 5}},
			increase: 1},
		{name: "forecast never lowers the policy's floor", p: p4, pols: []Policy{idle(8)},
			st:       State{Forecast: &Forecast{Create: 1, Keep: 1}},
			increase: 2},
		{name: "forecast: idle instances it does not need go before idle_time", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 0, 10*time.Second), ready("b", 0, 5*time.Second), ready("c", 2, 0)},
				Forecast: &Forecast{Create: 2, Keep: 6}},
			// c holds 2 and has 2 free; keep 6 wants 4 free: one idle instance stays.
			remove: []string{"a:idle"}},
		{name: "forecast: an idle instance needed until a replacement could be back stays", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 0, time.Hour)}, Forecast: &Forecast{Create: 0, Keep: 4}}},
		{name: "forecast: polling reservations do not keep an idle instance", p: p4, pols: []Policy{idle(0)},
			st:     State{Instances: []InstanceView{ready("a", 0, time.Second)}, Polling: 2, Forecast: &Forecast{}},
			remove: []string{"a:idle"}},
		{name: "forecast, preemptive: between two polls the idle slot's instance stays", p: p1, pols: []Policy{idle(1)},
			st: State{Instances: []InstanceView{ready("a", 0, 3*time.Second), ready("b", 0, 3*time.Second)},
				Polling: 0, PollingPeak: 1, Forecast: &Forecast{}}},
		{name: "forecast, preemptive: no poll lately, the surplus goes", p: p1, pols: []Policy{idle(1)},
			st: State{Instances: []InstanceView{ready("a", 0, 3*time.Second), ready("b", 0, 3*time.Second)},
				Forecast: &Forecast{}},
			remove: []string{"a:idle"}},
		{name: "forecast never removes an instance holding a job", p: p4,
			st: State{Instances: []InstanceView{ready("a", 1, time.Hour)}, Forecast: &Forecast{}}},
		{name: "forecast: a ready idle instance is not given back for capacity still booting", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 0, time.Minute), booting("b", PhaseCreating, 10*time.Second)},
				Forecast: &Forecast{Create: 4, Keep: 4}}},
		{name: "forecast: once it is ready, the surplus goes", p: p4, pols: []Policy{idle(0)},
			st: State{Instances: []InstanceView{ready("a", 0, time.Minute), ready("b", 0, 0)},
				Forecast: &Forecast{Create: 4, Keep: 4}},
			remove: []string{"a:idle"}},
		// Overdue: instances still booting 2 minutes after their request.
		{name: "overdue: a booting instance counts until it is overdue", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 119*time.Second)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute}},
		{name: "overdue: a lone stuck instance is replaced", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 3*time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute},
			increase: 1, reason: "1 instances not ready 2m0s after their request, 1 not counted"},
		{name: "overdue: booted but not ready up counts the same", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseBooted, 3*time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute},
			increase: 1},
		{name: "overdue: nothing ready since they were asked for, only one stops counting", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 5*time.Minute), booting("b", PhaseCreating, 3*time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute, LastReady: t0.Add(-time.Hour)},
			reason: "2 instances not ready 2m0s after their request, 1 not counted"},
		{name: "overdue: others came up since, every stuck one is replaced", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 5*time.Minute), booting("b", PhaseCreating, 3*time.Minute),
				ready("c", 4, 0)}, Forecast: &Forecast{Create: 8, Keep: 8}, Overdue: 2 * time.Minute, LastReady: t0.Add(-time.Minute)},
			increase: 1},
		{name: "overdue: others came up since, and one more asked for after", p: p4,
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 5*time.Minute), booting("b", PhaseCreating, 3*time.Minute),
				booting("c", PhaseCreating, 3*time.Minute)}, Forecast: &Forecast{Create: 12, Keep: 12}, Overdue: 2 * time.Minute,
				LastReady: t0.Add(-4 * time.Minute)},
			// a is stuck (asked before the last ready), b is the probe, c counts.
			increase: 2},
		{name: "overdue: an instance of unknown request time counts", p: p4,
			st: State{Instances: []InstanceView{{ID: "a", Phase: PhaseCreating, Created: t0.Add(-3 * time.Minute)}},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute}},
		{name: "overdue: without prediction (GitLab's rules) it counts until instance_creating_timeout", p: p4, pols: []Policy{idle(4)},
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 9*time.Minute)}, Overdue: 2 * time.Minute}},
		{name: "overdue: a request never listed stops counting", p: p4,
			st: State{Requested: []time.Time{t0.Add(-3 * time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute},
			increase: 1, reason: "1 instances not ready 2m0s after their request, 1 not counted"},
		{name: "overdue: a recent request counts", p: p4,
			st: State{Requested: []time.Time{t0.Add(-time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute}},
		{name: "overdue: requests never listed, nothing ready since: only one stops counting", p: p4,
			st: State{Requested: []time.Time{t0.Add(-4 * time.Minute), t0.Add(-3 * time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute}},
		{name: "overdue: max_instances still holds", p: Params{Capacity: 4, ThrottleLimit: -1, MaxInstances: 1, CreatingTimeout: 10 * time.Minute},
			st: State{Instances: []InstanceView{booting("a", PhaseCreating, 3*time.Minute)},
				Forecast: &Forecast{Create: 4, Keep: 4}, Overdue: 2 * time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = t0
			}
			d := Decide(tt.p, policies(t, tt.pols...), tt.st, now)
			var rm []string
			for _, r := range d.Remove {
				rm = append(rm, r.ID+":"+r.Reason)
			}
			if d.Increase != tt.increase || !slices.Equal(rm, tt.remove) || !slices.Equal(d.Decrease, tt.decrease) {
				t.Errorf("increase %d remove %v decrease %v; want %d %v %v (reasons %q)",
					d.Increase, rm, d.Decrease, tt.increase, tt.remove, tt.decrease, d.Reasons)
			}
			if tt.reason != "" && !strings.Contains(strings.Join(d.Reasons, "; "), tt.reason) {
				t.Errorf("reasons %q lack %q", d.Reasons, tt.reason)
			}
		})
	}
}

func TestBucket(t *testing.T) {
	var b Bucket
	got, b := b.Take(t0, 5, 0.5, 3) // starts full
	if got != 3 {
		t.Fatalf("first take %d, want 3", got)
	}
	got, b = b.Take(t0.Add(time.Second), 5, 0.5, 3)
	if got != 0 {
		t.Fatalf("after 1s took %d, want 0 (half a token)", got)
	}
	got, b = b.Take(t0.Add(2*time.Second), 5, 0.5, 3)
	if got != 1 {
		t.Fatalf("after 2s took %d, want 1", got)
	}
	got, _ = b.Take(t0.Add(time.Hour), 5, 0.5, 3)
	if got != 3 {
		t.Fatalf("after an hour took %d, want the burst 3", got)
	}
	if got, _ := b.Take(t0, 1000, -1, 0); got != 1000 {
		t.Fatalf("unlimited took %d", got)
	}
}

// TestDecideIdleCountTimeline replays a scale-down tick by tick with the
// decision applied, as the scaler applies it: the fleet settles at exactly
// the idle_count and no removal is followed by a creation.
func TestDecideIdleCountTimeline(t *testing.T) {
	for _, c := range []struct{ capacity, idleCount, instances, want int }{
		{1, 1, 5, 1}, {4, 0, 5, 0}, {4, 4, 5, 1}, {4, 5, 5, 2}, {2, 3, 6, 2},
	} {
		t.Run(fmt.Sprintf("cap%d_idle%d", c.capacity, c.idleCount), func(t *testing.T) {
			p := Params{Capacity: c.capacity, ThrottleLimit: -1, DeletionRetry: time.Minute}
			pols := policies(t, Policy{IdleCount: c.idleCount, IdleTime: time.Minute})
			var st State
			for i := range c.instances {
				st.Instances = append(st.Instances, ready(fmt.Sprint("i", i), 0, time.Duration(i)*time.Second))
			}
			now := t0
			for range 600 {
				now = now.Add(time.Second)
				d := Decide(p, pols, st, now)
				if d.Increase > 0 {
					t.Fatalf("at %s: increase %d after removals (%q)", now.Sub(t0), d.Increase, d.Reasons)
				}
				for _, r := range d.Remove {
					for i := range st.Instances {
						if st.Instances[i].ID == r.ID {
							st.Instances[i].Phase = PhaseRemoving
						}
					}
				}
				// Removed instances vanish at once.
				st.Instances = slices.DeleteFunc(st.Instances, func(v InstanceView) bool { return v.Phase == PhaseRemoving })
			}
			if len(st.Instances) != c.want {
				t.Errorf("settled at %d instances, want %d", len(st.Instances), c.want)
			}
		})
	}
}
