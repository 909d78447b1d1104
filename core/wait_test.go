package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// TestWaitBoundPrecedence: Call.WaitInFlight overrides the route's bound
// (Config.RouteWaitInFlight), which overrides Config.WaitInFlight; a
// negative Call.WaitInFlight turns the wait off.
func TestWaitBoundPrecedence(t *testing.T) {
	t.Parallel()
	const long, short = 3 * time.Second, 150 * time.Millisecond
	tests := []struct {
		name     string
		cfg      idem.Config
		route    string
		call     time.Duration
		wantWait idem.WaitOutcome
		atLeast  time.Duration
		atMost   time.Duration
	}{
		{"off by default", idem.Config{}, "r", 0, "", 0, short},
		{"engine bound", idem.Config{WaitInFlight: short}, "r", 0, idem.WaitTimedOut, short, long},
		{"route overrides engine", idem.Config{WaitInFlight: long, RouteWaitInFlight: map[string]time.Duration{"r": short}}, "r", 0, idem.WaitTimedOut, short, long},
		{"route turns it off", idem.Config{WaitInFlight: long, RouteWaitInFlight: map[string]time.Duration{"r": 0}}, "r", 0, "", 0, short},
		{"other route keeps the engine's", idem.Config{WaitInFlight: short, RouteWaitInFlight: map[string]time.Duration{"other": long}}, "r", 0, idem.WaitTimedOut, short, long},
		{"call overrides route", idem.Config{RouteWaitInFlight: map[string]time.Duration{"r": long}}, "r", short, idem.WaitTimedOut, short, long},
		{"call turns it off", idem.Config{WaitInFlight: long}, "r", -1, "", 0, short},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			obs, events := recordEvents()
			tc.cfg.Observer, tc.cfg.Store = obs, memstore.MustNew()
			e := newCallEngine(t, tc.cfg)
			t.Cleanup(func() { _ = e.Close() })
			held, release := make(chan struct{}), make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				c := call("k", `{}`)
				c.Route = tc.route
				_, _ = e.Do(context.Background(), c, func(context.Context) (idem.Response, error) {
					close(held)
					<-release
					return idem.Response{Status: 201}, nil
				})
			}()
			<-held
			c := call("k", `{}`)
			c.Route, c.WaitInFlight = tc.route, tc.call
			start := time.Now()
			_, err := e.Do(context.Background(), c, func(context.Context) (idem.Response, error) {
				t.Error("the duplicate ran")
				return idem.Response{}, nil
			})
			took := time.Since(start)
			close(release)
			<-done
			if p, _ := idem.ProblemOf(err); p != idem.ProblemKeyInUse {
				t.Fatalf("duplicate: %v, want %s", err, idem.ProblemKeyInUse)
			}
			if took < tc.atLeast || took > tc.atMost {
				t.Fatalf("duplicate answered after %v, want %v to %v", took, tc.atLeast, tc.atMost)
			}
			var got idem.Event
			for _, ev := range events() {
				if ev.Outcome == idem.OutcomeInProgressConflict {
					got = ev
				}
			}
			if got.Wait != tc.wantWait || (tc.wantWait != "" && got.Waited < tc.atLeast) {
				t.Fatalf("event Wait %q after %v, want %q", got.Wait, got.Waited, tc.wantWait)
			}
		})
	}
}

// TestWaitCallReplays: a call through Do that waits gets the holder's
// stored reply, Replayed, and fn runs once.
func TestWaitCallReplays(t *testing.T) {
	t.Parallel()
	var logged syncBuffer
	e := newCallEngine(t, idem.Config{WaitInFlight: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	var effects atomic.Int64
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan idem.CallResult, 1)
	go func() {
		res, _ := e.Do(context.Background(), call("k", `{}`), func(ctx context.Context) (idem.Response, error) {
			close(held)
			<-release
			return effectFn(&effects, 201, "paid")(ctx)
		})
		done <- res
	}()
	<-held
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	res, err := e.Do(context.Background(), call("k", `{}`), effectFn(&effects, 201, "twice"))
	first := <-done
	if err != nil || !res.Replayed || res.Status != 201 || string(res.Body) != "paid" || res.Outcome != idem.OutcomeReplayed {
		t.Fatalf("waited call = %+v, %v; want the replay of %+v", res, err, first)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if !logged.contains("outcome=replayed") || !logged.contains(" wait=replayed waited=") {
		t.Fatal("the waited call's log line does not say it waited")
	}
}

// cancellingStore cancels the waiter's context during its second claim
// (the first it makes while it waits) and fails that claim with the
// cancellation, as a driver interrupted by a client that went away does.
type cancellingStore struct {
	idemstore.Store
	cancel context.CancelCauseFunc
	claims atomic.Int64
}

type waiterKey struct{}

func (s *cancellingStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if ctx.Value(waiterKey{}) != nil && s.claims.Add(1) == 2 {
		s.cancel(errClientGone)
		return idemstore.ClaimResult{}, fmt.Errorf("teststore: claim: %w", context.Cause(ctx))
	}
	return s.Store.Claim(ctx, req)
}

var errClientGone = errors.New("the client went away")

// TestWaitClientGoneDuringClaim: a waiter whose client goes away while it
// claims the key again, failing that claim, ends its wait as cancelled,
// with the 409 of the key in flight, not as a store error.
func TestWaitClientGoneDuringClaim(t *testing.T) {
	t.Parallel()
	obs, events := recordEvents()
	store := &cancellingStore{Store: memstore.MustNew()}
	e := newCallEngine(t, idem.Config{Store: store, Observer: obs, WaitInFlight: 5 * time.Second})
	t.Cleanup(func() { _ = e.Close() })
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.Do(context.Background(), call("k", `{}`), func(context.Context) (idem.Response, error) {
			close(held)
			<-release
			return idem.Response{Status: 201}, nil
		})
	}()
	<-held
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), waiterKey{}, true))
	defer cancel(nil)
	store.cancel = cancel
	start := time.Now()
	_, err := e.Do(ctx, call("k", `{}`), func(context.Context) (idem.Response, error) {
		t.Error("the waiter ran")
		return idem.Response{}, nil
	})
	took := time.Since(start)
	close(release)
	<-done
	if p, _ := idem.ProblemOf(err); p != idem.ProblemKeyInUse || took > 2*time.Second {
		t.Fatalf("waiter gone during its claim: %v after %v, want %s at once", err, took, idem.ProblemKeyInUse)
	}
	if !errors.Is(err, errClientGone) {
		t.Fatalf("waiter gone during its claim: %v, want it to wrap the cause", err)
	}
	for _, ev := range events() {
		if ev.Outcome == idem.OutcomeInProgressConflict && ev.Wait == idem.WaitCancelled {
			return
		}
	}
	t.Fatalf("events %+v, want the conflict with Wait %q", events(), idem.WaitCancelled)
}
