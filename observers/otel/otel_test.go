package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
	idemotel "github.com/idemgo/idem/observers/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// setup returns an Observer on in-memory SDK providers, with the reader
// and recorder to read back what it exported.
func setup(t *testing.T, now func() time.Time) (*idemotel.Observer, *sdkmetric.ManualReader, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	o, err := idemotel.New(idemotel.Options{
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: tp, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return o, reader, rec, tp.Tracer("test")
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// sum returns the int64 counter's value for the attributes, found false
// when there is no such data point.
func sum(t *testing.T, m metricdata.Metrics, attrs ...attribute.KeyValue) (int64, bool) {
	t.Helper()
	want := attribute.NewSet(attrs...)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value, true
		}
	}
	return 0, false
}

func serve(t *testing.T, e *idem.Engine, route, key, body string) {
	t.Helper()
	att, _ := e.Begin(context.Background(), idem.Request{
		Method: "POST", Path: route + "?q=1", Route: route, Principal: "acct", Key: key, Body: strings.NewReader(body),
	})
	if att != nil {
		att.Finish(idem.Result{Status: http.StatusCreated})
	}
}

func TestMetrics(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	o, reader, _, _ := setup(t, clk.Now)
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, e, "/payments", "k1", "a")
	serve(t, e, "/payments", "k1", "a")
	serve(t, e, "/payments", "k1", "a")
	serve(t, e, "/payments", "k1", "b")
	serve(t, e, "/refunds", "k2", "a")
	serve(t, e, "/refunds", "", "a")

	ms := collect(t, reader)
	for _, tc := range []struct {
		outcome idem.OutcomeLabel
		route   string
		want    int64
	}{
		{idem.OutcomeClaimed, "/payments", 1},
		{idem.OutcomeReplayed, "/payments", 2},
		{idem.OutcomeFingerprintMismatch, "/payments", 1},
		{idem.OutcomeClaimed, "/refunds", 1},
		{idem.OutcomeKeyMissing, "/refunds", 1},
	} {
		got, ok := sum(t, ms["idem.requests"], idemotel.AttrOutcome.String(string(tc.outcome)), idemotel.AttrRoute.String(tc.route))
		if !ok || got != tc.want {
			t.Errorf("idem.requests{%s, %s} = %d (found %v), want %d", tc.outcome, tc.route, got, ok, tc.want)
		}
	}
	if n := len(ms["idem.requests"].Data.(metricdata.Sum[int64]).DataPoints); n != 5 {
		t.Errorf("%d idem.requests series, want 5 (the raw path is no attribute)", n)
	}
	if dps := ms["idem.claim.duration"].Data.(metricdata.Histogram[float64]).DataPoints; len(dps) != 1 || dps[0].Count != 5 {
		t.Errorf("claim duration data points %+v, want one with 5 claims", dps)
	}

	// The sweeper: two claims that never settle, 90s and 120s past.
	ctx := context.Background()
	for _, key := range []string{"crashed-1", "crashed-2"} {
		if _, err := store.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: key, Fingerprint: make([]byte, 32),
			Token: key, Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		clk.Add(30 * time.Second)
	}
	clk.Add(90 * time.Second)
	sw := &idem.Sweeper{Store: store, Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)}
	res, err := sw.Sweep(ctx)
	o.ObserveSweep(ctx, res, err)
	o.ObserveSweep(ctx, idem.SweepResult{Purged: 3}, errors.New("idem: sweep: connection refused"))
	o.ObserveSweep(ctx, idem.SweepResult{}, context.Canceled)
	ms = collect(t, reader)
	if dps := ms["idem.stale_claims"].Data.(metricdata.Gauge[int64]).DataPoints; len(dps) != 1 || dps[0].Value != 2 {
		t.Errorf("idem.stale_claims %+v, want 2", dps)
	}
	if dps := ms["idem.stale_claim.oldest_age"].Data.(metricdata.Gauge[float64]).DataPoints; len(dps) != 1 || dps[0].Value != 150 {
		t.Errorf("idem.stale_claim.oldest_age %+v, want 150", dps)
	}
	if n, _ := sum(t, ms["idem.sweep.purged"]); n != 3 {
		t.Errorf("idem.sweep.purged = %d, want 3", n)
	}
	if n, _ := sum(t, ms["idem.sweep.errors"]); n != 1 {
		t.Errorf("idem.sweep.errors = %d, want 1 (a cancelled sweep is no error)", n)
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpans: one span per request, a child of the request's span, with the
// outcome, replayed and the key's hash; a replay's span links to the span
// of the request that produced the answer when it stored its traceparent.
func TestSpans(t *testing.T) {
	o, _, rec, tracer := setup(t, nil)
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	const rawKey = "raw-client-key-7f3a"
	// call sends one request inside a server span of its own trace,
	// storing requestID (or the span's traceparent when it is "").
	call := func(key, requestID string) trace.SpanContext {
		ctx, server := tracer.Start(context.Background(), "POST /payments")
		defer server.End()
		if requestID == "" {
			requestID = idemotel.RequestID(ctx)
		}
		_, err := e.Do(ctx, idem.Call{Principal: "acct", Key: key, Method: "POST", Operation: "/payments",
			RequestID: requestID, Input: []byte(`{"amount":1}`)}, func(context.Context) (idem.Response, error) {
			return idem.Response{Status: http.StatusCreated}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return server.SpanContext()
	}
	original := call(rawKey, "")
	replay := call(rawKey, "")
	plainOriginal := call("other-key", "req-42") // a request id that is no traceparent
	plainReplay := call("other-key", "")

	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "idempotency") {
			spans = append(spans, s)
		}
	}
	if len(spans) != 4 {
		t.Fatalf("%d idempotency spans, want 4", len(spans))
	}
	for i, want := range []struct {
		parent   trace.SpanContext
		outcome  idem.OutcomeLabel
		key      string
		linkedTo trace.SpanContext
	}{
		{original, idem.OutcomeClaimed, rawKey, trace.SpanContext{}},
		{replay, idem.OutcomeReplayed, rawKey, original},
		{plainOriginal, idem.OutcomeClaimed, "other-key", trace.SpanContext{}},
		{plainReplay, idem.OutcomeReplayed, "other-key", trace.SpanContext{}},
	} {
		s, a := spans[i], attrs(spans[i])
		if s.Name() != "idempotency /payments" || s.Parent().SpanID() != want.parent.SpanID() || s.SpanContext().TraceID() != want.parent.TraceID() {
			t.Errorf("span %d %q: parent %v, want a child of %v", i, s.Name(), s.Parent(), want.parent)
		}
		if a[idemotel.AttrOutcome].AsString() != string(want.outcome) || a[idemotel.AttrReplayed].AsBool() != (want.outcome == idem.OutcomeReplayed) ||
			a[idemotel.AttrRoute].AsString() != "/payments" || a[idemotel.AttrStatus].AsInt64() != http.StatusCreated {
			t.Errorf("span %d attributes %v", i, s.Attributes())
		}
		if got := a[idemotel.AttrKeyHash].AsString(); got != idem.KeyHash("acct", want.key) {
			t.Errorf("span %d key hash %q, want idem.KeyHash's %q", i, got, idem.KeyHash("acct", want.key))
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), want.key) {
				t.Errorf("span %d exports the raw key in %s=%s", i, kv.Key, kv.Value.String())
			}
		}
		links := s.Links()
		switch {
		case !want.linkedTo.IsValid() && len(links) != 0:
			t.Errorf("span %d links to %v, want no link", i, links)
		case want.linkedTo.IsValid() && (len(links) != 1 || links[0].SpanContext.TraceID() != want.linkedTo.TraceID() ||
			links[0].SpanContext.SpanID() != want.linkedTo.SpanID()):
			t.Errorf("span %d links %v, want one to the original request's span %v", i, links, want.linkedTo)
		}
		if !s.StartTime().Before(s.EndTime()) && !s.StartTime().Equal(s.EndTime()) {
			t.Errorf("span %d ends %v before it starts %v", i, s.EndTime(), s.StartTime())
		}
	}
	if original.TraceID() == replay.TraceID() {
		t.Fatal("the replay ran in the original's trace: the link proves nothing")
	}
}

