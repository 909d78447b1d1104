// Package idemotel exports what the idempotency engine and its sweeper see
// as OpenTelemetry metrics, and records one span per request through the
// engine. One Observer value is both the engine's Config.Observer and the
// Sweeper's Observer:
//
//	o, err := idemotel.New(idemotel.Options{}) // the global providers
//	cfg.Observer = o
//	sweeper.Observer = o
//
// The metrics, the same as idemprom's:
//
//	idem.requests               counter {request}, attributes idem.outcome and http.route
//	idem.claim.duration         histogram s: the store's Claim latency
//	idem.stale_claims           gauge {claim}: in-progress records past the lease the last sweep left unresolved
//	idem.stale_claim.oldest_age gauge s: age of the oldest stale claim the last sweep listed, 0 when none
//	idem.sweep.stale            counter {claim}: stale claims the sweeper took over, by idem.result
//	                            (reconciled, released, raced, failed)
//	idem.sweep.purged           counter {record}: expired records the sweeper deleted
//	idem.sweep.errors           counter {sweep}: sweeps that failed
//
// The span, named "idempotency <route>", is a child of the span in the
// request's context (the server span of otelhttp, otelgin, ...). It covers
// the engine's part of the request (Event.Duration: the claim, the
// handler, the settle) and is recorded when the engine has decided the
// response, so the handler's own spans are its siblings, not its
// children. Its attributes are idem.outcome, idem.replayed, http.route,
// http.request.method, http.response.status_code and idem.key_hash: the
// key as the engine logs it (idem.KeyHash), never the key itself, which
// is a bearer of the client's request. The Event's error text is not
// exported either (a store's error may quote what it was given); a
// store_error, lease_lost or tx_ended span has status Error with the
// outcome as its description.
//
// A replay's span links to the span of the request that produced the
// answer when that request stored its trace context as its request id:
// with Config.RequestIDHeader = "traceparent" (the caller's span, in the
// original's trace), or with Call.RequestID = idemotel.RequestID(ctx) (the
// span in ctx). The engine hands the stored id to the observer as
// Event.OriginalRequestID; one that is not a W3C traceparent gives no link.
package idemotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	idem "github.com/idemgo/idem/core"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idemgo/idem/observers/otel"

// Attribute keys of the spans and metrics.
const (
	AttrOutcome  = attribute.Key("idem.outcome")
	AttrReplayed = attribute.Key("idem.replayed")
	AttrKeyHash  = attribute.Key("idem.key_hash")
	AttrRoute    = attribute.Key("http.route")
	AttrMethod   = attribute.Key("http.request.method")
	AttrStatus   = attribute.Key("http.response.status_code")
	AttrResult   = attribute.Key("idem.result") // of a stale claim the sweeper took over
	AttrWait     = attribute.Key("idem.wait")   // how a wait for the key's holder ended
)

// Options configures New. The zero value is valid.
type Options struct {
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider records the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Now is the clock the spans' end and the stale claims' age are read
	// from. Default time.Now.
	Now func() time.Time
}

// Observer is an idem.Observer and an idem.SweepObserver that records
// OpenTelemetry metrics and spans. It is safe for concurrent use.
type Observer struct {
	tracer      trace.Tracer
	requests    metric.Int64Counter
	claim       metric.Float64Histogram
	waits       metric.Float64Histogram
	stale       metric.Int64Gauge
	staleAge    metric.Float64Gauge
	resolved    metric.Int64Counter
	purged      metric.Int64Counter
	sweepErrors metric.Int64Counter
	now         func() time.Time
}

var (
	_ idem.Observer      = (*Observer)(nil)
	_ idem.SweepObserver = (*Observer)(nil)
)

// New creates the instruments and the tracer.
func New(opts Options) (*Observer, error) {
	mp, tp := opts.MeterProvider, opts.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	o := &Observer{tracer: tp.Tracer(ScopeName), now: opts.Now}
	if o.now == nil {
		o.now = time.Now
	}
	m := mp.Meter(ScopeName)
	var err, e error
	o.requests, e = m.Int64Counter("idem.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests through the idempotency engine, by outcome and route template."))
	err = errors.Join(err, e)
	o.claim, e = m.Float64Histogram("idem.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Time the store took to claim an idempotency key."))
	err = errors.Join(err, e)
	o.waits, e = m.Float64Histogram("idem.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time requests waited for the attempt holding their key (Config.WaitInFlight), by how the wait ended (idem.wait): replayed, claimed_after_release, timed_out, cancelled, refused (a waiter cap), answered."))
	err = errors.Join(err, e)
	o.stale, e = m.Int64Gauge("idem.stale_claims", metric.WithUnit("{claim}"),
		metric.WithDescription("In-progress records older than the lease at the last sweep: crashed attempts whose external effect is unknown."))
	err = errors.Join(err, e)
	o.staleAge, e = m.Float64Gauge("idem.stale_claim.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest stale claim at the last sweep; 0 when there is none."))
	err = errors.Join(err, e)
	o.resolved, e = m.Int64Counter("idem.sweep.stale", metric.WithUnit("{claim}"),
		metric.WithDescription("Stale claims the sweeper took over, by result: reconciled (answer stored), released, raced (another attempt was first), failed."))
	err = errors.Join(err, e)
	o.purged, e = m.Int64Counter("idem.sweep.purged", metric.WithUnit("{record}"),
		metric.WithDescription("Expired idempotency records the sweeper deleted."))
	err = errors.Join(err, e)
	o.sweepErrors, e = m.Int64Counter("idem.sweep.errors", metric.WithUnit("{sweep}"),
		metric.WithDescription("Sweeps that failed."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("idemotel: instruments: %w", err)
	}
	return o, nil
}

