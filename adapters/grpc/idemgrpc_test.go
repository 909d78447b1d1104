package idemgrpc_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/grpc/idemgrpctest"
	"github.com/idemgo/idem/core/storetest"
)

// TestSuite runs the gRPC suite on memstore; conformance runs it on every
// real store.
func TestSuite(t *testing.T) {
	idemgrpctest.Run(t, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
