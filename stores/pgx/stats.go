package idempgx

import (
	"context"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"
)

// Stats implements idem.Store with one statement that counts every figure
// (none is NotCounted). It reads the whole table, so it costs a sequential
// scan, bounded like every statement of the store by WithStatementTimeout
// (past it the error wraps idem.ErrTransient): run it from an operator's
// tool or a gauge every minute or so, not per request.
func (s *Store) Stats(ctx context.Context, staleAfter time.Duration) (idem.Stats, error) {
	var (
		st                                                  idem.Stats
		inProgress, completed, failed, released, stale, exp int64
		oldest                                              *time.Time
	)
	err := s.onConn(ctx, func() error {
		return s.query(ctx, func(rows pgx.Rows) error {
			return rows.Scan(&st.Now, &inProgress, &completed, &failed, &released, &stale, &oldest, &exp)
		}, s.sql.Stats, micros(staleAfter))
	})
	if err != nil {
		return idem.Stats{}, wrap("stats", err)
	}
	st.InProgress, st.Completed, st.Failed = idem.Count(inProgress), idem.Count(completed), idem.Count(failed)
	st.Released = idem.Count(released)
	st.Stale, st.Expired = idem.Count(stale), idem.Count(exp)
	if oldest != nil {
		st.OldestLockedAt = *oldest
	}
	return st, nil
}
