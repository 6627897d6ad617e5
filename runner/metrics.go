package runner

import "github.com/prometheus/client_golang/prometheus"

// metrics are the manager's Prometheus metrics.
type metrics struct {
	running    *prometheus.GaugeVec
	duration   *prometheus.HistogramVec
	requests   *prometheus.CounterVec
	traceBytes *prometheus.CounterVec
	// pushJobs counts pushed jobs by answer, pushFallbacks the times an
	// entry with the push channel fell back to long polling, by reason.
	pushJobs      *prometheus.CounterVec
	pushFallbacks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "berth_runner_jobs_running", Help: "Jobs running now.",
		}, []string{"runner"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "berth_runner_job_duration_seconds", Help: "Duration of finished jobs, by final state.",
			Buckets: []float64{1, 5, 15, 30, 60, 300, 600, 1800, 3600, 7200},
		}, []string{"runner", "state"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_runner_job_requests_total", Help: "jobs/request calls by outcome (job, no_job, forbidden, conflict, orphaned, rate_limited, error).",
		}, []string{"runner", "outcome"}),
		traceBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_runner_trace_bytes_total", Help: "Job log bytes accepted by the coordinator.",
		}, []string{"runner"}),
	}
	m.pushJobs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_runner_push_jobs_total", Help: "Jobs pushed to the runner by answer (admitted, rejected); ack_on_rest counts admitted jobs acknowledged on REST because the stream did not answer their admit.",
	}, []string{"runner", "outcome"})
	m.pushFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_runner_push_fallbacks_total", Help: "Falls back from the job push channel to long polling, by reason (no_discovery, router_disabled, discovery_failed, dial_failed, unauthenticated, stream_ended).",
	}, []string{"runner", "reason"})
	reg.MustRegister(m.running, m.duration, m.requests, m.traceBytes, m.pushJobs, m.pushFallbacks)
	return m
}
