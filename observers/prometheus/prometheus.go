// Package idemprom exports what the idempotency engine and its sweeper see
// as Prometheus metrics. One Metrics value is both the engine's
// Config.Observer and the Sweeper's Observer:
//
//	m, err := idemprom.New(reg, idemprom.Options{Routes: []string{"/payments"}})
//	cfg.Observer = m
//	sweeper.Observer = m
//
// The metrics, under Options.Namespace (default "idem"):
//
//	idem_requests_total{outcome, route}          counter: one per request, by idem.OutcomeLabel and Event.Route
//	idem_claim_duration_seconds                  histogram: the store's Claim latency
//	idem_stale_claims                            gauge: in-progress records past the lease the last sweep left unresolved
//	idem_stale_claim_oldest_age_seconds          gauge: age of the oldest stale claim the last sweep listed, 0 when none
//	idem_sweep_stale_total{result}               counter: stale claims the sweeper resolved or tried to, by result:
//	                                             reconciled, released, raced, failed (Sweeper.Engine with Config.Reconcile)
//	idem_sweep_purged_total                      counter: expired records the sweeper deleted
//	idem_sweep_errors_total                      counter: sweeps that failed
//	idem_sweep_last_success_timestamp_seconds    gauge: when a sweep last succeeded (Unix time)
//
// The route label is Event.Route, the route template the adapter matched
// (or Call.Route), never the raw path: its cardinality is the number of
// routes. It is empty when the adapter did not know the route.
package idemprom

import (
	"context"
	"errors"
	"fmt"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBuckets are the claim latency histogram's buckets: 100µs doubling
// to 3.3s.
var DefaultBuckets = prometheus.ExponentialBuckets(0.0001, 2, 16)

// Options configures New. The zero value is valid.
type Options struct {
	// Namespace prefixes every metric name. Default "idem".
	Namespace string
	// Buckets of the claim latency histogram, in seconds. Default
	// DefaultBuckets.
	Buckets []float64
	// Routes are exported at zero for every outcome from the start, so
	// that rates and alerts over them need no "absent" case. Requests on
	// other routes are counted as they come.
	Routes []string
	// ConstLabels are added to every metric (an instance, a service).
	ConstLabels prometheus.Labels
	// Now is the clock the stale claims' age is measured with. Default
	// time.Now.
	Now func() time.Time
}

// Metrics is an idem.Observer and an idem.SweepObserver that feeds
// Prometheus metrics. It is safe for concurrent use.
type Metrics struct {
	requests    *prometheus.CounterVec
	claim       prometheus.Histogram
	waits       *prometheus.HistogramVec
	stale       prometheus.Gauge
	staleAge    prometheus.Gauge
	resolved    *prometheus.CounterVec
	purged      prometheus.Counter
	sweepErrors prometheus.Counter
	lastSweep   prometheus.Gauge
	inProgress  prometheus.Gauge
	expired     prometheus.Gauge
	now         func() time.Time
}

var (
	_ idem.Observer      = (*Metrics)(nil)
	_ idem.SweepObserver = (*Metrics)(nil)
)

// New creates the metrics and registers them on reg, which is required:
// Metrics never registers on the global registry on its own (pass
// prometheus.DefaultRegisterer to do that). It fails when reg refuses a
// metric, for instance because the names are registered already.
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("idemprom: a prometheus.Registerer is required")
	}
	ns := opts.Namespace
	if ns == "" {
		ns = "idem"
	}
	buckets := opts.Buckets
	if buckets == nil {
		buckets = DefaultBuckets
	}
	cl := opts.ConstLabels
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "requests_total", ConstLabels: cl,
			Help: "Requests through the idempotency engine, by outcome and route template.",
		}, []string{"outcome", "route"}),
		claim: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "claim_duration_seconds", ConstLabels: cl, Buckets: buckets,
			Help: "Time the store took to claim an idempotency key.",
		}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "wait_duration_seconds", ConstLabels: cl, Buckets: prometheus.DefBuckets,
			Help: "Time requests waited for the attempt holding their key (Config.WaitInFlight), by how the wait ended: replayed, claimed_after_release, timed_out, cancelled, refused (a waiter cap), answered.",
		}, []string{"outcome"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "stale_claims", ConstLabels: cl,
			Help: "In-progress records older than the lease that the last sweep left unresolved (at most the sweeper's batch size): crashed attempts whose external effect is unknown.",
		}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "sweep_stale_total", ConstLabels: cl,
			Help: "Stale claims the sweeper took over, by result: reconciled (answer stored), released, raced (another attempt was first), failed.",
		}, []string{"result"}),
		staleAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "stale_claim_oldest_age_seconds", ConstLabels: cl,
			Help: "Age of the oldest stale claim at the last sweep, since its lease was taken; 0 when there is none.",
		}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "sweep_purged_total", ConstLabels: cl,
			Help: "Expired idempotency records the sweeper deleted.",
		}),
		sweepErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "sweep_errors_total", ConstLabels: cl,
			Help: "Sweeps that failed.",
		}),
		lastSweep: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "sweep_last_success_timestamp_seconds", ConstLabels: cl,
			Help: "Unix time of the last successful sweep.",
		}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "in_progress_records", ConstLabels: cl,
			Help: "In-progress records at the last sweep, stale ones included (set when the Sweeper's CountRecords is on and the store counts them).",
		}),
		expired: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "expired_records", ConstLabels: cl,
			Help: "Expired records still to be purged at the last sweep (set when the Sweeper's CountRecords is on and the store counts them).",
		}),
		now: opts.Now,
	}
	if m.now == nil {
		m.now = time.Now
	}
	for _, r := range opts.Routes {
		for _, o := range idem.Outcomes {
			m.requests.WithLabelValues(string(o), r)
		}
	}
	for _, o := range idem.WaitOutcomes {
		m.waits.WithLabelValues(string(o))
	}
	for _, r := range []string{"reconciled", "released", "raced", "failed"} {
		m.resolved.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.requests, m.claim, m.waits, m.stale, m.staleAge, m.resolved, m.purged, m.sweepErrors, m.lastSweep, m.inProgress, m.expired} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("idemprom: register: %w", err)
		}
	}
	return m, nil
}

