package idempgx_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

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
