package idemadapter_test

import (
	"testing"

	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestFingerprintVersion: the fingerprint the engine makes starts with the
// documented version byte and has the length stores size their column for.
func TestFingerprintVersion(t *testing.T) {
	t.Parallel()
	fp := idemadapter.Fingerprint(storetest.FingerprintKey, "POST", "/payments", "alice", "application/json", []byte(`{"a":1}`), nil)
	if len(fp) != idemstore.FingerprintSize || fp[0] != idemadapter.FingerprintVersion {
		t.Fatalf("fingerprint %x: want %d bytes starting with %d", fp, idemstore.FingerprintSize, idemadapter.FingerprintVersion)
	}
}
