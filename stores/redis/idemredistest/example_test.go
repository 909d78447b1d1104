package idemredistest_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// Example runs the store conformance suite on the standalone Redis and on
// the local three-node Cluster; the checks that need a shared transaction
// are reported as not applicable.
func Example() {
	_ = func(t *testing.T) {
		t.Run("standalone", func(t *testing.T) { storetest.Run(t, idemredistest.NewBackend) })
		t.Run("cluster", func(t *testing.T) { storetest.Run(t, idemredistest.NewClusterBackend) })
	}
}
