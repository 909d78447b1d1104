package idem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// poolStore plays a store whose pool is exhausted: Claim, BeginTx, or both
// wait for a connection until their context ends.
type poolStore struct {
	idemstore.Store
	blockClaim, blockBegin bool
}

func (s poolStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.blockClaim {
		<-ctx.Done()
		return idemstore.ClaimResult{}, ctx.Err()
	}
	return s.Store.Claim(ctx, req)
}

func (s poolStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	if s.blockBegin {
		<-ctx.Done()
		return ctx, nil, ctx.Err()
	}
	return s.Store.BeginTx(ctx, l)
}

// TestStoreTimeoutBoundsClaimAndBegin: a claim or a transaction start that
// waits for a connection is answered 503 with a Retry-After after
// StoreTimeout, not after the client gives up; the key is left free.
func TestStoreTimeoutBoundsClaimAndBegin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store poolStore
	}{
		{"claim", poolStore{blockClaim: true}},
		{"begin", poolStore{blockBegin: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := memstore.MustNew()
			tc.store.Store = mem
			var ev idem.Event
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: tc.store, StoreTimeout: 200 * time.Millisecond,
				Observer: idem.ObserverFunc(func(_ context.Context, got idem.Event) { ev = got })})
			if err != nil {
				t.Fatal(err)
			}
			// The client would wait 3s; the answer must come long before.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			att, resp := e.Begin(ctx, request("alice", "k"))
			took := time.Since(start)
			if att != nil || resp == nil {
				t.Fatalf("got an attempt, want a 503")
			}
			if resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
			}
			if took > 2*time.Second {
				t.Fatalf("answered after %v, want about StoreTimeout", took)
			}
			if !errors.Is(ev.Err, idem.ErrStoreTimeout) {
				t.Fatalf("Event.Err = %v, want ErrStoreTimeout", ev.Err)
			}
			if rec, free := storetest.Free(t, mem, "alice", "k"); !free {
				t.Fatalf("the key was left claimed: %+v", rec)
			}
		})
	}
}

// TestStoreTimeoutDoesNotBoundHandler: the bound on BeginTx ends when it
// returns; the handler's context, derived from the one BeginTx got, runs
// for RequestTimeout, not StoreTimeout.
func TestStoreTimeoutDoesNotBoundHandler(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), StoreTimeout: 50 * time.Millisecond,
		RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	att, resp := e.Begin(context.Background(), request("alice", "k"))
	if att == nil {
		t.Fatalf("no claim: %+v", resp)
	}
	time.Sleep(200 * time.Millisecond)
	if err := att.Context().Err(); err != nil {
		t.Fatalf("handler context ended after StoreTimeout: %v", err)
	}
	if got := att.Finish(idem.Result{Status: http.StatusCreated}); got.Status != http.StatusCreated {
		t.Fatalf("finish: %d", got.Status)
	}
}

// TestMaxInFlightPerPrincipal: past its limit a principal gets 429 with a
// Retry-After and nothing claimed; other principals are not affected; a
// slot comes back when an attempt finishes, aborts, or ends without a
// claim (a replay, a conflict).
func TestMaxInFlightPerPrincipal(t *testing.T) {
	t.Parallel()
	mem := memstore.MustNew()
	var ev idem.Event
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: mem, MaxInFlightPerPrincipal: 2,
		Observer: idem.ObserverFunc(func(_ context.Context, got idem.Event) { ev = got })})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a1, _ := e.Begin(ctx, request("alice", "k1"))
	a2, _ := e.Begin(ctx, request("alice", "k2"))
	if a1 == nil || a2 == nil {
		t.Fatal("alice's first two requests did not claim")
	}
	_, resp := e.Begin(ctx, request("alice", "k3"))
	if resp == nil || resp.Status != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third request: %+v, want 429 with Retry-After", resp)
	}
	if !jsonHasType(resp.Body, idem.ProblemTooManyInFlight) || ev.Outcome != idem.OutcomeInFlightLimited {
		t.Fatalf("body %s outcome %s", resp.Body, ev.Outcome)
	}
	if _, err := mem.Get(ctx, "alice", "k3"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("a limited request claimed its key: %v", err)
	}
	b, _ := e.Begin(ctx, request("bob", "k1"))
	if b == nil {
		t.Fatal("bob was limited by alice's requests")
	}
	b.Finish(idem.Result{Status: http.StatusCreated})

	a1.Finish(idem.Result{Status: http.StatusCreated})
	a2.Abort()
	// Both slots are back; replays and conflicts must not keep one.
	for i := range 5 {
		if att, resp := e.Begin(ctx, request("alice", "k1")); att != nil || resp.Status != http.StatusCreated {
			t.Fatalf("replay %d: attempt %v status %d", i, att, resp.Status)
		}
	}
	h1, _ := e.Begin(ctx, request("alice", "k4"))
	for i := range 5 {
		if _, resp := e.Begin(ctx, request("alice", "k4")); resp.Status != http.StatusConflict {
			t.Fatalf("conflict %d: status %d", i, resp.Status)
		}
	}
	h2, _ := e.Begin(ctx, request("alice", "k5"))
	if h1 == nil || h2 == nil {
		t.Fatal("a finished, aborted, replayed or conflicting request kept its slot")
	}
	h1.Abort()
	h2.Abort()
}

func TestMaxInFlightPerPrincipalValidated(t *testing.T) {
	t.Parallel()
	if _, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), MaxInFlightPerPrincipal: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("negative limit accepted: %v", err)
	}
}

func jsonHasType(body []byte, t idem.ProblemType) bool {
	return strings.Contains(string(body), `"type":"`+string(t)+`"`)
}
