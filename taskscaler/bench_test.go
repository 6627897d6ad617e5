package taskscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/plugins/fake"
)

// benchEnv returns a scaler with n ready instances of capacity 4, all
// slots taken except the last instance's (so Acquire scans them all).
func benchEnv(b *testing.B, n int, fillAllButLast, predict bool) *env {
	t := &testing.T{}
	e := newEnv(t, Config{CapacityPerInstance: 4, ScaleThrottle: ScaleThrottle{Limit: -1}, Prediction: ptr(predict),
		Policies: []Policy{{IdleCount: 4 * n, IdleTime: time.Hour, PreemptiveMode: ptr(false)}}},
		func(f *fake.Config, _ *Config, o *Options) {
			f.BootLatency = fake.Fixed(0)
			o.Logger = nil
		})
	for e.s.Stats().ReadyFree < 4*n {
		e.step(1)
	}
	if err := e.s.SetPolicies([]Policy{{IdleCount: 0, IdleTime: time.Hour}}); err != nil {
		b.Fatal(err)
	}
	if fillAllButLast {
		for i := range 4 * (n - 1) {
			if _, ok, err := e.s.TryAcquire(fmt.Sprint("fill", i)); !ok || err != nil {
				b.Fatal("fill", i, ok, err)
			}
		}
	}
	return e
}

func BenchmarkReserveAcquireRelease(b *testing.B) {
	for _, n := range []int{10, 10000} {
		for _, full := range []bool{false, true} {
			for _, packing := range []bool{false, true} {
				b.Run(fmt.Sprintf("instances=%d/others_full=%v/packing=%v", n, full, packing), func(b *testing.B) {
					e := benchEnv(b, n, full, packing) // packing follows prediction
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						key := "k"
						if err := e.s.Reserve(key); err != nil {
							b.Fatal(err)
						}
						if _, ok, err := e.s.TryAcquire(key); !ok || err != nil {
							b.Fatal(ok, err)
						}
						if err := e.s.Release(key); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkDecide is one decision over 10,000 instances: the pure
// function alone, and with the snapshot and marking under the lock.
func BenchmarkDecide(b *testing.B) {
	const n = 10000
	p := Params{Capacity: 4, ThrottleLimit: -1, DeletionRetry: time.Minute, CreatingTimeout: 10 * time.Minute}
	pols := policies(b, Policy{Periods: []string{"* 8-18 * * mon-fri"}, IdleCount: 40, IdleTime: 10 * time.Minute}, Policy{IdleCount: 400, IdleTime: 20 * time.Minute})
	st := State{Reserved: 100, Refused: 5}
	for i := range n {
		v := InstanceView{ID: fmt.Sprint("i-", i), Phase: PhaseReady, Acquired: i % 5, Uses: i % 7, Created: t0.Add(-time.Hour),
			IdleSince: t0.Add(-time.Duration(i%3600) * time.Second)}
		if v.Acquired > 4 {
			v.Acquired = 4
		}
		switch i % 50 {
		case 0:
			v.Phase, v.Acquired = PhaseCreating, 0
		case 1:
			v.Phase, v.Acquired = PhaseRemoving, 0
		}
		st.Instances = append(st.Instances, v)
	}
	b.Run("pure", func(b *testing.B) {
		for b.Loop() {
			Decide(p, pols, st, t0)
		}
	})
	b.Run("pure/forecast", func(b *testing.B) {
		st := st
		st.Forecast = &Forecast{Create: 30000, Keep: 30000}
		for b.Loop() {
			Decide(p, pols, st, t0)
		}
	})
	for _, predict := range []bool{false, true} {
		b.Run(fmt.Sprint("scaler/prediction=", predict), func(b *testing.B) {
			// Every instance busy: no decision removes one, so each
			// iteration decides over the same 10,000 instances.
			e := benchEnv(b, n, true, predict)
			b.ResetTimer()
			for b.Loop() {
				e.clock.Advance(time.Second) // a decision a second, as Run makes them
				e.s.decide()
			}
		})
	}
}
