package idemredis_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestRoundTrips counts, with a go-redis hook, what each store call sends:
// claim 1, settle 1, replay 1, takeover 1, keep 1, release 1, BeginTx 0, each one
// EVALSHA of a cached script; and a request through the engine costs the
// claim and the settle, a replay the claim alone.
func TestRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClient(t)
	cnt := &counter{}
	c.AddHook(cnt)
	env := idemredistest.NewEnv(t, c)
	s := env.Store

	req := claimReq("alice", "rt-"+idemredistest.RandHex(4), "body", 200*time.Millisecond)
	var txCtx context.Context
	var tx idemstore.Tx
	cases := []struct {
		name string
		fn   func() error
		want int
	}{
		{"claim", func() error {
			res, err := s.Claim(ctx, req)
			if err == nil && !res.Claimed {
				err = errors.New("not claimed")
			}
			return err
		}, 1},
		{"begin", func() (err error) { txCtx, tx, err = s.BeginTx(ctx, leaseOf(req)); return err }, 0},
		{"in-progress conflict", func() error {
			res, err := s.Claim(ctx, claimReq("alice", req.Key, "body", time.Hour))
			if err == nil && res.Claimed {
				err = errors.New("claimed a held key")
			}
			return err
		}, 1},
		{"check lease", func() error { h, _ := idemredis.Tx(txCtx); return h.CheckLease(ctx) }, 1},
		{"settle", func() error { return tx.Settle(ctx, okOutcome(`{"id":"p1"}`)) }, 1},
		{"replay", func() error {
			res, err := s.Claim(ctx, claimReq("alice", req.Key, "body", time.Hour))
			if err == nil && (res.Claimed || res.Record.Response == nil) {
				err = errors.New("not a replay")
			}
			return err
		}, 1},
		{"get", func() error { _, err := s.Get(ctx, "alice", req.Key); return err }, 1},
	}
	for _, tc := range cases {
		var err error
		trips, cmds := cnt.measure(func() { err = tc.fn() })
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if trips != tc.want {
			t.Fatalf("%s: %d round trips %v, want %d", tc.name, trips, cmds, tc.want)
		}
		if slices.Contains(cmds, "eval") {
			t.Fatalf("%s sent the script's source (EVAL) although Check loaded it: %v", tc.name, cmds)
		}
		t.Logf("%-20s %d round trip(s): %v", tc.name, trips, cmds)
	}

	stale := claimReq("alice", "rt-stale-"+idemredistest.RandHex(4), "body", time.Millisecond)
	if _, err := s.Claim(ctx, stale); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	taker := claimReq("alice", stale.Key, "body", time.Millisecond)
	trips, cmds := cnt.measure(func() {
		res, err := s.Claim(ctx, taker)
		if err != nil || !res.Reclaimed {
			t.Fatalf("takeover: %+v, %v", res, err)
		}
	})
	if trips != 1 {
		t.Fatalf("takeover: %d round trips %v, want 1", trips, cmds)
	}
	trips, cmds = cnt.measure(func() { mustNil(t, s.Keep(ctx, leaseOf(taker))) })
	if trips != 1 {
		t.Fatalf("keep: %d round trips %v, want 1", trips, cmds)
	}
	trips, cmds = cnt.measure(func() { mustNil(t, s.Release(ctx, leaseOf(taker))) })
	if trips != 1 {
		t.Fatalf("release: %d round trips %v, want 1", trips, cmds)
	}

	// Through the engine: a first request is the claim and the settle, a
	// replay the claim.
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: s})
	mustNil(t, err)
	db := newPaymentsDB()
	key := "rt-engine-" + idemredistest.RandHex(4)
	for i, want := range []int{2, 1} {
		var resp *idem.Response
		trips, cmds := cnt.measure(func() { resp = run(eng, "alice", key, paymentHandler(db, key)) })
		if resp.Status != 201 || trips != want {
			t.Fatalf("engine request %d: %d, %d round trips %v; want 201 in %d", i, resp.Status, trips, cmds, want)
		}
	}
}

