package idemredis_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// BenchmarkStore measures the store's calls one at a time on the
// standalone Redis: a claim of a fresh key, a replay, and a first request
// through the engine (claim and settle: two round trips).
func BenchmarkStore(b *testing.B) {
	benchStore(b, newEnv(b).Store)
}

// BenchmarkStoreCluster is BenchmarkStore on the three-node Cluster.
func BenchmarkStoreCluster(b *testing.B) {
	benchStore(b, idemredistest.NewEnv(b, idemredistest.NewClusterClient(b)).Store)
}

func benchStore(b *testing.B, s *idemredis.Store) {
	ctx := context.Background()
	b.Run("Claim", func(b *testing.B) {
		for i := range b.N {
			if _, err := s.Claim(ctx, claimReq("alice", "bc-"+strconv.Itoa(i), "body", time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		req := claimReq("alice", "br-"+idemredistest.RandHex(4), "body", time.Hour)
		_, err := s.Claim(ctx, req)
		mustNil(b, err)
		_, tx, _ := s.BeginTx(ctx, leaseOf(req))
		mustNil(b, tx.Settle(ctx, okOutcome(`{"id":"pay_1","amount":100,"currency":"EUR","status":"succeeded"}`)))
		b.ResetTimer()
		for range b.N {
			res, err := s.Claim(ctx, claimReq("alice", req.Key, "body", time.Hour))
			if err != nil || res.Claimed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("ListStale", func(b *testing.B) {
		// One sweep's report: every shard's index in one pipeline, with
		// 100 stale claims spread over the shards.
		for i := range 100 {
			_, err := s.Claim(ctx, claimReq("stale", "bs-"+strconv.Itoa(i), "body", time.Millisecond))
			mustNil(b, err)
		}
		time.Sleep(5 * time.Millisecond)
		b.ResetTimer()
		for range b.N {
			recs, err := s.ListStale(ctx, 500)
			if err != nil || len(recs) < 100 {
				b.Fatal(len(recs), err)
			}
		}
	})
	b.Run("FirstRequest", func(b *testing.B) {
		eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: s})
		mustNil(b, err)
		for i := range b.N {
			key := "bf-" + strconv.Itoa(i)
			if r := run(eng, "alice", key, func(ctx context.Context) (int, []byte) {
				idemredis.Tx(ctx)
				return http.StatusCreated, []byte(`{"id":"pay"}`)
			}); r.Status != http.StatusCreated {
				b.Fatal(r.Status)
			}
		}
	})
}

// BenchmarkClaimWait is the cost of WithWaitReplicas: claims of fresh keys
// on a primary with one replica (both this benchmark's own servers), without
// WAIT and with WAIT 1.
func BenchmarkClaimWait(b *testing.B) {
	primary, _ := primaryWithReplica(b)
	c := primary.client(b, nil)
	for _, tc := range []struct {
		name string
		opts []idemredis.Option
	}{
		{"NoWait", nil},
		{"Wait1", []idemredis.Option{idemredis.WithWaitReplicas(1, 500*time.Millisecond)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := idemredistest.NewEnv(b, c, tc.opts...).Store
			ctx := context.Background()
			for i := range b.N {
				if _, err := s.Claim(ctx, claimReq("alice", "bw-"+strconv.Itoa(i), "body", time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
