package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	store := memstore.MustNew()
	tests := []struct {
		name string
		cfg  idem.Config
		want string
	}{
		{"no store", idem.Config{FingerprintKey: storetest.FingerprintKey}, "Store is required"},
		{"lease not above timeout", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: 10 * time.Second, Lease: 10 * time.Second}, "Lease"},
		{"lease ignores store time", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: 10 * time.Second, StoreTimeout: 5 * time.Second, Lease: 12 * time.Second}, "Lease"},
		{"retention below lease", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Retention: time.Second}, "Retention"},
		{"negative body limit", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, MaxBodyBytes: -1}, "MaxBodyBytes"},
		{"empty stored header", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, StoredHeaders: []string{""}}, "StoredHeaders"},
		{"negative wait", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, WaitInFlight: -time.Second}, "WaitInFlight"},
		{"wait not below lease", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Lease: time.Minute, WaitInFlight: time.Minute}, "WaitInFlight"},
		{"route wait not below lease", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Lease: time.Minute,
			RouteWaitInFlight: map[string]time.Duration{"/payments": 2 * time.Minute}}, `RouteWaitInFlight["/payments"]`},
		{"negative route wait", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store,
			RouteWaitInFlight: map[string]time.Duration{"/payments": -1}}, "RouteWaitInFlight"},
		{"negative waiter cap", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, MaxWaiters: -1}, "MaxWaiters"},
		{"negative principal waiter cap", idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, MaxWaitersPerPrincipal: -1}, "MaxWaitersPerPrincipal"},
	}
	for _, tc := range tests {
		_, err := idem.New(tc.cfg)
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig mentioning %q", tc.name, err, tc.want)
		}
	}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store})
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c := e.Config(); c.Lease <= c.RequestTimeout+c.StoreTimeout || c.Header != "Idempotency-Key" {
		t.Fatalf("defaults = %+v", c)
	}
}

// clock is a settable clock shared by a memstore and the test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }
func newClock() *clock               { return &clock{now: time.Unix(1_750_000_000, 0)} }
func request(principal, key string) idem.Request {
	return idem.Request{Method: "POST", Path: "/payments", Principal: principal, Key: key,
		ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)}
}

func TestRetryAfterFollowsTheHolder(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey,
		Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: 10 * time.Second,
		StoreTimeout: time.Second, Lease: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "k"))
	if att == nil {
		t.Fatal("first request did not claim")
	}
	defer att.Abort()
	for _, tc := range []struct {
		advance time.Duration
		want    string
	}{
		{0, "1"},                       // no route, no history: soon, not the whole deadline
		{2500 * time.Millisecond, "1"}, // still running within its deadline
		{9 * time.Second, "9"},         // past the deadline: until the lease expires (20-11.5 = 8.5)
		{8 * time.Second, "1"},         // never below 1
	} {
		clk.Add(tc.advance)
		_, resp := e.Begin(context.Background(), request("alice", "k"))
		if resp == nil || resp.Status != http.StatusConflict {
			t.Fatalf("after %v: %+v, want 409", tc.advance, resp)
		}
		if got := resp.Header.Get("Retry-After"); got != tc.want {
			t.Errorf("after +%v: Retry-After %s, want %s", tc.advance, got, tc.want)
		}
	}
}

func TestDownstreamKeyIsStableAcrossTakeover(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := e.Begin(context.Background(), request("alice", "k"))
	k1, err := idem.DownstreamKey(first.Context(), "charge")
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(4 * time.Second) // the holder "crashed"
	second, resp := e.Begin(context.Background(), request("alice", "k"))
	if second == nil {
		t.Fatalf("stale claim not taken over: %+v", resp)
	}
	k2, _ := idem.DownstreamKey(second.Context(), "charge")
	refund, _ := idem.DownstreamKey(second.Context(), "refund")
	other, _ := e.Begin(context.Background(), request("bob", "k"))
	k3, _ := idem.DownstreamKey(other.Context(), "charge")
	if k1 != k2 || k1 == refund || k1 == k3 || len(k1) != 64 {
		t.Fatalf("downstream keys: first %s, takeover %s, refund %s, bob %s", k1, k2, refund, k3)
	}
	if strings.Contains(k1, "alice") {
		t.Fatal("the downstream key reveals the principal")
	}
	if _, err := idem.DownstreamKey(context.Background(), "charge"); !errors.Is(err, idem.ErrNoAttempt) {
		t.Fatalf("outside an attempt: %v", err)
	}
	first.Abort()
	second.Abort()
	other.Abort()
}

