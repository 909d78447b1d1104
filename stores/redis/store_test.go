package idemredis_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

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

// TestDownstreamKeyOnAFullPool: as many handlers as the client's pool has
// connections ask for their downstream keys at once, and each gets it. The
// store's Tx is no idemstore.Syncer and its handlers hold no connection (BeginTx
// takes none; the key needs no round trip, the store keeping no nonce), so
// DownstreamKey cannot wait for the pool.
func TestDownstreamKeyOnAFullPool(t *testing.T) {
	const poolSize = 4
	c := redis.NewClient(&redis.Options{Addr: idemredistest.Addr(), PoolSize: poolSize})
	t.Cleanup(func() { _ = c.Close() })
	storetest.DownstreamKeyOnAFullPool(t, idemredistest.NewEnv(t, c).Store, poolSize)
}
