package router

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the router's Prometheus metrics. The cell label is a cell
// id, "router" for the router's own endpoints, or "none" for requests it
// refused.
type metrics struct {
	gatherer       prometheus.Gatherer
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	routes         *prometheus.CounterVec
	proxyErrors    *prometheus.CounterVec
	healthFailures *prometheus.CounterVec
	cellUp         *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, gat prometheus.Gatherer) *metrics {
	if reg == nil || gat == nil {
		r := prometheus.NewRegistry()
		reg, gat = r, r
	}
	m := &metrics{
		gatherer: gat,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_router_requests_total",
			Help: "Requests by cell and status code (499: the client went away first)."}, []string{"cell", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "berth_router_request_duration_seconds",
			Help:    "Time to answer a request, by cell (jobs/request long polls are held up to ~50 s).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}}, []string{"cell"}),
		routes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_router_routes_total",
			Help: "Routing decisions by cell and by what decided (runner_token, job_token, body, cell_header, default, …)."}, []string{"cell", "by"}),
		proxyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_router_proxy_errors_total",
			Help: "Requests a cell did not answer (502) and failed discovery fetches, by cell."}, []string{"cell"}),
		healthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_router_health_check_failures_total",
			Help: "Failed health checks by cell."}, []string{"cell"}),
		cellUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "berth_router_cell_up",
			Help: "1 if the cell counts as healthy, 0 if its requests get 503."}, []string{"cell"}),
	}
	m.requests = register(reg, m.requests)
	m.duration = register(reg, m.duration)
	m.routes = register(reg, m.routes)
	m.proxyErrors = register(reg, m.proxyErrors)
	m.healthFailures = register(reg, m.healthFailures)
	m.cellUp = register(reg, m.cellUp)
	return m
}

// register registers c, or returns the collector of its name registered
// already (a second router on one registry shares the first's).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if e, ok := are.ExistingCollector.(T); ok {
				return e
			}
		}
	}
	return c
}

func (m *metrics) observe(cell string, code int, d time.Duration) {
	m.requests.WithLabelValues(cell, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(cell).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{})
}
