package storetest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// testFailedAttempts drives the store through the engine, as an adapter
// does, with handlers that fail after their business write: a 503 from a
// dependency, a panic, the request's deadline, a transaction that cannot
// commit. Each leaves the key free and (with a shared transaction) no
// business write; the retry runs afresh and the one after it is a replay,
// with exactly one business write in the end. A deterministic 400 is stored
// and replayed.
func testFailedAttempts(t *testing.T, b Backend) {
	ctx := ctxT(t)
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: b.Store,
		RequestTimeout: 750 * time.Millisecond, StoreTimeout: 5 * time.Second, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type handler func(ctx context.Context, id string) (int, error)
	run := func(key string, h handler) (resp *idem.Response) {
		t.Helper()
		att, resp := eng.Begin(ctx, idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice", Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)})
		if att == nil {
			return resp
		}
		defer func() {
			if p := recover(); p != nil {
				resp = &idem.Response{Status: http.StatusInternalServerError} // a framework's recovery
			}
		}()
		defer att.Abort()
		status, herr := h(att.Context(), key)
		return att.Finish(idem.Result{Status: status, Err: herr, Body: []byte("done"), Header: http.Header{"Content-Type": {"text/plain"}}})
	}
	ok := func(ctx context.Context, id string) (int, error) { return http.StatusCreated, b.WriteEffect(ctx, id) }
	drills := []struct {
		name string
		h    handler
	}{
		{"503 after the write", func(ctx context.Context, id string) (int, error) {
			return http.StatusServiceUnavailable, b.WriteEffect(ctx, id)
		}},
		{"panic after the write", func(ctx context.Context, id string) (int, error) {
			if err := b.WriteEffect(ctx, id); err != nil {
				return 0, err
			}
			panic("storetest: the handler panics")
		}},
		{"deadline exceeded after the write", func(ctx context.Context, id string) (int, error) {
			if err := b.WriteEffect(ctx, id); err != nil {
				return 0, err
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second): // a context without the request's deadline
			}
			return http.StatusCreated, nil
		}},
	}
	if !b.NoSharedTx {
		drills = append(drills, struct {
			name string
			h    handler
		}{"a poisoned transaction, then 201", func(ctx context.Context, id string) (int, error) {
			if err := b.WriteEffect(ctx, id); err != nil {
				return 0, err
			}
			return http.StatusCreated, b.PoisonTx(ctx)
		}})
	}
	for _, d := range drills {
		key := uniq("drill")
		if first := run(key, d.h); first.Status < 500 {
			t.Errorf("%s: the first attempt answered %d, want a 5xx", d.name, first.Status)
		}
		if n := effects(t, b, key); n != 0 && !b.NoSharedTx {
			t.Errorf("%s: %d business writes after the failed attempt", d.name, n)
		}
		if rec, free := Free(t, b.Store, "alice", key); !free {
			t.Errorf("%s: the failed attempt left the key %s", d.name, rec.State)
		}
		before := effects(t, b, key)
		if retry := run(key, ok); retry.Status != http.StatusCreated || retry.Header.Get(idem.ReplayedHeader) != "" {
			t.Errorf("%s: the retry answered %d replayed=%q, want a fresh 201", d.name, retry.Status, retry.Header.Get(idem.ReplayedHeader))
		}
		if again := run(key, ok); again.Status != http.StatusCreated || again.Header.Get(idem.ReplayedHeader) != "true" {
			t.Errorf("%s: the third attempt answered %d replayed=%q, want the replay", d.name, again.Status, again.Header.Get(idem.ReplayedHeader))
		}
		if n := effects(t, b, key); n != before+1 {
			t.Errorf("%s: %d business writes in the end, want %d", d.name, n, before+1)
		}
	}
	key := uniq("bad")
	bad := func(context.Context, string) (int, error) { return http.StatusBadRequest, nil }
	if r := run(key, bad); r.Status != http.StatusBadRequest {
		t.Fatalf("the 400 handler answered %d", r.Status)
	}
	if r := run(key, ok); r.Status != http.StatusBadRequest || r.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("the retry of a 400 answered %d replayed=%q, want the stored 400", r.Status, r.Header.Get(idem.ReplayedHeader))
	}
}

type ctxKey struct{}

// testTxContext: the context BeginTx returns keeps its parent's values
// and cancellation and carries the transaction to contexts derived from
// it; a request context cancelled while the handler runs does not strand
// the transaction, whose settle runs on a context without the
// cancellation, as the engine's does.
func testTxContext(t *testing.T, b Backend) {
	ctx := ctxT(t)
	req := claimReq("alice", uniq("k"), "body")
	mustClaim(t, b.Store, req)
	parent, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, "v"))
	defer cancel()
	txCtx, tx, err := b.Store.BeginTx(parent, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	child, cancelChild := context.WithCancel(txCtx)
	defer cancelChild()
	if txCtx.Value(ctxKey{}) != "v" || child.Value(ctxKey{}) != "v" {
		t.Fatal("the transaction's context lost its parent's value")
	}
	if err := b.WriteEffect(child, req.Key); err != nil {
		t.Fatalf("a write through a context derived from BeginTx's: %v", err)
	}
	if !tx.Used() {
		t.Fatal("Used() is false after a write through the transaction's context")
	}
	if err := b.WriteEffect(ctx, req.Key+"/outside"); err == nil {
		t.Fatal("WriteEffect found a transaction in a context BeginTx did not return")
	}
	cancel()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
	}
	if !errors.Is(txCtx.Err(), context.Canceled) {
		t.Fatalf("after the parent was cancelled the transaction's context has %v", txCtx.Err())
	}
	if err := tx.Settle(context.WithoutCancel(parent), idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("c")}); err != nil {
		t.Fatalf("settle after the request was cancelled: %v", err)
	}
	if n := effects(t, b, req.Key); n != 1 {
		t.Fatalf("%d business writes after the settle, want 1", n)
	}
	if rec := get(t, b, "alice", req.Key); rec.State != idemstore.StateCompleted {
		t.Fatalf("record %s after the settle, want completed", rec.State)
	}
}

