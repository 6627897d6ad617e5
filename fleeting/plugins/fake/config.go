package fake

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Duration is a time.Duration that reads from JSON either as a Go duration
// string ("1.5s", "2m") or as a number of nanoseconds.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration must be a string like \"1.5s\" or a number of nanoseconds")
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return fmt.Errorf("duration %s: %w", n, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Distribution is a distribution of durations, for boot and delete
// latencies. Samples are clamped to [Min, Max] when those are set (Max 0
// means no upper bound) and are never negative.
//
//	{"kind": "fixed", "value": "30s"}
//	{"kind": "uniform", "min": "20s", "max": "40s"}
//	{"kind": "normal", "mean": "30s", "stddev": "5s", "min": "10s"}
//	{"kind": "exponential", "mean": "30s"}
//	{"kind": "lognormal", "mean": "30s", "stddev": "20s"}
//
// The zero value is fixed at 0 (instant).
type Distribution struct {
	Kind   string   `json:"kind"`
	Value  Duration `json:"value"`
	Min    Duration `json:"min"`
	Max    Duration `json:"max"`
	Mean   Duration `json:"mean"`
	StdDev Duration `json:"stddev"`
}

// Fixed returns a distribution that always yields d.
func Fixed(d time.Duration) Distribution { return Distribution{Kind: "fixed", Value: Duration(d)} }

// Uniform returns a uniform distribution over [lo, hi].
func Uniform(lo, hi time.Duration) Distribution {
	return Distribution{Kind: "uniform", Min: Duration(lo), Max: Duration(hi)}
}

// Validate checks the distribution's parameters.
func (d Distribution) Validate() error {
	if d.Value < 0 || d.Min < 0 || d.Max < 0 || d.Mean < 0 || d.StdDev < 0 {
		return errors.New("negative duration")
	}
	if d.Max > 0 && d.Min > d.Max {
		return fmt.Errorf("min %s above max %s", time.Duration(d.Min), time.Duration(d.Max))
	}
	switch d.Kind {
	case "", "fixed", "normal", "exponential":
	case "uniform":
		if d.Max == 0 && d.Min > 0 {
			return errors.New("uniform needs max")
		}
	case "lognormal":
		if d.Mean == 0 && d.StdDev > 0 {
			return errors.New("lognormal needs a mean")
		}
	default:
		return fmt.Errorf("unknown distribution kind %q (want fixed, uniform, normal, exponential or lognormal)", d.Kind)
	}
	return nil
}

// Sample draws one duration.
func (d Distribution) Sample(r *rand.Rand) time.Duration {
	var v float64
	switch d.Kind {
	case "", "fixed":
		v = float64(d.Value)
	case "uniform":
		v = float64(d.Min) + r.Float64()*float64(d.Max-d.Min)
	case "normal":
		v = float64(d.Mean) + r.NormFloat64()*float64(d.StdDev)
	case "exponential":
		v = r.ExpFloat64() * float64(d.Mean)
	case "lognormal":
		m, s := float64(d.Mean), float64(d.StdDev)
		if m > 0 {
			// Parameters of the underlying normal for the wanted mean and
			// standard deviation.
			sigma2 := math.Log(1 + (s*s)/(m*m))
			mu := math.Log(m) - sigma2/2
			v = math.Exp(mu + r.NormFloat64()*math.Sqrt(sigma2))
		}
	}
	if v < float64(d.Min) {
		v = float64(d.Min)
	}
	if d.Max > 0 && v > float64(d.Max) {
		v = float64(d.Max)
	}
	if v < 0 || math.IsNaN(v) {
		v = 0
	}
	if v > math.MaxInt64 {
		v = math.MaxInt64
	}
	return time.Duration(v)
}

// Config configures a simulated cloud. JSON names are the plugin_config
// keys.
type Config struct {
	// Name appears in the group ID ("fake/<name>") and prefixes instance
	// IDs ("<name>-<n>"). Default "fake".
	Name string `json:"name"`
	// Seed seeds the random source: the same seed and the same calls give
	// the same instances, latencies and failures.
	Seed uint64 `json:"seed"`
	// MaxSize is the quota: instances in any state but deleted. 0 means
	// unlimited.
	MaxSize int `json:"max_size"`
	// BootLatency is how long an instance stays creating.
	BootLatency Distribution `json:"boot_latency"`
	// DeleteLatency is how long an instance stays deleting.
	DeleteLatency Distribution `json:"delete_latency"`
	// IncreaseErrorRate is the probability that an Increase call fails
	// (creating nothing).
	IncreaseErrorRate float64 `json:"increase_error_rate"`
	// NeverRunningRate is the probability that a new instance stays
	// creating forever.
	NeverRunningRate float64 `json:"never_running_rate"`
	// VanishRate is the probability that a new instance vanishes (is no
	// longer listed, as a reclaimed spot instance) VanishAfter after it
	// started running.
	VanishRate  float64      `json:"vanish_rate"`
	VanishAfter Distribution `json:"vanish_after"`
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.MaxSize < 0 {
		errs = append(errs, errors.New("max_size: negative"))
	}
	for name, r := range map[string]float64{
		"increase_error_rate": c.IncreaseErrorRate,
		"never_running_rate":  c.NeverRunningRate,
		"vanish_rate":         c.VanishRate,
	} {
		if !(r >= 0 && r <= 1) {
			errs = append(errs, fmt.Errorf("%s: %v is not a probability in [0, 1]", name, r))
		}
	}
	for name, d := range map[string]Distribution{
		"boot_latency":   c.BootLatency,
		"delete_latency": c.DeleteLatency,
		"vanish_after":   c.VanishAfter,
	} {
		if err := d.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