// Observe implements idem.Observer: it counts the request by outcome and
// route, records the claim's latency when a claim was made, and the wait
// by its outcome when the request waited for its key's holder.
func (m *Metrics) Observe(_ context.Context, ev idem.Event) {
	m.requests.WithLabelValues(string(ev.Outcome), ev.Route).Inc()
	if ev.ClaimLatency > 0 {
		m.claim.Observe(ev.ClaimLatency.Seconds())
	}
	if ev.Wait != "" {
		m.waits.WithLabelValues(string(ev.Wait)).Observe(ev.Waited.Seconds())
	}
}

// ObserveSweep implements idem.SweepObserver. A sweep that counted the
// store's records (Sweeper.CountRecords) sets the in-progress and expired
// gauges from the figures the store counts. A sweep that listed the
// stale claims sets the stale gauges: the claims it listed and did not
// resolve, and the age of the oldest listed; one that failed before it
// could list them leaves the gauges as they were (it does not know). A
// failed sweep is counted, unless it failed because ctx was cancelled (the
// sweeper stopping). Purged records and resolved claims count either way.
func (m *Metrics) ObserveSweep(_ context.Context, res idem.SweepResult, err error) {
	m.purged.Add(float64(res.Purged))
	m.resolved.WithLabelValues("reconciled").Add(float64(res.Reconciled))
	m.resolved.WithLabelValues("released").Add(float64(res.Released))
	m.resolved.WithLabelValues("raced").Add(float64(res.Raced))
	m.resolved.WithLabelValues("failed").Add(float64(res.Failed))
	if err != nil && !errors.Is(err, context.Canceled) {
		m.sweepErrors.Inc()
	}
	if st := res.Stats; st != nil {
		if st.InProgress.Counted() {
			m.inProgress.Set(float64(st.InProgress))
		}
		if st.Expired.Counted() {
			m.expired.Set(float64(st.Expired))
		}
	}
	if err != nil && len(res.Stale) == 0 {
		return
	}
	now := m.now()
	m.stale.Set(float64(max(0, len(res.Stale)-res.Reconciled-res.Released-res.Raced)))
	age := 0.0
	for _, r := range res.Stale {
		age = max(age, now.Sub(r.LockedAt).Seconds())
	}
	m.staleAge.Set(age)
	if err == nil {
		m.lastSweep.Set(float64(now.UnixNano()) / 1e9)
	}
}
