package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

// TestEngineFailureDrills drives the store through core's engine the way an
// adapter does: every failing attempt leaves no business row and no stored
// response, and the retry really runs again (a fresh 201, not a replay),
// ending with exactly one business row.
func TestEngineFailureDrills(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 6, nil))
	ctx := testCtx(t)
	engine, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: e.Store, RequestTimeout: 2 * time.Second,
		StoreTimeout: 5 * time.Second, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	type handler func(ctx context.Context, id string) (int, error)
	write := func(ctx context.Context, id string) error { return e.WriteEffect(ctx, id) }
	ok := func(ctx context.Context, id string) (int, error) { return http.StatusCreated, write(ctx, id) }
	run := func(key string, h handler) *idem.Response {
		t.Helper()
		a, resp := engine.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "alice", Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)})
		if a == nil {
			return resp
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					resp = &idem.Response{Status: 500} // what a framework's recovery would send
				}
			}()
			defer a.Abort()
			status, herr := h(a.Context(), key)
			resp = a.Finish(idem.Result{Status: status, Err: herr, Body: []byte("done"),
				Header: http.Header{"Content-Type": {"text/plain"}}})
		}()
		return resp
	}

	drills := map[string]handler{
		"dependency outage (503 after the write)": func(ctx context.Context, id string) (int, error) {
			return http.StatusServiceUnavailable, write(ctx, id)
		},
		"panic after the write": func(ctx context.Context, id string) (int, error) {
			if err := write(ctx, id); err != nil {
				return 0, err
			}
			panic("boom")
		},
		"swallowed SQL error, then 201 (commit fails)": func(ctx context.Context, id string) (int, error) {
			if err := write(ctx, id); err != nil {
				return 0, err
			}
			tx, _ := idempgx.Tx(ctx)
			_, _ = tx.Exec(ctx, "SELECT 1/0")
			return http.StatusCreated, nil
		},
		"deadline exceeded after the write": func(ctx context.Context, id string) (int, error) {
			if err := write(ctx, id); err != nil {
				return 0, err
			}
			<-ctx.Done()
			return http.StatusCreated, nil
		},
		"handler sends COMMIT (refused), then 201 (commit fails)": func(ctx context.Context, id string) (int, error) {
			if err := write(ctx, id); err != nil {
				return 0, err
			}
			tx, _ := idempgx.Tx(ctx)
			if _, err := tx.Exec(ctx, "COMMIT"); !errors.Is(err, idemstore.ErrTxOwned) {
				t.Errorf("the handler's COMMIT = %v, want ErrTxOwned", err)
			}
			return http.StatusCreated, nil
		},
	}
	for name, h := range drills {
		key := "drill-" + randHex(4)
		first := run(key, h)
		if first.Status < 500 {
			t.Errorf("%s: first attempt answered %d", name, first.Status)
		}
		if n := e.mustCount(t, key); n != 0 {
			t.Errorf("%s: %d business rows after the failed attempt", name, n)
		}
		if rec, free := storetest.Free(t, e.Store, "alice", key); !free {
			t.Errorf("%s: the failed attempt left the key %s", name, rec.State)
		}
		retry := run(key, ok)
		if retry.Status != http.StatusCreated || retry.Header.Get(idem.ReplayedHeader) != "" {
			t.Errorf("%s: retry answered %d replayed=%q, want a fresh 201", name, retry.Status, retry.Header.Get(idem.ReplayedHeader))
		}
		again := run(key, ok)
		if again.Status != http.StatusCreated || again.Header.Get(idem.ReplayedHeader) != "true" {
			t.Errorf("%s: third attempt answered %d replayed=%q, want the replay", name, again.Status, again.Header.Get(idem.ReplayedHeader))
		}
		if n := e.mustCount(t, key); n != 1 {
			t.Errorf("%s: %d business rows in the end, want 1", name, n)
		}
	}

	// A deterministic 400 is stored as failed, with the handler's writes.
	key := "bad-" + randHex(4)
	bad := func(ctx context.Context, id string) (int, error) { return http.StatusBadRequest, nil }
	if r := run(key, bad); r.Status != 400 {
		t.Fatalf("400 handler answered %d", r.Status)
	}
	if r := run(key, ok); r.Status != 400 || r.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("retry of a 400 answered %d replayed=%q, want the stored 400", r.Status, r.Header.Get(idem.ReplayedHeader))
	}
}

