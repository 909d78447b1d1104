package idempgx_test

import (
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