// testRequestIDBound: a request id longer than idemstore.MaxRequestIDLength is
// stored cut at a character boundary (idemstore.BoundRequestID), whoever calls
// Claim.
func testRequestIDBound(t *testing.T, b Backend) {
	for _, id := range []string{strings.Repeat("r", idemstore.MaxRequestIDLength), strings.Repeat("r", idemstore.MaxRequestIDLength-1) + "ü",
		strings.Repeat("ü", idemstore.MaxRequestIDLength)} {
		req := claimReq("alice", uniq("rid"), "body")
		req.RequestID = id
		mustClaim(t, b.Store, req)
		want := idemstore.BoundRequestID(id)
		if got := get(t, b, "alice", req.Key).RequestID; got != want {
			t.Fatalf("request id of %d bytes stored as %d bytes %q, want %d bytes", len(id), len(got), got, len(want))
		}
	}
}

// testListStaleByLeaseDeadline: ListStale orders by the records' own lease
// deadlines, not by when their leases were taken, Uncertain ones included;
// a takeover moves a record out of the list at once.
func testListStaleByLeaseDeadline(t *testing.T, b Backend) {
	ctx := ctxT(t)
	principal := uniq("deadline")
	claim := func(name string, lease time.Duration) idemstore.ClaimRequest {
		req := claimReq(principal, uniq(name), "body")
		req.Lease = lease
		mustClaim(t, b.Store, req)
		return req
	}
	// Claimed long, short, kept; their deadlines run short, kept, long.
	long := claim("long", 3*Lease/2)
	short := claim("short", Lease/4)
	time.Sleep(Lease / 2)
	kept := claim("kept", time.Hour)
	if err := b.Store.Keep(ctx, leaseOf(kept)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(Lease + 150*time.Millisecond)
	mine := func() []idem.Record {
		t.Helper()
		stale, err := b.Store.ListStale(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var out []idem.Record
		for _, r := range stale {
			if r.Principal == principal {
				out = append(out, r)
			}
		}
		return out
	}
	got := mine()
	if len(got) != 3 || got[0].Key != short.Key || got[1].Key != kept.Key || got[2].Key != long.Key {
		t.Fatalf("ListStale = %v, want [%s %s %s]: by lease deadline", keysOf(got), short.Key, kept.Key, long.Key)
	}
	if got[0].Uncertain || !got[1].Uncertain || got[2].Uncertain {
		t.Fatalf("Uncertain marks %v %v %v, want only the kept record's", got[0].Uncertain, got[1].Uncertain, got[2].Uncertain)
	}
	ask := claimReq(principal, kept.Key, "body")
	ask.TakeOverUncertain, ask.Lease = true, time.Hour
	if res := mustClaim(t, b.Store, ask); !res.Reclaimed {
		t.Fatalf("takeover of the kept record: %+v", res)
	}
	if got := mine(); len(got) != 2 || got[0].Key != short.Key || got[1].Key != long.Key {
		t.Fatalf("after the takeover ListStale = %v, want [%s %s]", keysOf(got), short.Key, long.Key)
	}
}

func keysOf(recs []idem.Record) []string {
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	return keys
}

// testConnectionLost: the server drops the transaction's connection while
// the handler runs. Settle fails with a transient error, not ErrLeaseLost,
// nothing commits, Rollback returns nil and the claim can be released for
// the retry.
func testConnectionLost(t *testing.T, b Backend) {
	if b.DropConn == nil {
		t.Skip("not applicable: the store's transaction holds no connection of its own (Backend.DropConn)")
	}
	ctx := ctxT(t)
	req, txCtx, tx := claimAndBegin(t, b)
	if err := b.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	if err := b.DropConn(txCtx); err != nil {
		t.Fatalf("DropConn: %v", err)
	}
	err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("x")})
	if err == nil || errors.Is(err, idemstore.ErrLeaseLost) || !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("settle on a dropped connection = %v, want a transient error", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback after the failed settle: %v", err)
	}
	if n := effects(t, b, req.Key); n != 0 {
		t.Fatalf("%d business writes committed", n)
	}
	if err := b.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if rec, free := Free(t, b.Store, "alice", req.Key); !free {
		t.Fatalf("after the release the record is %s", rec.State)
	}
}