func TestReconcilerSettlesAStaleClaim(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var asked []idem.Record
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey,
		Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			asked = append(asked, stale)
			return &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"from provider"}`)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	crashed, _ := e.Begin(context.Background(), request("alice", "k"))
	_ = crashed // never finishes: its process died
	clk.Add(4 * time.Second)
	att, resp := e.Begin(context.Background(), request("alice", "k"))
	if att != nil || resp == nil || resp.Status != 201 || string(resp.Body) != `{"id":"from provider"}` {
		t.Fatalf("takeover with a reconciler: attempt %v, response %+v", att, resp)
	}
	if len(asked) != 1 || asked[0].Key != "k" {
		t.Fatalf("reconciler asked %d times", len(asked))
	}
	_, replay := e.Begin(context.Background(), request("alice", "k"))
	if replay.Header.Get(idem.ReplayedHeader) != "true" || string(replay.Body) != `{"id":"from provider"}` {
		t.Fatalf("reconciled outcome not replayed: %+v", replay)
	}
}

func TestSweeperPurgesExpired(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: k, Token: k, Lease: time.Second, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(30 * time.Second)
	if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: "live", Token: "t", Lease: 10 * time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	clk.Add(31 * time.Second)
	s := idem.Sweeper{Store: store, BatchSize: 2, Lease: time.Second}
	res, err := s.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Purged != 5 || store.Len() != 1 {
		t.Fatalf("purged %d, %d left; want 5 purged, the live record kept", res.Purged, store.Len())
	}
	if len(res.Stale) != 1 || res.Stale[0].Key != "live" {
		t.Fatalf("stale = %+v", res.Stale)
	}
}

// contendedPurger deletes at most half of each batch, as a store does when
// another sweeper deletes the rest of the same batch first.
type contendedPurger struct{ *memstore.Store }

func (p contendedPurger) PurgeExpired(ctx context.Context, limit int) (int, error) {
	return p.Store.PurgeExpired(ctx, max(limit/2, 1))
}

func TestSweeperGoesOnAfterAShortBatch(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	for i := range 40 {
		if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: fmt.Sprint(i), Token: "t", Lease: time.Second, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Minute)
	s := idem.Sweeper{Store: contendedPurger{store}, BatchSize: 10}
	res, err := s.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Purged != 40 || store.Len() != 0 {
		t.Fatalf("purged %d, %d left; want every expired record purged although each batch came back short", res.Purged, store.Len())
	}
}

func TestBodyLimitIgnoresTheDeclaredLength(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), MaxBodyBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		body     int
		declared int64
		want     int // 0: claimed
	}{
		{100, 100, 0}, {100, -1, 0}, {100, 10, 0}, {100, 5000, 0}, {0, 0, 0},
		{101, 101, 413}, {101, 10, 413}, {5000, 100, 413}, {5000, -1, 413},
	} {
		req := request("alice", fmt.Sprintf("k-%d-%d", tc.body, tc.declared))
		req.ContentType = "text/plain"
		req.Body, req.ContentLength = strings.NewReader(strings.Repeat("x", tc.body)), tc.declared
		att, resp := e.Begin(context.Background(), req)
		switch {
		case tc.want == 0 && (att == nil || len(att.Body()) != tc.body):
			t.Errorf("body %d declared %d: not claimed with the whole body (%+v)", tc.body, tc.declared, resp)
		case tc.want != 0 && (resp == nil || resp.Status != tc.want):
			t.Errorf("body %d declared %d: %+v, want %d", tc.body, tc.declared, resp, tc.want)
		}
		if att != nil {
			att.Abort()
		}
	}
}

func TestClassifiers(t *testing.T) {
	t.Parallel()
	handlerErr := errors.New("validation failed")
	for _, tc := range []struct {
		status           int
		err              error
		byDefault, bySta idem.Disposition
	}{
		{200, nil, idem.Complete, idem.Complete},
		{201, nil, idem.Complete, idem.Complete},
		{303, nil, idem.Complete, idem.Complete},
		{400, nil, idem.Fail, idem.Fail},
		{404, nil, idem.Fail, idem.Fail},
		{422, nil, idem.Fail, idem.Fail},
		{408, nil, idem.Release, idem.Release},
		{425, nil, idem.Release, idem.Release},
		{429, nil, idem.Release, idem.Release},
		{500, nil, idem.Release, idem.Release},
		{503, nil, idem.Release, idem.Release},
		{400, handlerErr, idem.Release, idem.Fail},
		{500, handlerErr, idem.Release, idem.Release},
		{200, handlerErr, idem.Release, idem.Release},
	} {
		if got := idem.DefaultClassifier(tc.status, tc.err); got != tc.byDefault {
			t.Errorf("DefaultClassifier(%d, %v) = %d, want %d", tc.status, tc.err, got, tc.byDefault)
		}
		if got := idem.StatusClassifier(tc.status, tc.err); got != tc.bySta {
			t.Errorf("StatusClassifier(%d, %v) = %d, want %d", tc.status, tc.err, got, tc.bySta)
		}
	}
}

func TestResponseControllerCannotStream(t *testing.T) {
	t.Parallel()
	buf := idemadapter.NewResponseBuffer(nil, 1024)
	_, _ = buf.Write([]byte("partial"))
	if err := http.NewResponseController(buf).Flush(); !errors.Is(err, idemadapter.ErrStreaming) {
		t.Fatalf("ResponseController.Flush on the buffer = %v, want ErrStreaming", err)
	}
	if _, _, err := http.NewResponseController(buf).Hijack(); err == nil {
		t.Fatal("the buffer can be hijacked")
	}
}
