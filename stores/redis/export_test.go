package idemredis

// Internals the external tests look at.

// ScriptSHAs are the SHA-1 digests EVALSHA sends for the claim and settle
// scripts: unique byte patterns on the wire for the fault proxy.
var ClaimSHA, SettleSHA, ReleaseSHA = claimScript.Hash(), settleScript.Hash(), releaseScript.Hash()

// KeysFor returns the record key, index key and index member of (principal, key).
func (s *Store) KeysFor(principal, key string) (record, index, member string) {
	k := s.keysFor(principal, key)
	return k.record, k.index, k.member
}

// SplitMember exposes splitMember.
var SplitMember = splitMember
