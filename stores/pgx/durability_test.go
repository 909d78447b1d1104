package idempgx_test

import (
	"testing"
	"time"

	idempgx "github.com/idemgo/idem/stores/pgx"
)

// TestOnlyTheClaimCommitsWithoutFlush: the claim (its prelude) turns
// synchronous_commit off for its own transaction and nothing else. The
// session keeps its setting (so a pool, or PgBouncer, hands the connection
// on unchanged), and the handler's transaction, whose settle commit is what
// makes the claim durable, commits with the server's setting.
func TestOnlyTheClaimCommitsWithoutFlush(t *testing.T) {
	pool := newPool(t, 1, nil) // one connection: every statement below shares the session
	e := newEnv(t, pool)
	ctx := testCtx(t)
	setting := func() string {
		var v string
		if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	server := setting()
	if server == "off" {
		t.Fatalf("the test server runs with synchronous_commit=off; this test needs it on")
	}

	// Inside a transaction, the setting of the claim's prelude is visible.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, idempgx.ClaimPrelude(e.Store)); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, idempgx.ClaimSQL(e.Store), "alice", "dur-"+randHex(6), fp("body"), randHex(16), "req", int64(3600e6), randHex(16))
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var inTx string
	if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if inTx != "off" {
		t.Fatalf("synchronous_commit in the claim's transaction = %q, want off", inTx)
	}

	// An autocommitted claim leaves the session as it was.
	req := claimReq("alice", "dur-"+randHex(6), "body", time.Minute)
	if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if got := setting(); got != server {
		t.Fatalf("synchronous_commit after a claim = %q, want the session's %q", got, server)
	}

	// The handler's transaction, which settles, commits with the server's.
	txCtx, stx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	htx, _ := idempgx.Tx(txCtx)
	var inHandler string
	if err := htx.QueryRow(txCtx, "SHOW synchronous_commit").Scan(&inHandler); err != nil {
		t.Fatal(err)
	}
	if inHandler != server {
		t.Fatalf("synchronous_commit in the handler's transaction = %q, want %q", inHandler, server)
	}
	if err := stx.Settle(ctx, okResponse("ok")); err != nil {
		t.Fatal(err)
	}
	t.Logf("synchronous_commit: claim's transaction %s, session and handler's transaction %s", inTx, server)
}