// TestReplayWritesNothing counts the server's writes (rdb_changes_since_last_save
// on a server of this test's own, so nobody else's writes count): replays
// and claims of a key someone holds write nothing; a claim and a settle do.
func TestReplayWritesNothing(t *testing.T) {
	ctx := testCtx(t)
	srv := startServer(t)
	c := srv.client(t, nil)
	env := idemredistest.NewEnv(t, c)
	s := env.Store

	held := claimReq("alice", "held", "body", time.Hour)
	done := claimReq("alice", "done", "body", time.Hour)
	before := dirty(t, c)
	for _, r := range []idemstore.ClaimRequest{held, done} {
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v, %v", res, err)
		}
	}
	_, tx, err := s.BeginTx(ctx, leaseOf(done))
	mustNil(t, err)
	mustNil(t, tx.Settle(ctx, okOutcome(`{"id":"p1"}`)))
	if d := dirty(t, c) - before; d == 0 {
		t.Fatal("claims and a settle counted no write: the counter does not measure writes")
	}

	before = dirty(t, c)
	const n = 200
	for i := range n {
		key := done.Key
		if i%2 == 1 {
			key = held.Key
		}
		res, err := s.Claim(ctx, claimReq("alice", key, "body", time.Hour))
		if err != nil || res.Claimed {
			t.Fatalf("claim %d of an existing key: %+v, %v", i, res, err)
		}
		if i%2 == 0 && (res.Record.Response == nil || string(res.Record.Response.Body) != `{"id":"p1"}`) {
			t.Fatalf("replay %d: %+v", i, res.Record)
		}
		if _, err := s.Get(ctx, "alice", key); err != nil {
			t.Fatal(err)
		}
	}
	// A mismatching fingerprint is refused without a write too.
	if res, err := s.Claim(ctx, claimReq("alice", held.Key, "other body", time.Nanosecond)); err != nil || res.Claimed {
		t.Fatalf("claim with another fingerprint: %+v, %v", res, err)
	}
	if _, err := s.ListStale(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if d := dirty(t, c) - before; d != 0 {
		t.Fatalf("%d replays and conflicts wrote %d times, want 0", n, d)
	}
	t.Logf("%d replays and in-progress conflicts, one mismatch, one ListStale: 0 writes on the server", n)
}

// TestServerClock: no argument the store sends carries the application's
// clock (every time is the server's TIME, read inside the scripts), and the
// claim's Now is the server's time.
func TestServerClock(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClient(t)
	cnt := &counter{}
	c.AddHook(cnt)
	s := idemredistest.NewEnv(t, c).Store

	var serverNow time.Time
	cnt.measure(func() {
		req := claimReq("alice", "clock-"+idemredistest.RandHex(4), "body", time.Millisecond)
		res, err := s.Claim(ctx, req)
		mustNil(t, err)
		tm, err := c.Time(ctx).Result()
		mustNil(t, err)
		serverNow = tm
		if d := serverNow.Sub(res.Now); d < 0 || d > time.Second {
			t.Fatalf("claim's Now %v is not the server's clock %v", res.Now, serverNow)
		}
		time.Sleep(2 * time.Millisecond)
		taker := claimReq("alice", req.Key, "body", time.Millisecond)
		if res, err := s.Claim(ctx, taker); err != nil || !res.Reclaimed {
			t.Fatalf("takeover: %+v, %v", res, err)
		}
		_, tx, _ := s.BeginTx(ctx, leaseOf(taker))
		mustNil(t, tx.Settle(ctx, okOutcome("{}")))
		other := claimReq("alice", "clock2-"+idemredistest.RandHex(4), "body", time.Millisecond)
		_, err = s.Claim(ctx, other)
		mustNil(t, err)
		mustNil(t, s.Release(ctx, leaseOf(other)))
		_, err = s.ListStale(ctx, 10)
		mustNil(t, err)
	})
	now := time.Now()
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for i, args := range cnt.args {
		if cnt.commands[i] == "time" {
			continue // the test's own
		}
		for _, a := range args {
			var n float64
			switch v := a.(type) {
			case int64:
				n = float64(v)
			case int:
				n = float64(v)
			case string:
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					continue
				}
				n = f
			default:
				continue
			}
			for _, unit := range []time.Duration{time.Second, time.Millisecond, time.Microsecond, time.Nanosecond} {
				at := time.Unix(0, 0).Add(time.Duration(n * float64(unit)))
				if n > 0 && !math.IsInf(n, 0) && math.Abs(now.Sub(at).Hours()) < 24 {
					t.Fatalf("%s sent %v, which reads as the application's clock (%v): times must come from the server", cnt.commands[i], a, at)
				}
			}
		}
	}
	t.Logf("%d commands, no argument within a day of the application's clock", len(cnt.args))
}

// TestNewValidates: the constructor refuses what cannot work, naming it.
func TestNewValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: idemredistest.Addr(), ReadTimeout: time.Second})
	defer c.Close()
	if _, err := idemredis.New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
	for _, o := range []idemredis.Option{
		idemredis.WithPrefix("a{b"), idemredis.WithPrefix("}"), idemredis.WithPrefix(string(make([]byte, 65))),
		idemredis.WithWaitReplicas(-1, time.Second), idemredis.WithWaitReplicas(1, 0),
		idemredis.WithWaitReplicas(1, time.Second), // not shorter than ReadTimeout
	} {
		if _, err := idemredis.New(c, o); err == nil {
			t.Errorf("New accepted an invalid option")
		}
	}
	for _, o := range []idemredis.Option{idemredis.WithPrefix(""), idemredis.WithPrefix("billing:idem:"), idemredis.WithWaitReplicas(1, 500*time.Millisecond)} {
		if _, err := idemredis.New(c, o); err != nil {
			t.Errorf("New: %v", err)
		}
	}
	s, err := idemredis.New(c)
	mustNil(t, err)
	if s.Prefix() != idemredis.DefaultPrefix {
		t.Errorf("default prefix %q", s.Prefix())
	}
}
