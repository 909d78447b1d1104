package idemredis_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestConformance runs core/storetest on the standalone Redis. The tests
// that need a transaction shared with the handler are reported as skipped
// with the reason (the Backend declares NoSharedTx). Each store call is one
// EVALSHA of a cached script, BeginTx none; the handlers hold no pool
// connection, so only DownstreamKey's pool case applies. Not parallel: the
// suite measures 400 ms leases with sleeps.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Backend {
		b := idemredistest.NewBackend(t)
		b.Pool = func(t testing.TB, size int) idemstore.Store {
			c := redis.NewClient(&redis.Options{Addr: idemredistest.Addr(), PoolSize: size})
			t.Cleanup(func() { _ = c.Close() })
			return idemredistest.NewEnv(t, c).Store
		}
		b.CountTrips = func(t testing.TB) (storetest.Backend, func() int64) {
			c, cnt := idemredistest.NewClient(t), &counter{}
			cnt.recording.Store(true)
			c.AddHook(cnt)
			return idemredistest.NewEnv(t, c).Backend(), cnt.total
		}
		b.CountWrites = func(t testing.TB) (storetest.Backend, func() int64) {
			c := startServer(t).client(t, nil)
			return idemredistest.NewEnv(t, c).Backend(), func() int64 { return dirty(t, c) }
		}
		b.Trips = storetest.Trips{Claim: 1, Settle: 1, Replay: 1, Conflict: 1, Takeover: 1, Release: 1, Keep: 1, Get: 1}
		return b
	})
}

// TestConformanceCluster runs core/storetest on the three-node Cluster:
// every script's keys must hash to one slot, and ListStale must find the
// in-progress records on every primary.
func TestConformanceCluster(t *testing.T) {
	storetest.Run(t, idemredistest.NewClusterBackend)
}
