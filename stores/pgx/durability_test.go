package idempgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// flushedPast reports whether PostgreSQL's WAL is flushed beyond pos,
// asked on pool: pos read before a commit, the commit was flushed. (Up to
// pos would hold without any flush when nothing was written since the
// last one.)
func flushedPast(t testing.TB, ctx context.Context, pool *pgxpool.Pool, pos string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_flush_lsn() > $1::pg_lsn", pos).Scan(&ok); err != nil {
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
