package idemfibertest_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/fiber/idemfibertest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// Example runs the HTTP-level suite on this adapter through Harness: the
// middleware mounted on a real server on 127.0.0.1 after an authentication
// middleware, here on the in-memory store.
func Example() {
	_ = func(t *testing.T) {
		adaptertest.Run(t, idemfibertest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
	}
}
