package main

import (
	"net/http"

	idemprom "github.com/idemgo/idem/observers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsRoutes are the idempotent routes, exported at zero for every
// outcome from the start so that rates and the alerts in alerts.yml need
// no "absent" special case.
var metricsRoutes = []string{"/payments"}

// newMetrics returns idemprom's metrics, the engine's Observer and the
// sweeper's, on the service's own registry, with the handler of GET
// /metrics that serves it.
func newMetrics() (*idemprom.Metrics, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := idemprom.New(reg, idemprom.Options{Routes: metricsRoutes})
	if err != nil {
		return nil, nil, err
	}
	return m, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
