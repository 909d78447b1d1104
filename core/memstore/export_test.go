package memstore

// QueueLen returns how many places the expiry queue holds.
func (s *Store) QueueLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.expiries)
}

// Bytes returns what the store counts its records as costing.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}
