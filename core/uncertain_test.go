package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// takeoverStore is a memstore whose BeginTx, and whose claims once the
// record is stale, can be made to fail, for the failures that may follow a
// takeover.
type takeoverStore struct {
	*memstore.Store
	failBegin     atomic.Bool // BeginTx fails
	loseTakeovers atomic.Bool // a takeover commits, then its answer is lost
}

func (s *takeoverStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	if s.failBegin.Load() {
		return ctx, nil, errors.New("idemtest: begin: pool exhausted")
	}
	return s.Store.BeginTx(ctx, l)
}

func (s *takeoverStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && res.Reclaimed && s.loseTakeovers.Load() {
		return idemstore.ClaimResult{}, errors.New("idemtest: claim: connection reset after the takeover committed")
	}
	return res, err
}

// TestFailuresAfterATakeoverKeepTheClaim: once a stale claim has been taken
// over to ask Reconcile, no failure before Reconcile's answer is stored
// releases it: a released key would let the next retry run the handler
// without asking. Each case crashes an attempt, makes the takeover fail one
// way, then retries with the failure gone: the retry must take the kept
// claim over at once and ask Reconcile again, and the handler must never
// run.
func TestFailuresAfterATakeoverKeepTheClaim(t *testing.T) {
	t.Parallel()
	charged := &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"from provider"}`)}
	tests := []struct {
		name string
		// answer is Reconcile's answer on the failing takeover.
		answer func() (*idem.Response, error)
		setup  func(*idem.Config, *takeoverStore)
		heal   func(*idem.Config, *takeoverStore)
		sweep  bool // the sweeper makes the failing takeover, not a retry
	}{
		{name: "answer too large",
			answer: func() (*idem.Response, error) {
				return &idem.Response{Status: 201, Body: bytes.Repeat([]byte("x"), 2048)}, nil
			}},
		{name: "answer with an invalid header",
			answer: func() (*idem.Response, error) {
				return &idem.Response{Status: 201, Header: http.Header{"Location": {"/p\r\nSet-Cookie: x=1"}}, Body: []byte("{}")}, nil
			}},
		{name: "answer fails to seal",
			answer: func() (*idem.Response, error) { return charged, nil },
			setup:  func(c *idem.Config, _ *takeoverStore) { c.BodySealer = failingSealer{newGCMSealer(t)} },
			heal:   func(c *idem.Config, _ *takeoverStore) { c.BodySealer = nil }},
		{name: "takeover's BeginTx fails",
			answer: func() (*idem.Response, error) { return charged, nil },
			setup:  func(_ *idem.Config, s *takeoverStore) { s.failBegin.Store(true) },
			heal:   func(_ *idem.Config, s *takeoverStore) { s.failBegin.Store(false) }},
		{name: "takeover's answer lost after it committed",
			answer: func() (*idem.Response, error) { return charged, nil },
			setup:  func(_ *idem.Config, s *takeoverStore) { s.loseTakeovers.Store(true) },
			heal:   func(_ *idem.Config, s *takeoverStore) { s.loseTakeovers.Store(false) }},
		{name: "sweeper's BeginTx fails", sweep: true,
			answer: func() (*idem.Response, error) { return charged, nil },
			setup:  func(_ *idem.Config, s *takeoverStore) { s.failBegin.Store(true) },
			heal:   func(_ *idem.Config, s *takeoverStore) { s.failBegin.Store(false) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			store := &takeoverStore{Store: memstore.MustNew(memstore.WithClock(clk.Now))}
			var asked atomic.Int64
			var answer atomic.Value
			answer.Store(tc.answer)
			cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: time.Second,
				StoreTimeout: time.Second, Lease: 3 * time.Second, MaxResponseBytes: 1024,
				Reconcile: func(context.Context, idem.Record) (*idem.Response, error) {
					asked.Add(1)
					return answer.Load().(func() (*idem.Response, error))()
				}}
			newEngine := func() *idem.Engine {
				e, err := idem.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			crashed(t, newEngine(), clk)
			if tc.setup != nil {
				tc.setup(&cfg, store)
			}
			e := newEngine()
			if tc.sweep {
				sw := idem.Sweeper{Engine: e}
				if res, err := sw.Sweep(context.Background()); err == nil || res.Failed != 1 {
					t.Fatalf("Sweep = %+v, %v; want the one stale claim failed", res, err)
				}
			} else if att, resp := e.Begin(context.Background(), request("alice", "k")); att != nil {
				att.Abort()
				t.Fatal("the failing takeover ran the handler")
			} else if resp.Status < 500 {
				t.Fatalf("the failing takeover answered %d %s, want a 5xx", resp.Status, resp.Body)
			}
			rec, err := store.Get(context.Background(), "alice", "k")
			if err != nil || rec.State != idemstore.StateInProgress || !rec.Uncertain || clk.Now().Before(rec.LeaseExpiresAt) {
				t.Fatalf("after the failed takeover: %+v, %v; want it kept in progress, Uncertain, its lease ended", rec, err)
			}

			// The failure is gone: the next retry takes the kept claim over
			// at once and asks again, and the answer is replayed.
			if tc.heal != nil {
				tc.heal(&cfg, store)
			}
			answer.Store(func() (*idem.Response, error) { return charged, nil })
			before := asked.Load()
			e = newEngine()
			att, resp := e.Begin(context.Background(), request("alice", "k"))
			if att != nil {
				att.Abort()
				t.Fatal("the retry ran the handler instead of asking Reconcile")
			}
			if asked.Load() != before+1 || resp.Status != http.StatusCreated || !bytes.Equal(resp.Body, charged.Body) {
				t.Fatalf("retry answered %d %s after %d more Reconcile calls, want Reconcile asked once and its answer",
					resp.Status, resp.Body, asked.Load()-before)
			}
			if _, again := e.Begin(context.Background(), request("alice", "k")); again.Header.Get(idem.ReplayedHeader) != "true" {
				t.Fatalf("the reconciled answer is not replayed: %d %s", again.Status, again.Body)
			}
		})
	}
}

// TestUncertainWithoutReconcile: a record kept Uncertain is never run
// again by an engine without Reconcile: every retry is answered 409
// outcome-unknown, writes nothing and runs nothing, however long after;
// another request with the key still gets 422; and once an operator
// releases it, the key runs afresh.
func TestUncertainWithoutReconcile(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := memstore.MustNew(memstore.WithClock(clk.Now))
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: time.Second,
		StoreTimeout: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "k"))
	if err := store.Keep(context.Background(), att.Lease()); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{0, time.Hour} {
		clk.Add(wait)
		retry, resp := e.Begin(context.Background(), request("alice", "k"))
		if retry != nil {
			retry.Abort()
			t.Fatalf("after %v: a retry ran the handler of a record whose outcome is unknown", wait)
		}
		if resp.Status != http.StatusConflict || !bytes.Contains(resp.Body, []byte(idem.ProblemOutcomeUnknown)) || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("after %v: retry answered %d %v %s, want 409 %s without Retry-After", wait, resp.Status, resp.Header, resp.Body, idem.ProblemOutcomeUnknown)
		}
	}
	other := request("alice", "k")
	other.Body = bytes.NewReader([]byte(`{"amount":2}`))
	if _, resp := e.Begin(context.Background(), other); resp.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another request with the key answered %d, want 422", resp.Status)
	}
	rec, _ := store.Get(context.Background(), "alice", "k")
	if err := store.Release(context.Background(), idemstore.Lease{Principal: "alice", Key: "k", Token: rec.LeaseToken}); err != nil {
		t.Fatal(err)
	}
	if retry, resp := e.Begin(context.Background(), request("alice", "k")); retry == nil {
		t.Fatalf("after the operator's release the retry answered %d %s, want it to run", resp.Status, resp.Body)
	} else {
		retry.Abort()
	}
}
