package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempgx "github.com/idemgo/idem/stores/pgx"
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
func flushedUpTo(t testing.TB, ctx context.Context, pool *pgxpool.Pool, pos string) bool {
	t.Helper()
	return flushed(t, ctx, pool, ">=", pos)
}

// flushedPast reports whether PostgreSQL's WAL is flushed beyond pos,
// asked on pool: pos read before a commit, the commit was flushed. (Up to
// pos would hold without any flush when nothing was written since the
// last one.)
func flushedPast(t testing.TB, ctx context.Context, pool *pgxpool.Pool, pos string) bool {
	t.Helper()
	return flushed(t, ctx, pool, ">", pos)
}

func flushed(t testing.TB, ctx context.Context, pool *pgxpool.Pool, op, pos string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_flush_lsn() "+op+" $1::pg_lsn", pos).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// walInsert returns the WAL insert position, read through q.
func walInsert(t testing.TB, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var pos string
	if err := q.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_insert_lsn()::text").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}
