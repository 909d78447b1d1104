package idemredis_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// primaryWithReplica starts a primary and a replica of its own and waits
// until the replica is in sync.
func primaryWithReplica(t testing.TB) (primary, replica *server) {
	t.Helper()
	primary = startServer(t)
	replica = startServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	c := replica.client(t, nil)
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			return primary, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica on %s never synced with %s: %s", replica.addr(), primary.addr(), info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWaitReplicas: with WithWaitReplicas(1, …) the claim is on the replica
// by the time Claim returns, every time; without it the replica sometimes
// has not received it yet, which is the window a failover loses a claim
// in. With the replica gone the claim fails as transient
// (ErrNotReplicated) and is released, and Check refuses a primary with too
// few replicas.
func TestWaitReplicas(t *testing.T) {
	ctx := testCtx(t)
	primary, replica := primaryWithReplica(t)
	pc, rc := primary.client(t, nil), replica.client(t, nil)
	const n = 300
	missed := map[bool]int{}
	for _, wait := range []bool{false, true} {
		var opts []idemredis.Option
		if wait {
			opts = append(opts, idemredis.WithWaitReplicas(1, 500*time.Millisecond))
		}
		env := idemredistest.NewEnv(t, pc, opts...)
		for i := range n {
			req := claimReq("alice", "w-"+strconv.Itoa(i), "body", time.Hour)
			res, err := env.Store.Claim(ctx, req)
			if err != nil || !res.Claimed {
				t.Fatalf("claim (wait %v): %+v, %v", wait, res, err)
			}
			tok, err := rc.HGet(ctx, env.Store.RecordKey("alice", req.Key), "t").Result()
			if errors.Is(err, redis.Nil) || tok != req.Token {
				missed[wait]++
			} else if err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d claims each, read from the replica the moment Claim returned: missing there %d times without WAIT, %d with WithWaitReplicas(1)",
		n, missed[false], missed[true])
	if missed[true] != 0 {
		t.Fatalf("with WithWaitReplicas(1) the replica lacked %d of %d acknowledged claims", missed[true], n)
	}

	// The replica goes away: WAIT times out, the claim is released.
	env := idemredistest.NewEnv(t, pc, idemredis.WithWaitReplicas(1, 100*time.Millisecond))
	replica.kill()
	waitFor(t, func() bool {
		info, _ := pc.Info(ctx, "replication").Result()
		return strings.Contains(info, "connected_slaves:0")
	})
	req := claimReq("alice", "alone-"+idemredistest.RandHex(4), "body", time.Hour)
	start := time.Now()
	_, err := env.Store.Claim(ctx, req)
	if !errors.Is(err, idemredis.ErrNotReplicated) || !errors.Is(err, idem.ErrTransient) {
		t.Fatalf("claim without a replica: %v; want ErrNotReplicated and idem.ErrTransient", err)
	}
	if rec, free := storetest.Free(t, env.Store, "alice", req.Key); !free {
		t.Fatalf("the unacknowledged claim was not released: %+v", rec)
	}
	t.Logf("without a replica the claim failed after %v (timeout 100ms) and was released: %v", time.Since(start).Round(time.Millisecond), err)
	if err := env.Store.Check(ctx); !errors.Is(err, idem.ErrMisconfigured) {
		t.Fatalf("Check with WithWaitReplicas(1) and no replica: %v, want idem.ErrMisconfigured", err)
	}
}

// TestWaitReplicasCluster: on a Cluster the claim and its WAIT go in one
// pipeline to the primary that owns the record's slot (no MOVED). The
// local Cluster has no replicas, so WAIT 1 times out, and the claim is
// released.
func TestWaitReplicasCluster(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClusterClient(t)
	s, err := idemredis.New(c, idemredis.WithPrefix("idemt:"+idemredistest.RandHex(6)+":"), idemredis.WithWaitReplicas(1, 50*time.Millisecond))
	mustNil(t, err)
	t.Cleanup(func() { idemredistest.DeletePrefix(t, c, s.Prefix()) })
	if err := s.Check(ctx); !errors.Is(err, idem.ErrMisconfigured) {
		t.Fatalf("Check on a Cluster without replicas: %v, want idem.ErrMisconfigured", err)
	}
	for i := range 12 {
		req := claimReq("alice", "cw-"+strconv.Itoa(i)+idemredistest.RandHex(3), "body", time.Hour)
		_, err := s.Claim(ctx, req)
		if !errors.Is(err, idemredis.ErrNotReplicated) {
			t.Fatalf("claim %d: %v, want ErrNotReplicated (and not a redirect)", i, err)
		}
		if rec, free := storetest.Free(t, s, "alice", req.Key); !free {
			t.Fatalf("claim %d not released: %+v", i, rec)
		}
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWaitCost measures what WithWaitReplicas(1) adds to a claim on a
// primary with one replica (this test's own servers, on this machine):
// claims with and without WAIT alternate, so both see the same load, and
// the test logs their latency percentiles for BENCHMARKS.md. It asserts
// nothing about them: on a shared two-core machine they are figures, not
// a property.
func TestWaitCost(t *testing.T) {
	ctx := testCtx(t)
	primary, _ := primaryWithReplica(t)
	c := primary.client(t, nil)
	plain := idemredistest.NewEnv(t, c).Store
	waiting := idemredistest.NewEnv(t, c, idemredis.WithWaitReplicas(1, 500*time.Millisecond)).Store
	const n = 1000
	lat := map[bool][]time.Duration{}
	for i := range 2 * n {
		wait := i%2 == 1
		s := plain
		if wait {
			s = waiting
		}
		start := time.Now()
		if _, err := s.Claim(ctx, claimReq("alice", "cost-"+strconv.Itoa(i), "body", time.Hour)); err != nil {
			t.Fatal(err)
		}
		lat[wait] = append(lat[wait], time.Since(start))
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[int(p*float64(len(s)-1))].Round(time.Microsecond)
	}
	for _, wait := range []bool{false, true} {
		d := lat[wait]
		t.Logf("claim, WAIT %v: p50 %v  p90 %v  p99 %v  (n=%d, alternating)", wait, pct(d, .5), pct(d, .9), pct(d, .99), len(d))
	}
	t.Logf("WAIT 1 adds %v at the median", pct(lat[true], .5)-pct(lat[false], .5))
}
