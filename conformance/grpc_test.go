package conformance_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/grpc/idemgrpctest"
)

// TestGRPCSuite runs the gRPC interceptor's suite (idemgrpctest) on every
// store.
func TestGRPCSuite(t *testing.T) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) { idemgrpctest.Run(t, s.newBackend) })
	}
}
