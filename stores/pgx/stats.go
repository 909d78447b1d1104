package idempgx

import (
	"context"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/jackc/pgx/v5"
)

// Stats implements idemstore.Store with one statement that counts every figure
// (none is NotCounted). It reads the whole table, so it costs a sequential
// scan, bounded like every statement of the store by WithStatementTimeout
// (past it the error wraps idemstore.ErrTransient): run it from an operator's
// tool or a gauge every minute or so, not per request.
func (s *Store) Stats(ctx context.Context, staleAfter time.Duration) (idemstore.Stats, error) {
	var (
		st                                                  idemstore.Stats
		inProgress, completed, failed, released, stale, exp int64
		oldest                                              *time.Time
	)
	err := s.onConn(ctx, func() error {
		return s.query(ctx, func(rows pgx.Rows) error {
			return rows.Scan(&st.Now, &inProgress, &completed, &failed, &released, &stale, &oldest, &exp)
		}, s.sql.Stats, micros(staleAfter))
	})
	if err != nil {
		return idemstore.Stats{}, wrap("stats", err)
	}
	st.InProgress, st.Completed, st.Failed = idemstore.Count(inProgress), idemstore.Count(completed), idemstore.Count(failed)
	st.Released = idemstore.Count(released)
	st.Stale, st.Expired = idemstore.Count(stale), idemstore.Count(exp)
	if oldest != nil {
		st.OldestLockedAt = *oldest
	}
	return st, nil
}
