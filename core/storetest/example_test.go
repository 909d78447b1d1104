package storetest_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

// Example shows how a store's own tests run the conformance suite, hostile
// handlers included: a function that makes a fresh Backend on a real server
// for each test. MemBackend is the in-memory one; a SQL store's Backend
// also sets Dialect, Exec, EndHandle and, where it has one, EndTxAround.
func Example() {
	_ = func(t *testing.T) {
		storetest.Run(t, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
	}
}