// TestConnectionLostBeforeSettle: the server drops the transaction's
// connection while the handler runs. Settle fails with a transient error,
// nothing commits, the connection is not returned to the pool, and the claim
// can be released for the retry.
func TestConnectionLostBeforeSettle(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 4, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	req := claimReq("alice", "lost-"+randHex(4), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	htx, _ := idempgx.Tx(txCtx)
	var pid int32
	if err := htx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate: %v %v", killed, err)
	}
	err = tx.Settle(ctx, okResponse("x"))
	if err == nil || errors.Is(err, idemstore.ErrLeaseLost) || !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("settle on a dropped connection = %v, want a transient error", err)
	}
	t.Logf("settle on a dropped connection: %v", err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback after a failed settle: %v", err)
	}
	if n := e.mustCount(t, req.Key); n != 0 {
		t.Fatalf("%d rows committed", n)
	}
	if err := e.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release: %v", err)
	}
	// The pool still works.
	if rec, err := e.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateReleased {
		t.Fatalf("get after release: %s, %v", rec.State, err)
	}
}

// TestPoolPinning: one principal's slow requests cannot make another's
// queue for the pool (a pool of 10, 3 s handlers, 12 at once).
func TestPoolPinning(t *testing.T) {
	e := newEnv(t, newPool(t, 10, nil))
	storetest.PoolPinning(t, e.Store, 10, 3*time.Second)
}

// TestDownstreamKeyMakesTheClaimDurable: a claim commits without waiting
// for its WAL flush, so a database crash could still take it back with its
// nonce. The first DownstreamKey of an attempt waits for the flush (the
// Tx's Sync), so a key never goes to a provider while the nonce it is
// derived from can be lost: right after it returns, PostgreSQL's flushed
// WAL reaches past the position read right before the claim. Attempts in
// a row, each checked within milliseconds of its claim, well inside the
// WAL writer's 200 ms delay, half of them after the handler's own write.
func TestDownstreamKeyMakesTheClaimDurable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 4, nil))
	ctx := testCtx(t)
	engine, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: e.Store})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		key := "durable-" + randHex(4)
		before := walInsert(t, ctx, e.Pool) // before the claim's commit record
		att, resp := engine.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "alice",
			Key: key, ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)})
		if att == nil {
			t.Fatalf("attempt %d: %d %s", i, resp.Status, resp.Body)
		}
		t.Cleanup(att.Abort) // a no-op once finished; an open transaction would block the pool's Close
		if i%2 == 1 {
			if err := e.WriteEffect(att.Context(), key); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := idem.DownstreamKey(att.Context(), "charge"); err != nil {
			t.Fatal(err)
		}
		if !flushedPast(t, ctx, e.Pool, before) {
			t.Fatalf("attempt %d: DownstreamKey returned before the WAL was flushed past %s, read before the claim", i, before)
		}
		att.Finish(idem.Result{Status: http.StatusCreated})
	}
}

// TestDownstreamKeyOnAFullPool: DownstreamKey makes the claim durable on
// the handler's own connection, so handlers holding every connection of
// the pool all get their keys.
func TestDownstreamKeyOnAFullPool(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 4, nil))
	storetest.DownstreamKeyOnAFullPool(t, e.Store, 4)
}

// TestSyncWaitsForTheClaimOnly: the position the Tx's Sync waits for is
// taken when the transaction begins: past the claim's commit record,
// before the handler's own writes, which no flush reaches before some
// commit follows them. (On a server where nothing else commits, a Sync
// that waited for them would wait for many seconds.)
func TestSyncWaitsForTheClaimOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 2, nil))
	ctx := testCtx(t)
	req := claimReq("alice", "sync-"+randHex(4), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	claimed := walInsert(t, ctx, e.Pool)
	txCtx, stx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stx.Rollback(ctx) }()
	htx, _ := idempgx.Tx(txCtx)
	beforeWrites := walInsert(t, txCtx, htx)
	for i := range 50 {
		if err := e.WriteEffect(txCtx, fmt.Sprintf("%s/%d", req.Key, i)); err != nil {
			t.Fatal(err)
		}
	}
	var target string
	var ok bool
	if err := htx.QueryRow(txCtx, `SELECT current_setting('idem.sync_lsn'), current_setting('idem.sync_lsn')::pg_lsn >= $1::pg_lsn
		AND current_setting('idem.sync_lsn')::pg_lsn <= $2::pg_lsn`, claimed, beforeWrites).Scan(&target, &ok); err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("Sync's position %s is not between the claim's (%s) and the handler's first write (%s)", target, claimed, beforeWrites)
	}
	if got, err := idempgx.SyncTarget(ctx, stx); err != nil || got != target {
		t.Fatalf("Sync waits for %s (%v), want BeginTx's position %s", got, err, target)
	}
	if err := stx.(idemstore.Syncer).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !flushedUpTo(t, ctx, e.Pool, target) {
		t.Fatalf("Sync returned before the WAL was flushed up to %s", target)
	}
}