// TestSpanStatus: a store error is an Error span whose description is the
// outcome, never the error's text.
func TestSpanStatus(t *testing.T) {
	end := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o, _, rec, _ := setup(t, func() time.Time { return end })
	o.Observe(context.Background(), idem.Event{Outcome: idem.OutcomeStoreError, Method: "POST", Route: "/payments",
		Principal: "acct", Key: "k", Status: 503, Duration: 250 * time.Millisecond,
		Err: errors.New(`pq: duplicate key value (acct, "secret")`)})
	o.Observe(context.Background(), idem.Event{Outcome: idem.OutcomeClaimed, Status: 201})
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	if st := spans[0].Status(); st.Code != codes.Error || st.Description != "store_error" || len(spans[0].Events()) != 0 {
		t.Errorf("store_error span: status %+v, events %v", st, spans[0].Events())
	}
	if got := spans[0].EndTime().Sub(spans[0].StartTime()); got != 250*time.Millisecond || !spans[0].EndTime().Equal(end) {
		t.Errorf("span from %v to %v, want the event's 250ms ending now", spans[0].StartTime(), spans[0].EndTime())
	}
	if st := spans[1].Status(); st.Code != codes.Unset || spans[1].Name() != "idempotency" {
		t.Errorf("claimed span %q without a route: status %+v", spans[1].Name(), st)
	}
	if _, ok := attrs(spans[1])[idemotel.AttrKeyHash]; ok {
		t.Error("a request without a key has a key hash")
	}
}

