package gctune

import (
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		name               string
		live, roots, floor uint64
		want               int
	}{
		// goal = 16 + (16+4) × p/100 = 128 → p = 560
		{"below the floor", 16 * MiB, 4 * MiB, 128 * MiB, 560},
		// goal at GOGC=100 is 64 + 66 = 130 ≥ 128: Go's default
		{"Go's goal above the floor", 64 * MiB, 2 * MiB, 128 * MiB, 100},
		{"live heap above the floor", 512 * MiB, 0, 128 * MiB, 100},
		// (128-1)/1 would be 12,700 %, whose heap minimum (4 MiB × 127) is far above the
		// floor: capped so that the minimum is the floor (128/4 × 100)
		{"tiny heap: the runtime's minimum caps it", 1 * MiB, 0, 128 * MiB, 3200},
		{"nothing measured yet: as if a MiB were live", 0, 0, 128 * MiB, 3200},
		{"floor below Go's minimum", 1 * MiB, 0, 2 * MiB, 100},
	} {
		if got := PercentFor(c.live, c.roots, c.floor); got != c.want {
			t.Errorf("%s: PercentFor(%d, %d, %d) = %d, want %d", c.name, c.live, c.roots, c.floor, got, c.want)
		}
	}
}

// gogc is the GC percentage the runtime uses now.
func gogc(t *testing.T) int {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// collect runs a collection and waits for the tuner to have seen it.
func collect(t *testing.T, tu *Tuner) {
	t.Helper()
	n := tu.Adjustments()
	deadline := time.Now().Add(10 * time.Second)
	for tu.Adjustments() == n {
		if time.Now().After(deadline) {
			t.Fatalf("no adjustment after a collection (%d so far)", n)
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

var sink [][]byte

func TestTunerFollowsTheLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "") // restored after the test…
	unsetenv(t, "GOGC")  // …and unset during it
	const floor = 64 << 20
	tu := Start(floor)
	if tu == nil {
		t.Fatal("Start returned nil without GOGC")
	}
	defer tu.Stop()
	if Start(floor) != nil {
		t.Error("a second tuner started while one runs")
	}

	collect(t, tu)
	if p := tu.Percent(); p <= 100 || gogc(t) != p {
		t.Errorf("small heap: tuner's percent %d, runtime's %d; want the same, above 100", p, gogc(t))
	}

	// A live heap above the floor: Go's default again.
	for range 96 {
		sink = append(sink, make([]byte, 1<<20))
	}
	collect(t, tu)
	collect(t, tu) // the second sees the heap the first marked
	if p := tu.Percent(); p != 100 || gogc(t) != 100 {
		t.Errorf("live heap of 96 MiB over a 64 MiB floor: tuner's percent %d, runtime's %d; want 100", p, gogc(t))
	}
	sink = nil
	collect(t, tu)
	collect(t, tu)
	if p := tu.Percent(); p <= 100 {
		t.Errorf("heap freed again: percent %d, want above 100", p)
	}

	tu.Stop()
	if gogc(t) != 100 {
		t.Errorf("after Stop the runtime's percent is %d, want 100", gogc(t))
	}
	n := tu.Adjustments()
	runtime.GC()
	runtime.GC()
	time.Sleep(20 * time.Millisecond)
	if tu.Adjustments() != n || gogc(t) != 100 {
		t.Errorf("a stopped tuner adjusted again (%d → %d, percent %d)", n, tu.Adjustments(), gogc(t))
	}
	if again := Start(floor); again == nil {
		t.Error("no tuner could start after the first stopped")
	} else {
		again.Stop()
	}
}

func TestGOGCTurnsItOff(t *testing.T) {
	t.Setenv("GOGC", "100")
	if tu := Start(64 << 20); tu != nil {
		tu.Stop()
		t.Fatal("a tuner started with GOGC set")
	}
	unsetenv(t, "GOGC")
	if tu := Start(0); tu != nil {
		tu.Stop()
		t.Fatal("a tuner started with a floor of 0")
	}
}

func TestFloorFromEnv(t *testing.T) {
	for _, c := range []struct {
		v       string
		want    uint64
		wantErr bool
	}{
		{"", DefaultFloor, false},
		{"256MiB", 256 << 20, false},
		{"1g", 1 << 30, false},
		{"0", 0, false},
		{"1048576", 1 << 20, false},
		{"lots", 0, true},
		{"-5m", 0, true},
	} {
		t.Setenv(EnvFloor, c.v)
		got, err := FloorFromEnv()
		if c.wantErr {
			if err == nil || !strings.Contains(err.Error(), EnvFloor) {
				t.Errorf("%q: error %v, want one naming %s", c.v, err, EnvFloor)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.v, got, err, c.want)
		}
	}
}

// unsetenv unsets key for the rest of the test (after t.Setenv, which puts it back).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
