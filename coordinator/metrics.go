package coordinator

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthci/berth/coordinator/store"
)

// metrics are the coordinator's Prometheus metrics. They are cheap on the
// hot path: counters and one histogram observation per hand-out.
type metrics struct {
	gatherer  prometheus.Gatherer
	enqueued  prometheus.Counter
	assigned  prometheus.Counter
	conflicts prometheus.Counter
	finished  *prometheus.CounterVec
	pickup    prometheus.Histogram
	requests  *prometheus.CounterVec
	trace     prometheus.Counter
	// traceRejected counts trace PATCHes refused past MaxTraceSize.
	traceRejected prometheus.Counter
	// registerer receives the metrics of the coordinator's parts.
	registerer prometheus.Registerer
}

func newMetrics(s *Server, reg prometheus.Registerer, gat prometheus.Gatherer) *metrics {
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gat = r, r
	}
	m := &metrics{
		gatherer: gat, registerer: reg,
		enqueued: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_jobs_enqueued_total",
			Help: "Jobs that entered the queue (pending)."}),
		assigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_jobs_assigned_total",
			Help: "Jobs handed to a runner (jobs/request answered 201)."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_assignment_conflicts_total",
			Help: "Hand-outs lost to another process (jobs/request answered 409)."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_coordinator_jobs_finished_total",
			Help: "Jobs that reached a final status, by status and failure reason."}, []string{"status", "failure_reason"}),
		pickup: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_coordinator_job_queue_seconds",
			Help:    "Time from a job becoming pending to its hand-out.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 15, 60, 300, 1800, 3600}}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_coordinator_http_requests_total",
			Help: "HTTP requests by route pattern and status code."}, []string{"route", "code"}),
		trace: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_trace_bytes_total",
			Help: "Job log bytes appended."}),
		traceRejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_coordinator_trace_patches_rejected_total",
			Help: "Job log appends refused because the log would exceed the size limit (the job fails with trace_size_exceeded)."}),
	}
	queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_queue_jobs",
		Help: "Jobs waiting in the queue."}, func() float64 { return float64(s.queue.Len()) })
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_long_polls_waiting",
		Help: "jobs/request long polls held waiting for a job."}, func() float64 { return float64(s.queue.Waiting()) })
	active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_coordinator_jobs_handed_out",
		Help: "Jobs handed to runners and not finished."}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.active))
	})
	for _, c := range []prometheus.Collector{m.enqueued, m.assigned, m.conflicts, m.finished, m.pickup, m.requests, m.trace, m.traceRejected, queued, waiting, active} {
		// A second coordinator on the same registry (tests, restarts in
		// process) reuses the first one's collectors' names: skip.
		_ = reg.Register(c)
	}
	return m
}

// push queues a job that just became pending.
func (s *Server) push(j *store.Job) {
	s.metrics.enqueued.Inc()
	s.queue.Push(s.queueJob(j))
}

func (m *metrics) jobFinished(j *store.Job) {
	m.finished.WithLabelValues(string(j.Status), j.FailureReason).Inc()
}

func (m *metrics) request(pattern string, code int) {
	if pattern == "" {
		pattern = "unmatched"
	}
	m.requests.WithLabelValues(pattern, strconv.Itoa(code)).Inc()
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{})
}
