package main

import (
	"context"
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is an idem.Observer that feeds Prometheus: one counter per
// outcome and the claim's latency.
type metrics struct {
	outcomes *prometheus.CounterVec
	claim    prometheus.Histogram
	handler  http.Handler
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_requests_total",
			Help: "Requests through the idempotency middleware, by outcome.",
		}, []string{"outcome"}),
		claim: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_claim_duration_seconds",
			Help:    "Time the store took to claim an idempotency key.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 0.1ms … 3.3s
		}),
	}
	// Every outcome is exported from the start, at zero, so that rates
	// and alerts need no "absent" special case.
	for _, o := range idem.Outcomes {
		m.outcomes.WithLabelValues(string(o))
	}
	reg.MustRegister(m.outcomes, m.claim,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// Observe implements idem.Observer.
func (m *metrics) Observe(_ context.Context, ev idem.Event) {
	m.outcomes.WithLabelValues(string(ev.Outcome)).Inc()
	if ev.ClaimLatency > 0 {
		m.claim.Observe(ev.ClaimLatency.Seconds())
	}
}
