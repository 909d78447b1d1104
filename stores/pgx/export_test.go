package idempgx

import (
	"context"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// ClaimSQL exposes the claim statement to the tests, which run it inside a
// transaction to ask PostgreSQL whether it assigned a transaction id.
func ClaimSQL(s *Store) string { return s.sql.Claim }

// ClaimReruns reports how often Claim ran its statement again.
func ClaimReruns(s *Store) int64 { return s.reruns.Load() }

// TxControlStatement exposes the SQL guard's verdict to the external tests.
func TxControlStatement(sql string) (string, bool) { return txControl(sql) }

// ClaimPrelude exposes the statement that goes before the claim, in the
// same implicit transaction, for a claim that is durable or not.
func ClaimPrelude(s *Store, durable bool) string {
	if durable {
		return s.sql.DurablePrelude
	}
	return s.sql.ClaimPrelude
}

// SyncTarget runs the first statement of tx's Sync and returns the WAL
// position Sync would wait for.
func SyncTarget(ctx context.Context, tx idemstore.Tx) (string, error) {
	target, _, err := pgsql.SyncTarget(ctx, tx.(*storeTx).syncQuery)
	return target.String(), err
}

// RawConn returns the connection under h, unfiltered, which no method of
// the handle hands out: the tests end the transaction on it behind the
// handle, to prove that the store detects it.
func RawConn(h *Handle) *pgx.Conn { return h.rawConn() }
