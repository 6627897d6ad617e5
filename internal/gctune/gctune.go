// Package gctune gives a long-running Berth process a heap floor: while the live heap is small,
// the garbage collector waits until the heap reaches the floor instead of running every time it
// doubles.
//
// A coordinator's live heap is small (tens of MiB) and it allocates fast (a job's payload, its
// tokens, the JSON of every request), so at Go's default (GOGC=100) it collects several times a
// second and the collector took a fifth of its CPU in `berth bench dispatch`. Raising GOGC for
// good would multiply a large heap too; a floor only changes what happens below it. After every
// collection the tuner sets the GC percentage so that the next goal is the floor, or Go's
// default goal where that is higher. GOGC in the environment (any value) turns
// the tuner off; GOMEMLIMIT still caps the heap as always (the runtime's goal is the lower of the
// two).
package gctune

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"

	units "github.com/docker/go-units"
)

// DefaultFloor is the heap floor of Berth's daemons: enough to collect a few times per thousand
// jobs instead of a hundred, little beside what a machine running a coordinator has.
const DefaultFloor = 128 << 20

// basePercent is Go's default GOGC, used above the floor.
const basePercent = 100

// heapMinimum is the runtime's smallest heap goal at GOGC=100 (runtime.defaultHeapMinimum); it
// scales with the percentage.
const heapMinimum = 4 << 20

// maxPercent bounds the percentage set for a tiny live heap (the goal is the floor anyway).
const maxPercent = 1_000_000

// Tuner adjusts the GC percentage after every collection while it runs.
type Tuner struct {
	floor uint64

	mu      sync.Mutex
	stopped bool
	percent int
	runs    int
	sample  []metrics.Sample
}

// active is set while a tuner runs: the GC percentage is the process's, so one tuner at a time.
var active atomic.Bool

// Start starts a tuner with the given floor in bytes. It returns nil, and changes nothing, when
// floor is 0, GOGC is set in the environment or another tuner runs.
func Start(floor uint64) *Tuner {
	if floor == 0 {
		return nil
	}
	if _, set := os.LookupEnv("GOGC"); set {
		return nil
	}
	if !active.CompareAndSwap(false, true) {
		return nil
	}
	t := &Tuner{
		floor:   floor,
		percent: basePercent,
		sample: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},
			{Name: "/gc/scan/stack:bytes"},
			{Name: "/gc/scan/globals:bytes"},
		},
	}
	t.adjust()
	t.arm()
	return t
}

// Stop stops the tuner and puts back Go's default percentage. Stop on nil does nothing.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	debug.SetGCPercent(basePercent)
	active.Store(false)
}

// Percent is the GC percentage the tuner set last.
func (t *Tuner) Percent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.percent
}

// Adjustments counts the collections the tuner has seen.
func (t *Tuner) Adjustments() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runs
}

// arm registers a cleanup on a fresh object nothing refers to: it runs after the next collection
// (and arms the one after).
func (t *Tuner) arm() {
	sentinel := new([64]byte) // not a tiny allocation, whose cleanup might never run
	runtime.AddCleanup(sentinel, func(t *Tuner) {
		if t.adjust() {
			t.arm()
		}
	}, t)
}

// adjust sets the percentage for the live heap the last collection measured; false once stopped.
func (t *Tuner) adjust() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.runs++
	metrics.Read(t.sample)
	var v [3]uint64
	for i, s := range t.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	p := PercentFor(v[0], v[1]+v[2], t.floor)
	if p != t.percent {
		debug.SetGCPercent(p)
		t.percent = p
	}
	return true
}

// PercentFor is the GC percentage that puts the heap goal at the floor, or Go's 100 where that
// is higher, for a live heap of live bytes and roots (goroutine stacks and globals) of roots
// bytes. The runtime's goal is live + (live + roots) × percent ÷ 100, and at least its heap
// minimum, 4 MiB × percent ÷ 100: the percentage never puts that minimum above the floor.
func PercentFor(live, roots, floor uint64) int {
	if live == 0 {
		live = 1 << 20 // before the first collection: as if a MiB were live
	}
	scan := float64(live + roots)
	if float64(live)+scan*basePercent/100 >= float64(floor) {
		return basePercent
	}
	p := (float64(floor) - float64(live)) / scan * 100
	p = min(p, float64(floor)/heapMinimum*100, maxPercent)
	return max(int(p), basePercent)
}

// EnvFloor names the environment variable that sets the floor: a size in bytes or with a unit
// ("512MiB", "1g"), 0 to turn the tuner off.
const EnvFloor = "BERTH_GC_HEAP_FLOOR"

// FloorFromEnv is the floor $BERTH_GC_HEAP_FLOOR sets, DefaultFloor when it is unset or empty.
func FloorFromEnv() (uint64, error) {
	v := strings.TrimSpace(os.Getenv(EnvFloor))
	if v == "" {
		return DefaultFloor, nil
	}
	n, err := units.RAMInBytes(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: not a size (bytes, or with a unit such as 256MiB; 0 turns the heap floor off)", EnvFloor, v)
	}
	return uint64(n), nil
}
