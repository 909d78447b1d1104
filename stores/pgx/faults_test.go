package idempgx_test

import (
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/core/storetest/faultproxy"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestFaults runs core/storetest.RunFaults: the store's connections are cut
// during the claim, after the business write, before the settle's COMMIT
// reaches the server and after it did (the ambiguous case). The settle's
// UPDATE and COMMIT travel in one write, so "COMMIT not received" means the
// fenced UPDATE was not received either. A claim, a takeover or a release
// whose connection broke runs again on another connection and recognises
// its own token, and a BEGIN whose connection broke begins on another.
func TestFaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 4, nil))
	storetest.RunFaults(t, storetest.FaultTarget{
		Addr: serverAddr(e.Pool),
		Connect: func(t testing.TB, proxyAddr string) storetest.Backend {
			through := &env{&idempgxtest.Env{Pool: proxiedPool(t, proxyAddr, 4), Schema: e.Schema}}
			through.Store = through.storeOn(t, through.Pool, e.Schema+".idempotency_keys")
			b := through.Backend()
			b.CountEffects = e.CountEffects // counted directly, not through the proxy
			return b
		},
		Claim:    []byte("ON CONFLICT (principal, key) DO NOTHING"),
		Commit:   []byte("COMMIT"),
		Effect:   []byte("INSERT INTO " + e.EffectsTable()),
		Takeover: []byte("SET lease_token = $4, request_id = $5, locked_at = now()"),
		Release:  []byte("UPDATE " + e.Store.Table() + " SET state = 'released'"),
		Begin:    []byte("begin isolation level read committed"),
	})
}

// serverAddr is the "host:port" pool connects to.
func serverAddr(pool *pgxpool.Pool) string {
	cfg := pool.Config().ConnConfig
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// proxiedPool is a pool of at most maxConns connections to the test
// database through the proxy at proxyAddr, with the statement text on the
// wire with every execution, so the proxy's patterns see it.
func proxiedPool(t testing.TB, proxyAddr string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(dsn())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxyAddr
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestBeginOnAFullPool: when the connection of a pool's only slot breaks
// as BEGIN goes out with the handler's first statement, the handle gives
// the broken connection back before it asks for another, so the
// transaction begins on a new connection in the same slot.
func TestBeginOnAFullPool(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 1, nil))
	proxy, err := faultproxy.New(serverAddr(e.Pool))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	through := &env{&idempgxtest.Env{Pool: proxiedPool(t, proxy.Addr(), 1), Schema: e.Schema}}
	through.Store = through.storeOn(t, through.Pool, e.Schema+".idempotency_keys")

	req := claimReq("alice", "full-"+randHex(4), "body", time.Minute)
	if res, err := through.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	var runErr error
	if !proxy.CutWhile([]byte("begin isolation level read committed"), faultproxy.Before, time.Second, func() {
		runErr = through.runAttempt(ctx, leaseOf(req), req.Key, `{}`)
	}) {
		t.Fatal("the cut on BEGIN never fired")
	}
	if runErr != nil {
		t.Fatalf("an attempt whose BEGIN lost the pool's only connection: %v", runErr)
	}
	if n := e.mustCount(t, req.Key); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}
