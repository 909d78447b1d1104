package idemredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/core/storetest/faultproxy"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestFaults runs core/storetest.RunFaults against the standalone Redis
// through the fault proxy: the connection is cut during the claim, after
// the business write, before the settle reaches the server and after it
// did (the ambiguous case). The scripts go out as EVALSHA, so the patterns
// are their digests. The business write is the recommended one, keyed by
// idem.DownstreamKey (here SADD of the downstream key, through the proxy
// too, so the cut after it is seen on the wire); go-redis sends a command
// whose connection broke again, and every script recognises its own token,
// so a resent claim or settle answers as the first run did. The second run
// turns go-redis's retries off (MaxRetries -1): every cut then reaches the
// engine as a transient error, and the retries of the client above it and
// the fenced scripts recover instead.
func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxRetries int
	}{{"ClientRetries", 0}, {"NoClientRetries", -1}} {
		t.Run(tc.name, func(t *testing.T) { testFaults(t, tc.maxRetries) })
	}
}

func testFaults(t *testing.T, maxRetries int) {
	direct := idemredistest.NewClient(t)
	env := idemredistest.NewEnv(t, direct)
	effectsKey := func(id string) string { return env.Store.Prefix() + "fx-effects:" + id }
	var takeover, release []byte // the resent scripts: go-redis sends them again
	if maxRetries >= 0 {
		takeover, release = []byte(idemredis.ClaimSHA), []byte(idemredis.ReleaseSHA)
	}
	storetest.RunFaults(t, storetest.FaultTarget{
		Addr: idemredistest.Addr(),
		Connect: func(t testing.TB, proxyAddr string) storetest.Backend {
			c := redis.NewClient(&redis.Options{Addr: proxyAddr, PoolSize: 4, MaxRetries: maxRetries})
			t.Cleanup(func() { _ = c.Close() })
			s, err := idemredis.New(c, idemredis.WithPrefix(env.Store.Prefix()))
			if err != nil {
				t.Fatal(err)
			}
			return storetest.Backend{
				Store: s,
				WriteEffect: func(ctx context.Context, id string) error {
					if _, ok := idemredis.Tx(ctx); !ok {
						return errors.New("no idemredis handle in context")
					}
					dk, err := idem.DownstreamKey(ctx, "effect")
					if err != nil {
						return err
					}
					return c.SAdd(ctx, effectsKey(id), dk).Err()
				},
				CountEffects: func(ctx context.Context, id string) (int, error) {
					n, err := direct.SCard(ctx, effectsKey(id)).Result()
					return int(n), err
				},
				NoSharedTx: true, SelfExpiring: true, NoNonce: true,
			}
		},
		Claim:    []byte(idemredis.ClaimSHA),
		Commit:   []byte(idemredis.SettleSHA),
		Effect:   []byte("fx-effects:"),
		Takeover: takeover,
		Release:  release,
	})
}

// TestCutConnectionIsResent cuts the connection under the settle script,
// before the server got it and after it ran it (the answer lost). go-redis
// sends it again on a new connection, and the script answers as the first
// run did: the settle is stored once. (The claim, takeover and release
// scripts are RunFaults' Resent case.) With the client's retries turned off
// the cut is an error wrapping idemstore.ErrTransient.
func TestCutConnectionIsResent(t *testing.T) {
	ctx := testCtx(t)
	direct := idemredistest.NewClient(t)
	env := idemredistest.NewEnv(t, direct)
	proxy, err := faultproxy.New(idemredistest.Addr())
	mustNil(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := idemredis.New(c, idemredis.WithPrefix(env.Store.Prefix()))
	mustNil(t, err)

	cut := func(pattern string, when faultproxy.When, fn func()) {
		t.Helper()
		if !proxy.CutWhile([]byte(pattern), when, time.Second, fn) {
			t.Fatalf("the cut on %s never fired", pattern)
		}
	}
	for _, when := range []faultproxy.When{faultproxy.Before, faultproxy.After} {
		req := claimReq("alice", "cut-"+idemredistest.RandHex(4), "body", time.Hour)
		_, err := s.Claim(ctx, req)
		mustNil(t, err)
		_, tx, err := s.BeginTx(ctx, leaseOf(req))
		mustNil(t, err)
		cut(idemredis.SettleSHA, when, func() { err = tx.Settle(ctx, okOutcome(`{"id":"x"}`)) })
		if err != nil {
			t.Fatalf("settle cut %v: %v", when, err)
		}
		if rec, err := env.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateCompleted {
			t.Fatalf("after the settle cut %v: %+v, %v", when, rec, err)
		}
	}

	// No client retries: the cut is the caller's, as a transient error.
	noRetry := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = noRetry.Close() })
	s2, err := idemredis.New(noRetry, idemredis.WithPrefix(env.Store.Prefix()))
	mustNil(t, err)
	var cerr error
	cut(idemredis.ClaimSHA, faultproxy.After, func() {
		_, cerr = s2.Claim(ctx, claimReq("alice", "noretry-"+idemredistest.RandHex(4), "body", time.Hour))
	})
	if !errors.Is(cerr, idemstore.ErrTransient) {
		t.Fatalf("claim cut without client retries: %v, want an error wrapping idemstore.ErrTransient", cerr)
	}
	t.Logf("%d cuts; every resent script answered as its first run", proxy.Cuts())
}