// Observe implements idem.Observer: it counts the request, records the
// claim's latency when a claim was made, and records the request's span.
func (o *Observer) Observe(ctx context.Context, ev idem.Event) {
	labels := metric.WithAttributeSet(attribute.NewSet(AttrOutcome.String(string(ev.Outcome)), AttrRoute.String(ev.Route)))
	o.requests.Add(ctx, 1, labels)
	if ev.ClaimLatency > 0 {
		o.claim.Record(ctx, ev.ClaimLatency.Seconds())
	}
	if ev.Wait != "" {
		o.waits.Record(ctx, ev.Waited.Seconds(), metric.WithAttributeSet(attribute.NewSet(AttrWait.String(string(ev.Wait)))))
	}

	end := o.now()
	attrs := []attribute.KeyValue{
		AttrOutcome.String(string(ev.Outcome)),
		AttrReplayed.Bool(ev.Outcome == idem.OutcomeReplayed),
		AttrMethod.String(ev.Method),
		AttrStatus.Int(ev.Status),
	}
	if ev.Route != "" {
		attrs = append(attrs, AttrRoute.String(ev.Route))
	}
	if ev.Key != "" {
		attrs = append(attrs, AttrKeyHash.String(idem.KeyHash(ev.Principal, ev.Key)))
	}
	if ev.Wait != "" {
		attrs = append(attrs, AttrWait.String(string(ev.Wait)))
	}
	startOpts := []trace.SpanStartOption{
		trace.WithTimestamp(end.Add(-ev.Duration)), trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindInternal),
	}
	if sc := parseTraceparent(ev.OriginalRequestID); sc.IsValid() {
		startOpts = append(startOpts, trace.WithLinks(trace.Link{
			SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("idem.link", "original")},
		}))
	}
	name := "idempotency"
	if ev.Route != "" {
		name += " " + ev.Route
	}
	_, span := o.tracer.Start(ctx, name, startOpts...)
	switch ev.Outcome {
	case idem.OutcomeStoreError, idem.OutcomeLeaseLost, idem.OutcomeTxEnded:
		span.SetStatus(codes.Error, string(ev.Outcome))
	}
	span.End(trace.WithTimestamp(end))
}

// ObserveSweep implements idem.SweepObserver. A sweep that listed the
// stale claims records the stale gauges: the claims it listed and did not
// resolve, and the age of the oldest listed; one that failed before it
// could list them records none (it does not know). A failed sweep is
// counted, unless it failed because ctx was cancelled (the sweeper
// stopping). Purged records and resolved claims count either way.
func (o *Observer) ObserveSweep(ctx context.Context, res idem.SweepResult, err error) {
	// The sweeper calls with its own context, which may be done already.
	ctx = context.WithoutCancel(ctx)
	if res.Purged > 0 {
		o.purged.Add(ctx, int64(res.Purged))
	}
	for _, r := range []struct {
		result string
		n      int
	}{{"reconciled", res.Reconciled}, {"released", res.Released}, {"raced", res.Raced}, {"failed", res.Failed}} {
		if r.n > 0 {
			o.resolved.Add(ctx, int64(r.n), metric.WithAttributes(AttrResult.String(r.result)))
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		o.sweepErrors.Add(ctx, 1)
	}
	if err != nil && len(res.Stale) == 0 {
		return
	}
	now := o.now()
	age := 0.0
	for _, r := range res.Stale {
		age = max(age, now.Sub(r.LockedAt).Seconds())
	}
	o.stale.Record(ctx, int64(max(0, len(res.Stale)-res.Reconciled-res.Released-res.Raced)))
	o.staleAge.Record(ctx, age)
}

// RequestID returns the W3C traceparent of the span in ctx, or "" when ctx
// has none: the request id to store (Call.RequestID) so that the replays
// of this request link to its span.
func RequestID(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c.Get("traceparent")
}

// parseTraceparent returns the span context a W3C traceparent names, an
// invalid one when s is not a traceparent.
func parseTraceparent(s string) trace.SpanContext {
	if len(s) < 55 { // version 00 is 2+1+32+1+16+1+2 characters
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}
