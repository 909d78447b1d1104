package idem_test

import (
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

// crashed leaves alice's key "k" claimed by an attempt that never finishes,
// then moves clk past the lease: a stale claim no client has retried. It
// returns the crashed attempt's downstream "charge" key.
func crashed(t *testing.T, e *idem.Engine, clk *clock) string {
	t.Helper()
	att, resp := e.Begin(context.Background(), request("alice", "k"))
	if att == nil {
		t.Fatalf("first request did not claim: %+v", resp)
	}
	dk, err := idem.DownstreamKey(att.Context(), "charge")
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(e.Config().Lease + time.Second)
	return dk
}

func TestSweeperReconciles(t *testing.T) {
	t.Parallel()
	reconciled := &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"charge":"ch_1"}`)}
	tests := []struct {
		name      string
		reconcile idem.Reconciler // nil: no Config.Reconcile
		want      idem.SweepResult
		wantErr   bool
		// then is what alice's retry gets after the sweep.
		thenReplay bool // the reconciled response, replayed
		thenRuns   bool // a fresh claim: the handler runs
		thenState  idemstore.State
	}{
		{name: "charged: stored and replayed",
			reconcile: func(context.Context, idem.Record) (*idem.Response, error) { return reconciled, nil },
			want:      idem.SweepResult{Reconciled: 1}, thenReplay: true, thenState: idemstore.StateCompleted},
		{name: "charged, found after the deadline: still stored",
			reconcile: func(ctx context.Context, _ idem.Record) (*idem.Response, error) {
				<-ctx.Done() // the takeover's RequestTimeout
				return reconciled, nil
			},
			want: idem.SweepResult{Reconciled: 1}, thenReplay: true, thenState: idemstore.StateCompleted},
		{name: "no effect: released",
			reconcile: func(context.Context, idem.Record) (*idem.Response, error) { return nil, nil },
			want:      idem.SweepResult{Released: 1}, thenRuns: true},
		{name: "provider down: kept for the next sweep",
			reconcile: func(context.Context, idem.Record) (*idem.Response, error) { return nil, errors.New("provider down") },
			want:      idem.SweepResult{Failed: 1}, wantErr: true, thenState: idemstore.StateInProgress},
		{name: "without Reconcile: only reported",
			want: idem.SweepResult{}, thenState: idemstore.StateInProgress},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			store := memstore.MustNew(memstore.WithClock(clk.Now))
			var sawKey atomic.Value
			cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second}
			if tc.reconcile != nil {
				cfg.Reconcile = func(ctx context.Context, r idem.Record) (*idem.Response, error) {
					dk, _ := idem.DownstreamKey(ctx, "charge")
					sawKey.Store(dk)
					return tc.reconcile(ctx, r)
				}
			}
			e, err := idem.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dk := crashed(t, e, clk)
			before, _ := store.Get(context.Background(), "alice", "k")

			sw := idem.Sweeper{Engine: e}
			res, err := sw.Sweep(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("Sweep error %v, want error %v", err, tc.wantErr)
			}
			if len(res.Stale) != 1 || res.Stale[0].Key != "k" {
				t.Fatalf("Stale %+v, want alice's k", res.Stale)
			}
			res.Stale, res.Purged = nil, 0
			if res.Reconciled != tc.want.Reconciled || res.Released != tc.want.Released || res.Raced != tc.want.Raced ||
				res.Failed != tc.want.Failed {
				t.Fatalf("Sweep = %+v, want %+v", res, tc.want)
			}
			if tc.reconcile != nil && sawKey.Load() != dk {
				t.Fatalf("Reconcile's DownstreamKey %v, want the crashed attempt's %s", sawKey.Load(), dk)
			}

			rec, err := store.Get(context.Background(), "alice", "k")
			switch {
			case tc.thenState == "":
				if rec, free := storetest.Free(t, store, "alice", "k"); !free {
					t.Fatalf("record after the sweep: %+v; want the key released", rec)
				}
			case err != nil || rec.State != tc.thenState:
				t.Fatalf("record after the sweep: %+v, %v; want %s", rec, err, tc.thenState)
			case tc.thenState == idemstore.StateInProgress && tc.reconcile == nil && rec.LeaseToken != before.LeaseToken:
				t.Fatal("a sweeper without Reconcile took the claim over")
			case tc.thenState == idemstore.StateInProgress && tc.reconcile != nil && rec.LeaseToken == before.LeaseToken:
				t.Fatal("the sweeper asked Reconcile without taking the claim over")
			}

			att, resp := e.Begin(context.Background(), request("alice", "k"))
			switch {
			case tc.thenReplay:
				if att != nil || resp == nil || resp.Status != http.StatusCreated || string(resp.Body) != string(reconciled.Body) ||
					resp.Header.Get(idem.ReplayedHeader) != "true" {
					t.Fatalf("retry: attempt %v, %+v; want the reconciled replay", att != nil, resp)
				}
			case tc.thenRuns:
				if att == nil {
					t.Fatalf("retry: %+v; want a fresh claim", resp)
				}
				att.Abort()
			case tc.reconcile != nil:
				// Kept: the retry takes it over at once and asks again;
				// the provider is still down, so it is kept again and
				// nothing runs.
				if att != nil {
					att.Abort()
					t.Fatal("retry: the handler ran on a claim Reconcile could not answer")
				}
				if resp.Status != http.StatusServiceUnavailable {
					t.Fatalf("retry: %d %s, want 503 while Reconcile fails", resp.Status, resp.Body)
				}
			default:
				// Without Reconcile the crashed holder's claim is taken
				// over and run: its transaction rolled back with it.
				if att == nil {
					t.Fatalf("retry: %d %s, want a takeover", resp.Status, resp.Body)
				}
				att.Abort()
			}
		})
	}
}

// listHook is a Store whose ListStale calls after once it has listed.
type listHook struct {
	idemstore.Store
	after func()
}

func (s listHook) ListStale(ctx context.Context, limit int) ([]idem.Record, error) {
	recs, err := s.Store.ListStale(ctx, limit)
	s.after()
	return recs, err
}

// TestSweeperLosesToARetry: a client's retry took the stale claim over
// first; the sweeper's takeover finds it held and does nothing.
func TestSweeperLosesToARetry(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var asked atomic.Int64
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: time.Second,
		StoreTimeout: time.Second, Lease: 3 * time.Second,
		Reconcile: func(context.Context, idem.Record) (*idem.Response, error) { asked.Add(1); return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	crashed(t, e, clk)
	// The retry takes the claim over between the sweeper's list and its
	// takeover.
	var retry *idem.Attempt
	listed := listHook{Store: e.Config().Store, after: func() {
		var resp *idem.Response
		if retry, resp = e.Begin(context.Background(), request("alice", "k")); retry == nil {
			t.Errorf("retry did not take over: %+v", resp)
		}
	}}
	sw := idem.Sweeper{Engine: e, Store: listed}
	res, err := sw.Sweep(context.Background())
	if retry == nil {
		t.FailNow()
	}
	defer retry.Abort()
	if err != nil || res.Raced != 1 || res.Reconciled+res.Released+res.Failed != 0 {
		t.Fatalf("Sweep = %+v, %v; want the one claim raced", res, err)
	}
	if asked.Load() != 1 {
		t.Fatalf("Reconcile asked %d times, want once (by the retry's takeover)", asked.Load())
	}
	if got := retry.Finish(idem.Result{Status: http.StatusCreated, Body: []byte("ran")}); got.Status != http.StatusCreated {
		t.Fatalf("the retry's own run ended %d after the sweep", got.Status)
	}
}

// TestTakeoverKeepsAnUnstoredReconcile: when a retry's takeover cannot
// store what Reconcile found (Reconcile failed, or answered after the
// deadline), the claim stays in progress instead of being released, so
// the next retry asks Reconcile again rather than running the handler
// blind next to an effect that happened.
func TestTakeoverKeepsAnUnstoredReconcile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		reconcile idem.Reconciler
		wantState idemstore.State
		wantCode  int
	}{
		{"reconcile failed",
			func(context.Context, idem.Record) (*idem.Response, error) { return nil, errors.New("provider down") },
			idemstore.StateInProgress, http.StatusServiceUnavailable},
		{"answered after the deadline",
			func(ctx context.Context, _ idem.Record) (*idem.Response, error) {
				<-ctx.Done() // the takeover's RequestTimeout
				return &idem.Response{Status: http.StatusCreated, Body: []byte("charged")}, nil
			},
			idemstore.StateCompleted, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			store := memstore.MustNew(memstore.WithClock(clk.Now))
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: 50 * time.Millisecond, StoreTimeout: time.Second,
				Lease: 3 * time.Second, Reconcile: tc.reconcile})
			if err != nil {
				t.Fatal(err)
			}
			crashed(t, e, clk)
			att, resp := e.Begin(context.Background(), request("alice", "k"))
			if att != nil {
				att.Abort()
				t.Fatal("the takeover ran the handler")
			}
			if resp.Status != tc.wantCode {
				t.Fatalf("takeover answered %d %s, want %d", resp.Status, resp.Body, tc.wantCode)
			}
			// Kept with its lease ended: the next retry takes it over at
			// once and asks again.
			if tc.wantCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After %q, want 1", resp.Header.Get("Retry-After"))
			}
			rec, err := store.Get(context.Background(), "alice", "k")
			if err != nil || rec.State != tc.wantState {
				t.Fatalf("record %+v, %v; want %s", rec, err, tc.wantState)
			}
			if tc.wantState == idemstore.StateInProgress && (!rec.Uncertain || clk.Now().Before(rec.LeaseExpiresAt)) {
				t.Fatalf("record %+v: want it kept Uncertain with its lease ended", rec)
			}
		})
	}
}
