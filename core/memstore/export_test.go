package memstore

// QueueLen returns how many places the expiry queue holds.
func (s *Store) QueueLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.expiries)
}
