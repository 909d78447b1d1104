package memstore

import (
	"context"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// Stats implements idemstore.Store: one pass over the records under the store's
// lock, every figure counted.
func (s *Store) Stats(_ context.Context, staleAfter time.Duration) (idemstore.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UnixNano()
	var st idemstore.Stats
	oldest := int64(-1)
	for _, e := range s.records {
		switch e.state {
		case idemstore.StateInProgress:
			st.InProgress++
			if now-e.locked >= int64(staleAfter) {
				st.Stale++
			}
			if oldest < 0 || e.locked < oldest {
				oldest = e.locked
			}
		case idemstore.StateCompleted:
			st.Completed++
		case idemstore.StateFailed:
			st.Failed++
		case idemstore.StateReleased:
			st.Released++
		}
		if now >= e.expires {
			st.Expired++
		}
	}
	st.Now = time.Unix(0, now)
	if oldest >= 0 {
		st.OldestLockedAt = time.Unix(0, oldest)
	}
	return st, nil
}
