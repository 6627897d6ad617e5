package fake_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/plugins/fake"
	"github.com/berthci/berth/fleeting/sdk"
)

func TestDecodeConfig(t *testing.T) {
	var g fake.Group
	err := sdk.DecodeConfig([]byte(`{"seed": 3, "max_size": 5, "boot_latency": {"kind": "uniform", "min": "10s", "max": 20000000000}, "vanish_rate": 0.5}`), &g)
	if err != nil {
		t.Fatal(err)
	}
	if g.Seed != 3 || g.MaxSize != 5 || g.VanishRate != 0.5 ||
		time.Duration(g.BootLatency.Min) != 10*time.Second || time.Duration(g.BootLatency.Max) != 20*time.Second {
		t.Fatalf("decoded %+v", g.Config)
	}
	if err := sdk.DecodeConfig([]byte(`{"max_sise": 5}`), &fake.Group{}); err == nil {
		t.Fatal("an unknown key was accepted")
	}
	if err := sdk.DecodeConfig([]byte(`{"boot_latency": {"min": "soon"}}`), &fake.Group{}); err == nil {
		t.Fatal("a bad duration was accepted")
	}
}

func FuzzConfig(f *testing.F) {
	f.Add([]byte(`{"seed": 3, "boot_latency": {"kind": "normal", "mean": "30s", "stddev": "5s"}}`))
	f.Add([]byte(`{"boot_latency": {"kind": "lognormal", "mean": 1, "stddev": 9223372036854775807}}`))
	f.Add([]byte(`{"delete_latency": {"kind": "exponential", "mean": "1h"}, "never_running_rate": 0.1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var g fake.Group
		if err := sdk.DecodeConfig(data, &g); err != nil {
			return
		}
		if err := g.Config.Validate(); err != nil {
			return
		}
		r := rand.New(rand.NewPCG(1, 2))
		for _, d := range []fake.Distribution{g.BootLatency, g.DeleteLatency, g.VanishAfter} {
			for range 3 {
				v := d.Sample(r)
				if v < 0 {
					t.Fatalf("%+v sampled %v", d, v)
				}
				if d.Max > 0 && v > time.Duration(d.Max) {
					t.Fatalf("%+v sampled %v above max", d, v)
				}
			}
		}
	})
}
