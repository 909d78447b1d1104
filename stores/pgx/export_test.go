package idempgx

// ClaimSQL exposes the claim statement to the tests, which run it inside a
// transaction to ask PostgreSQL whether it assigned a transaction id.
func ClaimSQL(s *Store) string { return s.sql.claim }

// ClaimReruns reports how often Claim ran its statement again.
func ClaimReruns(s *Store) int64 { return s.reruns.Load() }

// TxControlStatement exposes the lexer's verdict to the external tests.
func TxControlStatement(sql string) (string, bool) { return txControlStatement(sql) }

// ClaimPrelude exposes the statement that goes before the claim, in the
// same implicit transaction, for a claim that is durable or not.
func ClaimPrelude(s *Store, durable bool) string {
	if durable {
		return s.sql.durablePrelude
	}
	return s.sql.claimPrelude
}

// TakeoverSQL exposes the stale takeover's UPDATE.
func TakeoverSQL(s *Store) string { return s.sql.takeover }
