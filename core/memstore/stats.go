package memstore

import (
	"context"
	"time"

	idem "github.com/idemgo/idem/core"
)

// Stats implements idem.Store: one pass over the records under the store's
// lock, every figure counted.
func (s *Store) Stats(_ context.Context, staleAfter time.Duration) (idem.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UnixNano()
	var st idem.Stats
	oldest := int64(-1)
	for _, e := range s.records {
		switch e.state {
		case idem.StateInProgress:
			st.InProgress++
			if now-e.locked >= int64(staleAfter) {
				st.Stale++
			}
			if oldest < 0 || e.locked < oldest {
				oldest = e.locked
			}
		case idem.StateCompleted:
			st.Completed++
		case idem.StateFailed:
			st.Failed++
		case idem.StateReleased:
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
