package idemgrpctest_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/grpc/idemgrpctest"
	"github.com/idemgo/idem/core/storetest"
)

// Example runs the gRPC interceptor's suite over a real listener on
// 127.0.0.1, here on the in-memory store.
func Example() {
	_ = func(t *testing.T) {
		idemgrpctest.Run(t, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
	}
}
