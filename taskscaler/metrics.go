package taskscaler

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scaler's Prometheus metrics, under berth_taskscaler_. To
// run several scalers on one registry, give each a registerer wrapped with
// a distinguishing label (prometheus.WrapRegistererWith).
type metrics struct {
	instances      *prometheus.GaugeVec   // by phase
	slots          *prometheus.GaugeVec   // acquired, reserved, idle (free on ready instances)
	decisions      *prometheus.CounterVec // by outcome: scale_up, scale_down, scale_up_and_down, hold
	requested      prometheus.Counter     // instances accepted by Increase
	increaseErrors prometheus.Counter
	removals       *prometheus.CounterVec // by reason
	readyUp        prometheus.Histogram   // first seen → ready, seconds
	readyUpFailed  prometheus.Counter
	acquireWait    prometheus.Histogram // Acquire call → slot, seconds
	acquireFailed  *prometheus.CounterVec
	reserveRefused *prometheus.CounterVec
	lost           prometheus.Counter   // instances gone while holding jobs
	life           prometheus.Histogram // first seen → pruned, seconds
	overdue        prometheus.Gauge     // instances booting past State.Overdue
	spare          *prometheus.GaugeVec // the forecast's spare by sizing: poisson, measured
	riseSkill      prometheus.Gauge     // share of the profiles' expected rises that came lately

	// children looked up by label once, at their first use (a decision
	// sets them every second; a lookup hashes its labels each time).
	children map[childKey]prometheus.Gauge
	counts   map[childKey]prometheus.Counter
}

// childKey names one child of a vector: the vector and its label value.
type childKey struct {
	vec   any
	label string
}

// gauge is vec's child for label, looked up once.
func (m *metrics) gauge(vec *prometheus.GaugeVec, label string) prometheus.Gauge {
	return child(m.children, vec, label, vec.WithLabelValues)
}

// counter is vec's child for label, looked up once.
func (m *metrics) counter(vec *prometheus.CounterVec, label string) prometheus.Counter {
	return child(m.counts, vec, label, vec.WithLabelValues)
}

// child is the cached child of vec for label, looked up with get the
// first time.
func child[T any](cache map[childKey]T, vec any, label string, get func(...string) T) T {
	k := childKey{vec, label}
	c, ok := cache[k]
	if !ok {
		c = get(label)
		cache[k] = c
	}
	return c
}

func newMetrics(reg prometheus.Registerer, c *Config) (*metrics, error) {
	buckets := func(b []float64, def []float64) []float64 {
		if len(b) > 0 {
			return b
		}
		return def
	}
	const ns, sub = "berth", "taskscaler"
	m := &metrics{
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "instances",
			Help: "Instances by phase (creating, booted, ready, removing, deleting)."}, []string{"phase"}),
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "slots",
			Help: "Job slots: acquired, reserved (no slot yet) and idle (free on ready instances)."}, []string{"state"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Scaling decisions by outcome."}, []string{"outcome"}),
		requested: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scale_ups_total",
			Help: "Instances the plugin accepted to create."}),
		increaseErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "increase_errors_total",
			Help: "Increase calls that failed."}),
		removals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scale_downs_total",
			Help: "Instances chosen for removal, by reason."}, []string{"reason"}),
		readyUp: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "ready_up_seconds",
			Help:    "Time from an instance first listed to ready for jobs.",
			Buckets: buckets(c.InstanceReadyUpTimeBuckets, []float64{5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600})}),
		readyUpFailed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ready_up_failures_total",
			Help: "Ready-up attempts that failed."}),
		acquireWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "acquire_wait_seconds",
			Help:    "Time Acquire waited for a slot.",
			Buckets: buckets(c.InstanceAcquireTimeBuckets, []float64{0.001, 0.01, 0.1, 1, 5, 15, 30, 60, 120, 300, 900})}),
		acquireFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "acquire_failures_total",
			Help: "Acquire calls that got no slot, by reason."}, []string{"reason"}),
		reserveRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reserve_refused_total",
			Help: "Reserve calls refused, by reason."}, []string{"reason"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "instances_lost_total",
			Help: "Instances that disappeared while jobs held slots on them."}),
		life: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "instance_life_seconds",
			Help:    "Time from an instance first listed to gone.",
			Buckets: buckets(c.InstanceLifeDurationBuckets, []float64{60, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400})}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "instances_overdue",
			Help: "Instances still not ready twice the measured boot latency after their request (prediction only)."}),
		spare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "forecast_spare_slots",
			Help: "Slots the forecast's spare would provide within a boot, as prediction_spare poisson and measured size it (prediction only; both whichever is in use)."}, []string{"spare"}),
		riseSkill: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "forecast_rise_skill",
			Help: "Share of the rises the learned profiles expected lately that came, 0 to 1; under 0.5 their rises are not heeded (prediction only)."}),
		children: map[childKey]prometheus.Gauge{},
		counts:   map[childKey]prometheus.Counter{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.instances, m.slots, m.decisions, m.requested, m.increaseErrors, m.removals,
			m.readyUp, m.readyUpFailed, m.acquireWait, m.acquireFailed, m.reserveRefused, m.lost, m.life, m.overdue, m.spare, m.riseSkill} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
