package idemredis_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestConformance runs core/storetest on the standalone Redis. The tests
// that need a transaction shared with the handler are reported as skipped
// with the reason (the Backend declares NoSharedTx). Not parallel: the suite
// measures 400 ms leases with sleeps.
func TestConformance(t *testing.T) {
	storetest.Run(t, idemredistest.NewBackend)
}

// TestConformanceCluster runs core/storetest on the three-node Cluster:
// every script's keys must hash to one slot, and ListStale must find the
// in-progress records on every primary.
func TestConformanceCluster(t *testing.T) {
	storetest.Run(t, idemredistest.NewClusterBackend)
}
