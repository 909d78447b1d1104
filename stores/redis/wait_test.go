package idemredis_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
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
	if !errors.Is(err, idemredis.ErrNotReplicated) || !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("claim without a replica: %v; want ErrNotReplicated and idemstore.ErrTransient", err)
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

// TestWaitOnlyAfterAGrant: WAIT follows only a claim that granted the key.
// On the standalone server, which has no replica, WithWaitReplicas(1,
// 300ms) can never be satisfied: a replay, an in-progress conflict and a
// mismatch still answer at once, in one round trip and without WAIT, while
// a first claim waits the whole timeout, in two round trips, and fails as
// ErrNotReplicated, released. A takeover that WAIT fails is not released by
// the store: the record it took over may hold an outcome nobody knows, so
// the engine keeps it (Store.Keep) for Reconcile.
func TestWaitOnlyAfterAGrant(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClient(t)
	cnt := &counter{}
	c.AddHook(cnt)
	plain := idemredistest.NewEnv(t, c).Store
	const timeout = 300 * time.Millisecond
	// No Check: it refuses a server without the replicas asked for.
	waiting, err := idemredis.New(c, idemredis.WithPrefix(plain.Prefix()), idemredis.WithWaitReplicas(1, timeout))
	mustNil(t, err)

	done := claimReq("alice", "done-"+idemredistest.RandHex(4), "body", time.Hour)
	held := claimReq("alice", "held-"+idemredistest.RandHex(4), "body", time.Hour)
	for _, r := range []idemstore.ClaimRequest{done, held} {
		if res, err := plain.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim %s: %+v, %v", r.Key, res, err)
		}
	}
	_, tx, err := plain.BeginTx(ctx, leaseOf(done))
	mustNil(t, err)
	mustNil(t, tx.Settle(ctx, okOutcome(`{"id":"p1"}`)))

	for _, tc := range []struct {
		name string
		req  idemstore.ClaimRequest
		ok   func(idemstore.ClaimResult) bool
	}{
		{"replay", claimReq("alice", done.Key, "body", time.Hour), func(r idemstore.ClaimResult) bool { return r.Record.Response != nil }},
		{"in-progress conflict", claimReq("alice", held.Key, "body", time.Hour), func(r idemstore.ClaimResult) bool { return r.Record.Response == nil }},
		{"mismatch", claimReq("alice", held.Key, "another body", time.Hour), func(r idemstore.ClaimResult) bool { return true }},
	} {
		var (
			res idemstore.ClaimResult
			err error
		)
		start := time.Now()
		trips, cmds := cnt.measure(func() { res, err = waiting.Claim(ctx, tc.req) })
		took := time.Since(start)
		if err != nil || res.Claimed || !tc.ok(res) {
			t.Fatalf("%s: %+v, %v", tc.name, res, err)
		}
		if trips != 1 || slices.Contains(cmds, "wait") || took >= timeout/2 {
			t.Fatalf("%s: %d round trips %v in %v; want one, without WAIT, well under its timeout %v", tc.name, trips, cmds, took, timeout)
		}
		t.Logf("%-20s %v, %d round trip: %v", tc.name, took.Round(time.Microsecond), trips, cmds)
	}

	first := claimReq("alice", "first-"+idemredistest.RandHex(4), "body", time.Hour)
	start := time.Now()
	trips, cmds := cnt.measure(func() { _, err = waiting.Claim(ctx, first) })
	took := time.Since(start)
	if !errors.Is(err, idemredis.ErrNotReplicated) || !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("first claim without a replica: %v; want ErrNotReplicated and idemstore.ErrTransient", err)
	}
	if took < timeout || len(cmds) != 3 || cmds[0] != "evalsha" || cmds[1] != "wait" {
		t.Fatalf("first claim failed after %v with %v; want WAIT's whole timeout %v", took, cmds, timeout)
	}
	if rec, free := storetest.Free(t, plain, "alice", first.Key); !free {
		t.Fatalf("the unacknowledged first claim was not released: %+v", rec)
	}
	t.Logf("%-20s %v, %d round trips (the claim, WAIT, the release): %v: %v", "first claim", took.Round(time.Millisecond), trips, cmds, err)

	// A takeover of a kept record that WAIT fails stays in progress under
	// the taker's token, Uncertain, for the caller to keep.
	kept := claimReq("alice", "kept-"+idemredistest.RandHex(4), "body", time.Hour)
	if res, err := plain.Claim(ctx, kept); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	mustNil(t, plain.Keep(ctx, leaseOf(kept)))
	taker := claimReq("alice", kept.Key, "body", time.Hour)
	taker.TakeOverUncertain = true
	if _, err := waiting.Claim(ctx, taker); !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("takeover without a replica: %v, want ErrNotReplicated", err)
	}
	rec, err := plain.Get(ctx, "alice", kept.Key)
	if err != nil || rec.State != idemstore.StateInProgress || rec.LeaseToken != taker.Token || !rec.Uncertain {
		t.Fatalf("after the unacknowledged takeover: %+v, %v; want in progress under the taker's token, Uncertain", rec, err)
	}
	mustNil(t, plain.Keep(ctx, leaseOf(taker)))

	// Through the engine with Reconcile: the failed takeover is kept, and
	// Reconcile was never asked (the claim failed).
	// The store's Check refuses the missing replica at start-up; the
	// engine is made to run on it anyway.
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: waiting, SkipStoreCheck: true,
		Reconcile: func(context.Context, idem.Record) (*idem.Response, error) {
			t.Error("Reconcile asked after a claim that failed")
			return nil, nil
		}})
	mustNil(t, err)
	key := "engine-kept-" + idemredistest.RandHex(4)
	att, resp := eng.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "alice", Key: key})
	if att != nil || resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("first request without a replica: attempt %v, %+v; want 503", att != nil, resp)
	}
	// The released record keeps the request's fingerprint: claim it
	// through the plain store and keep it, as an attempt whose outcome is
	// unknown leaves it, then retry the request through the engine.
	released, err := plain.Get(ctx, "alice", key)
	if err != nil || released.State != idemstore.StateReleased {
		t.Fatalf("after the engine's failed first claim: %+v, %v; want released", released, err)
	}
	res, err := plain.Claim(ctx, idemstore.ClaimRequest{Principal: "alice", Key: key, Fingerprint: released.Fingerprint,
		Token: idemredistest.RandHex(16), Lease: time.Hour, Retention: time.Hour})
	if err != nil || !res.Claimed {
		t.Fatalf("claim through the plain store: %+v, %v", res, err)
	}
	mustNil(t, plain.Keep(ctx, idemstore.Lease{Principal: "alice", Key: key, Token: res.Record.LeaseToken}))
	att, resp = eng.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "alice", Key: key})
	if att != nil || resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("retry of a kept record without a replica: attempt %v, %+v; want 503", att != nil, resp)
	}
	if rec, err := plain.Get(ctx, "alice", key); err != nil || rec.State != idemstore.StateInProgress || !rec.Uncertain ||
		rec.LeaseToken == res.Record.LeaseToken {
		t.Fatalf("after the engine's failed takeover: %+v, %v; want it taken over and kept, Uncertain, in progress", rec, err)
	}
}
