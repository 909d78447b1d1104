package idempgxtest_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// Example runs the store conformance suite on a fresh schema of the
// PostgreSQL that IDEM_PG_DSN names; an unreachable server fails the test.
func Example() {
	_ = func(t *testing.T) { storetest.Run(t, idempgxtest.NewBackend) }
}
