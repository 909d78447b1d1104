package idemgorm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/core/idemstore"
)

// leaseLostMarker is in the error the pipelined settle raises when its
// fence misses (queries.settlePipe): it is not a valid integer, which is how
// it raises.
const leaseLostMarker = "idemgorm lease lost"

// pgxConn is what pgx's database/sql driver (*stdlib.Conn) hands to
// (*sql.Conn).Raw: the pgx connection under the database/sql one.
type pgxConn interface {
	Conn() *pgx.Conn
}

var errNotPgx = errors.New("idemgorm: not pgx's database/sql driver")

// settleAndCommit sends the settle and COMMIT in one round trip, as one pgx
// batch, when the transaction's connection is pgx's database/sql driver
// (what gorm.io/driver/postgres uses). It reports false, having sent
// nothing, for any other driver; the caller then runs them one after the
// other.
//
// The batch is safe because the settle raises when its fence misses
// (queries.settlePipe): the server then skips the COMMIT queued behind it,
// up to the batch's one Sync, so the handler's writes never commit without
// the outcome. On any error the transaction is rolled back or its
// connection closed (endConn), never returned to the pool with its state
// unknown. args are the settle's, in queries.settle's order.
func (t *storeTx) settleAndCommit(ctx context.Context, args []any) (bool, error) {
	var (
		settleErr, commitErr error
		tag                  pgconn.CommandTag
	)
	err := t.conn.Raw(func(dc any) error {
		c, ok := dc.(pgxConn)
		if !ok {
			return errNotPgx
		}
		q := t.store.q
		b := &pgx.Batch{}
		b.Queue(q.settlePins, q.lockTimeoutPG, q.stmtTimeoutPG)
		b.Queue(q.settlePipe, args...)
		b.Queue("COMMIT")
		br := c.Conn().SendBatch(ctx, b)
		var one int
		if _, settleErr = br.Exec(); settleErr == nil {
			settleErr = br.QueryRow().Scan(&one)
		}
		tag, commitErr = br.Exec()
		return br.Close()
	})
	if errors.Is(err, errNotPgx) {
		return false, nil
	}
	switch {
	case settleErr != nil:
		t.endConn(ctx, false)
		if isLeaseLost(settleErr) {
			return true, idemstore.ErrLeaseLost
		}
		return true, t.store.wrap("settle", settleErr)
	case commitErr != nil:
		t.endConn(ctx, false)
		return true, t.store.wrap("settle: commit", commitErr)
	case err != nil:
		t.endConn(ctx, false)
		return true, t.store.wrap("settle: commit", err)
	case tag.String() != "COMMIT":
		// The server answered COMMIT with ROLLBACK: the transaction had
		// failed, and nothing of it was stored.
		t.endConn(ctx, false)
		return true, fmt.Errorf("idemgorm: settle: COMMIT answered %q; nothing was stored: %w", tag.String(), ErrTxEnded)
	}
	t.endConn(ctx, true)
	return true, nil
}

// isLeaseLost reports whether err is the pipelined settle's missed fence.
func isLeaseLost(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "22P02" && strings.Contains(pg.Message, leaseLostMarker)
}