func TestRequestID(t *testing.T) {
	if id := idemotel.RequestID(context.Background()); id != "" {
		t.Errorf("RequestID without a span = %q", id)
	}
	_, _, _, tracer := setup(t, nil)
	ctx, span := tracer.Start(context.Background(), "x")
	defer span.End()
	sc := span.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; idemotel.RequestID(ctx) != want {
		t.Errorf("RequestID = %q, want %q", idemotel.RequestID(ctx), want)
	}
}

// TestSweepReconciles: the stale gauge counts the claims a reconciling
// sweep left, and the results are counted by idem.result.
func TestSweepReconciles(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	o, reader, _, _ := setup(t, clk.Now)
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Reconcile: func(_ context.Context, stale idem.Record) (*idem.Response, error) {
		switch stale.Key {
		case "charged":
			return &idem.Response{Status: http.StatusCreated}, nil
		case "provider-down":
			return nil, errors.New("provider: connection refused")
		}
		return nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"charged", "not-charged", "provider-down"} {
		if _, err := store.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: key, Fingerprint: make([]byte, 32),
			Token: key, Lease: e.Config().Lease, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(e.Config().Lease + time.Minute)
	sw := &idem.Sweeper{Engine: e, Logger: slog.New(slog.DiscardHandler)}
	res, err := sw.Sweep(ctx)
	o.ObserveSweep(ctx, res, err)
	ms := collect(t, reader)
	if dps := ms["idem.stale_claims"].Data.(metricdata.Gauge[int64]).DataPoints; len(dps) != 1 || dps[0].Value != 1 {
		t.Errorf("idem.stale_claims %+v, want 1 (provider-down)", dps)
	}
	for _, r := range []string{"reconciled", "released", "failed"} {
		if n, _ := sum(t, ms["idem.sweep.stale"], idemotel.AttrResult.String(r)); n != 1 {
			t.Errorf("idem.sweep.stale{%s} = %d, want 1", r, n)
		}
	}
	if n, _ := sum(t, ms["idem.sweep.errors"]); n != 1 {
		t.Errorf("idem.sweep.errors = %d, want 1", n)
	}
}

// TestWaits: a request that waited for its key's holder is recorded by
// how the wait ended, with its duration, and its span says so.
func TestWaits(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	o, reader, spans, _ := setup(t, clk.Now)
	ctx := context.Background()
	o.Observe(ctx, idem.Event{Outcome: idem.OutcomeReplayed, Wait: idem.WaitReplayed, Waited: 200 * time.Millisecond})
	o.Observe(ctx, idem.Event{Outcome: idem.OutcomeClaimed, Wait: idem.WaitClaimedAfterRelease, Waited: time.Second})
	o.Observe(ctx, idem.Event{Outcome: idem.OutcomeReplayed})
	ms := collect(t, reader)
	got := map[string]uint64{}
	for _, dp := range ms["idem.wait.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
		v, _ := dp.Attributes.Value(idemotel.AttrWait)
		got[v.AsString()] = dp.Count
	}
	if len(got) != 2 || got["replayed"] != 1 || got["claimed_after_release"] != 1 {
		t.Errorf("idem.wait.duration by outcome %v, want replayed 1 and claimed_after_release 1", got)
	}
	ended := spans.Ended()
	if len(ended) != 3 || attrs(ended[0])[idemotel.AttrWait].AsString() != "replayed" {
		t.Errorf("the waited request's span has %v, want %s=replayed", attrs(ended[0]), idemotel.AttrWait)
	}
	if _, ok := attrs(ended[2])[idemotel.AttrWait]; ok {
		t.Errorf("a request that did not wait has %s on its span", idemotel.AttrWait)
	}
}
