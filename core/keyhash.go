package idem

// KeyHash returns the digest the engine logs instead of an idempotency key
// (unless Config.LogKeys): the first 16 hex digits of SHA-256 over the
// principal, a NUL and the key. An observer that exports a key (a span
// attribute, a log line of its own) exports this instead, so its records
// correlate with the engine's log lines without holding the key, which is
// a bearer of the client's request.
func KeyHash(principal, key string) string { return keyHash(principal, key) }
