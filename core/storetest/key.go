package storetest

// FingerprintKey is a fixed idem.Config.FingerprintKey for tests, so that
// engines built by different tests (or before and after a restart) agree
// on fingerprints. It is public and therefore no secret: a service reads its
// own key from a secret store.
var FingerprintKey = []byte("idem storetest fingerprint key, not a secret")
