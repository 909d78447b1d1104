package idemprom_test

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
	idemprom "github.com/idemgo/idem/observers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// clock is a settable clock shared by a memstore and the metrics.
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

// serve sends one request through the engine as an HTTP adapter would,
// the handler answering 201.
func serve(t *testing.T, e *idem.Engine, route, key, body string) *idem.Response {
	t.Helper()
	att, resp := e.Begin(context.Background(), idem.Request{
		Method: "POST", Path: strings.Replace(route, ":id", "42", 1) + "?q=1", Route: route,
		Principal: "acct", Key: key, ContentType: "application/json", Body: strings.NewReader(body),
	})
	if att == nil {
		return resp
	}
	defer att.Abort()
	return att.Finish(idem.Result{Status: http.StatusCreated, Body: []byte(`{}`)})
}

func TestRequestsByOutcomeAndRoute(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := idemprom.New(reg, idemprom.Options{Routes: []string{"/refunds"}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, e, "/payments", "k1", `{"a":1}`)         // claimed
	serve(t, e, "/payments", "k1", `{"a":1}`)         // replayed
	serve(t, e, "/payments", "k1", `{"a":1}`)         // replayed
	serve(t, e, "/payments", "k1", `{"a":2}`)         // fingerprint_mismatch
	serve(t, e, "/payments/:id/capture", "k2", `{}`)  // claimed
	serve(t, e, "/payments/:id/capture", "", `{}`)    // key_missing
	serve(t, e, "/payments/:id/capture", "k2", `{}`)  // replayed
	serve(t, e, "/payments/:id/capture", "k\x01", "") // key_invalid

	requests := func(outcome, route string) float64 {
		return value(t, reg, "idem_requests_total", "outcome", outcome, "route", route)
	}
	for _, tc := range []struct {
		outcome idem.OutcomeLabel
		route   string
		want    float64
	}{
		{idem.OutcomeClaimed, "/payments", 1},
		{idem.OutcomeReplayed, "/payments", 2},
		{idem.OutcomeFingerprintMismatch, "/payments", 1},
		{idem.OutcomeClaimed, "/payments/:id/capture", 1},
		{idem.OutcomeReplayed, "/payments/:id/capture", 1},
		{idem.OutcomeKeyMissing, "/payments/:id/capture", 1},
		{idem.OutcomeKeyInvalid, "/payments/:id/capture", 1},
		// Pre-registered, never requested.
		{idem.OutcomeReplayed, "/refunds", 0},
	} {
		if got := requests(string(tc.outcome), tc.route); got != tc.want {
			t.Errorf("idem_requests_total{outcome=%q,route=%q} = %v, want %v", tc.outcome, tc.route, got, tc.want)
		}
	}
	// The raw path (with its query string) is never a label value: only
	// the routes above and the pre-registered one exist.
	if n, err := testutil.GatherAndCount(reg, "idem_requests_total"); err != nil || n != 7+len(idem.Outcomes) {
		t.Errorf("%d request series, want %d (7 seen + %d pre-registered)", n, 7+len(idem.Outcomes), len(idem.Outcomes))
	}
	// Every request with a valid key made one claim: 6 of the 8.
	if n := histogramCount(t, reg, "idem_claim_duration_seconds"); n != 6 {
		t.Errorf("claim latency histogram has %d observations, want 6 (claims made)", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// histogramCount reads a histogram's sample count back through the registry.
func histogramCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

func TestSweepMetrics(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	reg := prometheus.NewPedanticRegistry()
	m, err := idemprom.New(reg, idemprom.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const lease = time.Minute
	// Two claims that never settle (crashed attempts), one record that
	// expires: claimed with a short retention.
	for i, key := range []string{"crashed-1", "crashed-2"} {
		if _, err := store.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: key, Fingerprint: make([]byte, 32),
			Token: key, Lease: lease, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			clk.Add(30 * time.Second)
		}
	}
	if _, err := store.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: "expiring", Fingerprint: make([]byte, 32),
		Token: "t", Lease: time.Second, Retention: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sweep := &idem.Sweeper{Store: store, Lease: lease, Observer: m, Logger: slog.New(slog.DiscardHandler), CountRecords: true}

	for _, step := range []struct {
		name               string
		advance            time.Duration
		wantStale, wantAge float64
		wantPurged         float64
		wantInProgress     float64
	}{
		{"fresh", 0, 0, 0, 0, 3},
		// crashed-1 locked 30s+90s ago, crashed-2 and expiring 90s ago.
		{"past the lease", 90 * time.Second, 3, 120, 0, 3},
		// expiring's retention is over: purged, no longer stale.
		{"expired", time.Minute, 2, 180, 1, 2},
	} {
		clk.Add(step.advance)
		runOnce(t, sweep)
		if got := value(t, reg, "idem_stale_claims"); got != step.wantStale {
			t.Errorf("%s: idem_stale_claims = %v, want %v", step.name, got, step.wantStale)
		}
		if got := value(t, reg, "idem_stale_claim_oldest_age_seconds"); got != step.wantAge {
			t.Errorf("%s: oldest stale age = %v, want %v", step.name, got, step.wantAge)
		}
		if got := value(t, reg, "idem_sweep_purged_total"); got != step.wantPurged {
			t.Errorf("%s: purged = %v, want %v", step.name, got, step.wantPurged)
		}
		if got := value(t, reg, "idem_in_progress_records"); got != step.wantInProgress {
			t.Errorf("%s: in progress = %v, want %v", step.name, got, step.wantInProgress)
		}
		if got := value(t, reg, "idem_expired_records"); got != 0 {
			t.Errorf("%s: expired awaiting purge = %v, want 0 after the sweep's purge", step.name, got)
		}
		if got := value(t, reg, "idem_sweep_last_success_timestamp_seconds"); got != float64(clk.Now().Unix()) {
			t.Errorf("%s: last success = %v, want %v", step.name, got, clk.Now().Unix())
		}
	}

	// A failed sweep counts as an error and leaves the gauges alone; a
	// sweep stopped by its context is no error.
	m.ObserveSweep(ctx, idem.SweepResult{Purged: 4}, errors.New("idem: sweep: connection refused"))
	m.ObserveSweep(ctx, idem.SweepResult{}, context.Canceled)
	if got := value(t, reg, "idem_sweep_errors_total"); got != 1 {
		t.Errorf("sweep errors = %v, want 1", got)
	}
	if got := value(t, reg, "idem_sweep_purged_total"); got != 5 {
		t.Errorf("purged after a failed sweep = %v, want 5", got)
	}
	if got := value(t, reg, "idem_stale_claims"); got != 2 {
		t.Errorf("stale after a failed sweep = %v, want 2 (unchanged)", got)
	}
}

// runOnce runs the sweeper until its first sweep was observed: the path
// Run takes in production.
func runOnce(t *testing.T, s *idem.Sweeper) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inner := s.Observer
	s.Observer = sweepFunc(func(ctx context.Context, res idem.SweepResult, err error) {
		inner.ObserveSweep(ctx, res, err)
		cancel()
	})
	defer func() { s.Observer = inner }()
	s.Interval = time.Hour
	if err := s.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}

type sweepFunc func(ctx context.Context, res idem.SweepResult, err error)

func (f sweepFunc) ObserveSweep(ctx context.Context, res idem.SweepResult, err error) {
	f(ctx, res, err)
}

// value reads a counter's or gauge's value back through the registry: the
// series of name whose labels include labels (name, value pairs).
func value(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
		t.Fatalf("%s has no series %v", name, labels)
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

func TestNew(t *testing.T) {
	if _, err := idemprom.New(nil, idemprom.Options{}); err == nil {
		t.Error("New(nil) succeeded: it must not fall back to the global registry")
	}
	reg := prometheus.NewRegistry()
	if _, err := idemprom.New(reg, idemprom.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := idemprom.New(reg, idemprom.Options{}); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
	if _, err := idemprom.New(reg, idemprom.Options{Namespace: "other"}); err != nil {
		t.Errorf("another namespace on the same registry: %v", err)
	}
	// Nothing went to the global registry.
	if n, err := testutil.GatherAndCount(prometheus.DefaultGatherer, "idem_requests_total"); err != nil || n != 0 {
		t.Errorf("the global registry has %d idem_requests_total series (%v), want none", n, err)
	}
}

// TestSweepReconciles: with an Engine whose Reconcile is set the sweeper
// resolves stale claims; the gauge counts only those it left, and the
// results are counted.
func TestSweepReconciles(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	reg := prometheus.NewPedanticRegistry()
	m, err := idemprom.New(reg, idemprom.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Reconcile: func(_ context.Context, stale idem.Record) (*idem.Response, error) {
		switch stale.Key {
		case "charged":
			return &idem.Response{Status: http.StatusCreated}, nil
		case "provider-down":
			return nil, errors.New("provider: connection refused")
		}
		return nil, nil // no effect: release
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
	runOnce(t, &idem.Sweeper{Engine: e, Observer: m, Logger: slog.New(slog.DiscardHandler)})
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"idem_stale_claims", nil, 1}, // provider-down: still stale
		{"idem_sweep_stale_total", []string{"result", "reconciled"}, 1},
		{"idem_sweep_stale_total", []string{"result", "released"}, 1},
		{"idem_sweep_stale_total", []string{"result", "failed"}, 1},
		{"idem_sweep_stale_total", []string{"result", "raced"}, 0},
		{"idem_sweep_errors_total", nil, 1},
	} {
		if got := value(t, reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// TestWaits: a request that waited for its key's holder is counted by how
// the wait ended, with its duration; one that did not wait is not.
func TestWaits(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := idemprom.New(reg, idemprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m.Observe(ctx, idem.Event{Outcome: idem.OutcomeReplayed, Wait: idem.WaitReplayed, Waited: 200 * time.Millisecond})
	m.Observe(ctx, idem.Event{Outcome: idem.OutcomeReplayed, Wait: idem.WaitReplayed, Waited: 300 * time.Millisecond})
	m.Observe(ctx, idem.Event{Outcome: idem.OutcomeInProgressConflict, Wait: idem.WaitTimedOut, Waited: 2 * time.Second})
	m.Observe(ctx, idem.Event{Outcome: idem.OutcomeReplayed})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	sums := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "idem_wait_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			got[mt.GetLabel()[0].GetValue()] = mt.GetHistogram().GetSampleCount()
			sums[mt.GetLabel()[0].GetValue()] = mt.GetHistogram().GetSampleSum()
		}
	}
	if len(got) != len(idem.WaitOutcomes) {
		t.Errorf("%d wait series, want %d, one per outcome pre-registered", len(got), len(idem.WaitOutcomes))
	}
	if got["replayed"] != 2 || got["timed_out"] != 1 || got["cancelled"] != 0 || sums["replayed"] != 0.5 || sums["timed_out"] != 2 {
		t.Errorf("waits %v (seconds %v), want replayed 2 (0.5 s), timed_out 1 (2 s)", got, sums)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
