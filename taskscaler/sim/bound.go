package sim

import (
	"math"
	"slices"
	"time"

	"github.com/berthci/berth/fleeting/plugins/fake"
)

// wholeBound is a tighter clairvoyant lower bound than Σ durations ÷
// capacity, still one no scaler beats at zero wait: the instances are
// whole and every one bills its boot and its deletion.
//
// With every job started at its arrival, n(t) jobs run at t, so at least
// m(t) = ⌈n(t) ÷ capacity⌉ instances are up (however the jobs are packed;
// as if jobs could even move between instances, which they cannot). Take
// those instances as levels 1…max m: level ℓ is needed while m(t) ≥ ℓ.
// Each level bills its needed time, one boot and one deletion, and for
// each gap between two needed spans the cheaper of staying up through it
// (the gap) and going and coming back (deletion + boot). Per level that
// is the least any schedule pays; the levels do not constrain each other.
// boot and del are the shortest latencies the cloud can have (a bound
// must hold for the luckiest draw).
//
// It returns the bound in instance-seconds, by day too (each cost counted
// on the day it accrues: the needed time on its days, a boot or a gap's
// cost at the time the level is needed again, a deletion when it ends).
func wholeBound(jobs []Job, capacity int, boot, del time.Duration) (total float64, days map[int]float64) {
	days = map[int]float64{}
	if capacity <= 0 || len(jobs) == 0 {
		return 0, days
	}
	type event struct {
		at    time.Duration
		delta int
	}
	evs := make([]event, 0, 2*len(jobs))
	for _, j := range jobs {
		evs = append(evs, event{j.Arrival, 1}, event{j.Arrival + j.Duration, -1})
	}
	// Ends first: a slot freed at t takes a job arriving at t.
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	add := func(at time.Duration, secs float64) {
		total += secs
		days[int(at/day)] += secs
	}
	// span adds the needed time [from, to) split by day.
	span := func(from, to time.Duration) { splitByDay(from, to, add) }
	var (
		starts []time.Duration // per level: when its current span began
		ends   []time.Duration // per level: when its last span ended (-1: never ran)
		n, m   int
		b, d   = boot.Seconds(), del.Seconds()
	)
	for i := 0; i < len(evs); {
		at := evs[i].at
		for ; i < len(evs) && evs[i].at == at; i++ {
			n += evs[i].delta
		}
		next := (n + capacity - 1) / capacity
		for ; m < next; m++ { // level m+1 needed from at
			if m == len(starts) {
				starts, ends = append(starts, 0), append(ends, -1)
			}
			if ends[m] < 0 {
				add(at, b)
			} else {
				add(at, math.Min((at-ends[m]).Seconds(), b+d))
			}
			starts[m] = at
		}
		for ; m > next; m-- { // level m no longer needed from at
			span(starts[m-1], at)
			ends[m-1] = at
		}
	}
	for _, e := range ends {
		if e >= 0 {
			add(e, d)
		}
	}
	return total, days
}

// shortest is the least latency a distribution yields.
func shortest(d fake.Distribution) time.Duration {
	if d.Kind == "" || d.Kind == "fixed" {
		return time.Duration(d.Value)
	}
	return time.Duration(d.Min)
}
