package coordinator

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the coordinator's HTTP-level Prometheus metrics; its parts
// (dispatch, joblog, runnerhttp) register their own on the same
// registerer.
type metrics struct {
	gatherer   prometheus.Gatherer
	registerer prometheus.Registerer
	requests   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, gat prometheus.Gatherer) *metrics {
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, gat = r, r
	}
	m := &metrics{
		gatherer: gat, registerer: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_coordinator_http_requests_total",
			Help: "HTTP requests by route pattern and status code."}, []string{"route", "code"}),
	}
	for _, c := range []prometheus.Collector{m.requests} {
		// A second coordinator on the same registry (tests, restarts in
		// process) reuses the first one's collectors' names: skip.
		_ = reg.Register(c)
	}
	return m
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
