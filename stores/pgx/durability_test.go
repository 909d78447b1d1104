package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestOnlyTheClaimCommitsWithoutFlush: the claim (its prelude) turns
// synchronous_commit off for its own transaction and nothing else, and a
// Durable claim's prelude turns it on (keeping remote_apply, which is
// stronger). The session keeps its setting (so a pool, or PgBouncer, hands
// the connection on unchanged), and the handler's transaction, whose
// settle commit is what makes the claim durable, commits with the server's
// setting.
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
	for _, c := range []struct {
		durable       bool
		session, want string
	}{{false, server, "off"}, {true, "off", "on"}, {true, "local", "on"}, {true, "remote_apply", "remote_apply"}} {
		inTx := func() string {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = "+c.session); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, idempgx.ClaimPrelude(e.Store, c.durable)); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, idempgx.ClaimSQL(e.Store), "alice", "dur-"+randHex(6), fp("body"), randHex(16), "req",
				int64(3600e6), randHex(16), int64(60e6)); err != nil {
				t.Fatal(err)
			}
			var v string
			if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}()
		if inTx != c.want {
			t.Fatalf("synchronous_commit in the claim's transaction (durable %v, was %s) = %q, want %q", c.durable, c.session, inTx, c.want)
		}
	}

	// An autocommitted claim leaves the session as it was.
	for _, durable := range []bool{false, true} {
		req := claimReq("alice", "dur-"+randHex(6), "body", time.Minute)
		req.Durable = durable
		if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		if got := setting(); got != server {
			t.Fatalf("synchronous_commit after a claim (durable %v) = %q, want the session's %q", durable, got, server)
		}
	}

	// The handler's transaction, which settles, commits with the server's.
	req := claimReq("alice", "dur-"+randHex(6), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
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
	if got := setting(); got != server {
		t.Fatalf("synchronous_commit after a settle = %q, want the session's %q", got, server)
	}
}

// flushedUpTo reports whether PostgreSQL's WAL is flushed up to at least
// pos, asked on pool.
func flushedUpTo(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pos string) bool {
	t.Helper()
	return flushed(t, ctx, pool, ">=", pos)
}

// flushedPast reports whether PostgreSQL's WAL is flushed beyond pos,
// asked on pool: pos read before a commit, the commit was flushed. (Up to
// pos would hold without any flush when nothing was written since the
// last one.)
func flushedPast(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pos string) bool {
	t.Helper()
	return flushed(t, ctx, pool, ">", pos)
}

func flushed(t *testing.T, ctx context.Context, pool *pgxpool.Pool, op, pos string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_flush_lsn() "+op+" $1::pg_lsn", pos).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// walInsert returns the WAL insert position, read through q.
func walInsert(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var pos string
	if err := q.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_insert_lsn()::text").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}

// durableRounds is how often the durability tests below repeat: each
// round a commit that did not wait for its flush is caught unless
// something else on the server flushed the WAL in the few hundred
// microseconds between the commit and the check, which on a shared server
// happens now and then, never every time.
const durableRounds = 20

// TestDurableClaimAndKeepAreFlushed: a Durable claim (ClaimRequest.Durable,
// Config.DurableClaims) and a Keep commit durably, even on pooled sessions
// a handler left with synchronous_commit off: when the call returns, the
// WAL is flushed past the position read right before it. A commit that did
// not wait for the flush leaves it to the WAL writer, up to
// wal_writer_delay later.
func TestDurableClaimAndKeepAreFlushed(t *testing.T) {
	cfg := idempgxtest.PoolConfig(t, 2)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET synchronous_commit = off")
		return err
	}
	pool := idempgxtest.OpenPool(t, cfg)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	for i := range durableRounds {
		before := walInsert(t, ctx, pool)
		req := claimReq("alice", "durable-"+randHex(6), "body", time.Minute)
		req.Durable = true
		if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
			t.Fatalf("round %d: claim: %+v %v", i, res, err)
		}
		if !flushedPast(t, ctx, pool, before) {
			t.Fatalf("round %d: a Durable claim returned before the WAL was flushed past %s, read before it", i, before)
		}
		before = walInsert(t, ctx, pool)
		if err := e.Store.Keep(ctx, leaseOf(req)); err != nil {
			t.Fatal(err)
		}
		if !flushedPast(t, ctx, pool, before) {
			t.Fatalf("round %d: Keep returned before the WAL was flushed past %s, read before it", i, before)
		}
	}
}

// TestSettleCommitsDurably: the settle's commit waits for its WAL flush
// however the handler set synchronous_commit, for its transaction or for
// the session it leaves in the pool: right after Settle returns, the WAL
// is flushed past the position the handler read after its writes.
func TestSettleCommitsDurably(t *testing.T) {
	pool := newPool(t, 2, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	for _, set := range []string{"SET LOCAL synchronous_commit = off", "SET synchronous_commit = off", "SET LOCAL synchronous_commit = local"} {
		for i := range durableRounds {
			req := claimReq("alice", "settle-"+randHex(6), "body", time.Minute)
			if _, err := e.Store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			txCtx, stx, err := e.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			htx, _ := idempgx.Tx(txCtx)
			if _, err := htx.Exec(txCtx, set); err != nil {
				t.Fatal(err)
			}
			if err := e.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			written := walInsert(t, txCtx, htx)
			if err := stx.Settle(ctx, okResponse("ok")); err != nil {
				t.Fatal(err)
			}
			if !flushedPast(t, ctx, pool, written) {
				t.Fatalf("%s, round %d: Settle returned before the WAL was flushed past the handler's writes (%s)", set, i, written)
			}
		}
	}
}
