package idemgorm

import (
	"context"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// statsQuery counts every figure of idemstore.Stats in one statement on the
// database clock, in the dialect's own time arithmetic. Its one bind
// parameter is staleAfter in microseconds.
func (s *Store) statsQuery() string {
	d := s.dialect
	now := d.nowExpr()
	return d.bind("SELECT " + d.timeOut(now) + "," +
		" COUNT(CASE WHEN state = 'in_progress' THEN 1 END)," +
		" COUNT(CASE WHEN state = 'completed' THEN 1 END)," +
		" COUNT(CASE WHEN state = 'failed' THEN 1 END)," +
		" COUNT(CASE WHEN state = 'released' THEN 1 END)," +
		" COUNT(CASE WHEN state = 'in_progress' AND locked_at <= " + d.nowMinus() + " THEN 1 END)," +
		" " + d.timeOut("MIN(CASE WHEN state = 'in_progress' THEN locked_at END)") + "," +
		" COUNT(CASE WHEN expires_at <= " + now + " THEN 1 END)" +
		" FROM " + d.qualified(s.qtable))
}

// Stats implements idemstore.Store with one statement that counts every figure
// (none is NotCounted), on the primary when dbresolver is configured. It
// reads the whole table: run it from an operator's tool or a gauge every
// minute or so, not per request.
func (s *Store) Stats(ctx context.Context, staleAfter time.Duration) (idemstore.Stats, error) {
	pool, err := s.pool()
	if err != nil {
		return idemstore.Stats{}, s.wrap("stats", err)
	}
	var (
		st                                                  idemstore.Stats
		now                                                 timeValue
		oldest                                              nullTime
		inProgress, completed, failed, released, stale, exp int64
	)
	err = pool.QueryRowContext(ctx, s.statsQuery(), staleAfter.Microseconds()).
		Scan(&now, &inProgress, &completed, &failed, &released, &stale, &oldest, &exp)
	if err != nil {
		return idemstore.Stats{}, s.wrap("stats", err)
	}
	st.Now, st.OldestLockedAt = now.t, oldest.t
	st.InProgress, st.Completed, st.Failed = idemstore.Count(inProgress), idemstore.Count(completed), idemstore.Count(failed)
	st.Released, st.Stale, st.Expired = idemstore.Count(released), idemstore.Count(stale), idemstore.Count(exp)
	return st, nil
}

// nullTime is a timeValue that may be NULL (left zero).
type nullTime struct{ timeValue }

func (v *nullTime) Scan(src any) error {
	if src == nil {
		v.t = time.Time{}
		return nil
	}
	return v.timeValue.Scan(src)
}
