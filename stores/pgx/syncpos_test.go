package idempgx_test

import (
	"testing"
	"time"

	idempgx "github.com/idemgo/idem/stores/pgx"
)

// TestSyncPositionAtBegin: the WAL position BeginTx records for Sync
// (idem.sync_lsn) is past the claim's commit record, in a connection's
// first transaction (whose setup also sets the keepalive settings) and in
// later ones. Without it Sync would wait for the insert position at the
// call, past the handler's own writes, which no commit may flush for
// seconds.
func TestSyncPositionAtBegin(t *testing.T) {
	e := newEnv(t, newPool(t, 1, nil))
	ctx := testCtx(t)
	for i := range 2 {
		req := claimReq("alice", "sync-"+randHex(4), "body", time.Minute)
		if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		var claimed string
		if err := e.Pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
		if err != nil {
			t.Fatal(err)
		}
		h, _ := idempgx.Tx(txCtx)
		var began *string
		var past bool
		err = h.QueryRow(ctx, `SELECT current_setting('idem.sync_lsn', true),
			coalesce(current_setting('idem.sync_lsn', true)::pg_lsn >= $1::pg_lsn, false)`, claimed).Scan(&began, &past)
		_ = tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if began == nil || !past {
			t.Errorf("transaction %d: idem.sync_lsn = %v, want a position at or past %s, read after the claim committed", i, began, claimed)
		}
	}
}
