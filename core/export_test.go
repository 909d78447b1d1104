package idem

// The engine's key parser and JSON canonicaliser, for the tests and fuzz
// targets of package idem_test; applications and adapters never call them.
var (
	ParseKey      = parseKey
	CanonicalJSON = canonicalJSON
)
