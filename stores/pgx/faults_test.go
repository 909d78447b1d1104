package idempgx_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/core/storetest/faultproxy"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestFaults runs core/storetest.RunFaults: the store's connections are cut
// during the claim, after the business write, before the settle's COMMIT
// reaches the server and after it did (the ambiguous case). The settle's
// UPDATE and COMMIT travel in one write, so "COMMIT not received" means the
// fenced UPDATE was not received either.
func TestFaults(t *testing.T) {
	t.Parallel()
	direct := newPool(t, 4, nil)
	cfg := direct.Config()
	addr := cfg.ConnConfig.Host + ":" + itoa(int(cfg.ConnConfig.Port))
	e := newEnv(t, direct)
	storetest.RunFaults(t, storetest.FaultTarget{
		Addr: addr,
		Connect: func(t testing.TB, proxyAddr string) storetest.Backend {
			u, err := url.Parse(dsn())
			if err != nil {
				t.Fatal(err)
			}
			u.Host = proxyAddr
			pcfg, err := pgxpool.ParseConfig(u.String())
			if err != nil {
				t.Fatal(err)
			}
			// Statement text on the wire with every execution.
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			pcfg.MaxConns = 4
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".idempotency_keys"))
			if err != nil {
				t.Fatal(err)
			}
			through := &env{&idempgxtest.Env{Pool: pool, Schema: e.Schema, Store: s}}
			b := through.Backend()
			b.CountEffects = e.CountEffects // counted directly, not through the proxy
			return b
		},
		Claim:  []byte("ON CONFLICT (principal, key) DO NOTHING"),
		Commit: []byte("COMMIT"),
		Effect: []byte("INSERT INTO " + e.EffectsTable()),
	})
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestBrokenConnectionIsRetried: the connection breaks under the claim
// statement, before the server got it or after (the server claimed the key
// and the answer was lost), and under a stale takeover. Claim runs again on
// another connection and recognises its own token: the caller holds the key
// instead of being locked out of it by its own orphaned claim until the
// lease expires. A release is sent again the same way, and so is BEGIN. A
// connection that breaks under a handler's statement fails the request
// instead, leaving no effect and, after the release, no row.
func TestBrokenConnectionIsRetried(t *testing.T) {
	t.Parallel()
	direct := newPool(t, 4, nil)
	cfg := direct.Config()
	e := newEnv(t, direct)
	proxy, err := faultproxy.New(cfg.ConnConfig.Host + ":" + itoa(int(cfg.ConnConfig.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u, err := url.Parse(dsn())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.Addr()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".idempotency_keys"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		pattern string
		when    faultproxy.When
		stale   bool
	}{
		{"claim not received", "ON CONFLICT (principal, key) DO NOTHING", faultproxy.Before, false},
		{"claim executed, answer lost", "ON CONFLICT (principal, key) DO NOTHING", faultproxy.After, false},
		{"takeover not received", "SET lease_token = $4, request_id = $5, locked_at = now()", faultproxy.Before, true},
		{"takeover executed, answer lost", "SET lease_token = $4, request_id = $5, locked_at = now()", faultproxy.After, true},
	}
	for _, c := range cases {
		for range 5 {
			key := "cut-" + randHex(4)
			if c.stale {
				// An earlier holder whose lease ends at once.
				if _, err := e.Store.Claim(ctx, claimReq("alice", key, "body", time.Microsecond)); err != nil {
					t.Fatal(err)
				}
			}
			req := claimReq("alice", key, "body", time.Minute)
			fired := proxy.CutOn([]byte(c.pattern), c.when)
			res, err := s.Claim(ctx, req)
			select {
			case <-fired:
			case <-time.After(time.Second):
				proxy.Disarm()
				t.Fatalf("%s: the cut never fired", c.name)
			}
			if err != nil || !res.Claimed || res.Record.LeaseToken != req.Token || res.Reclaimed != c.stale {
				t.Fatalf("%s: claim = %+v, %v; want Claimed with our token, Reclaimed=%v", c.name, res, err, c.stale)
			}
			rec, err := e.Store.Get(ctx, "alice", key)
			if err != nil || rec.LeaseToken != req.Token || rec.State != idemstore.StateInProgress {
				t.Fatalf("%s: stored %+v, %v", c.name, rec, err)
			}
		}
	}
	if proxy.Cuts() < int64(len(cases)*5) {
		t.Fatalf("only %d cuts", proxy.Cuts())
	}

	cut := func(pattern string, when faultproxy.When, fn func()) {
		t.Helper()
		if !proxy.CutWhile([]byte(pattern), when, time.Second, fn) {
			t.Fatalf("the cut on %q never fired", pattern)
		}
	}
	// Release: not received → released on the second connection; executed
	// with the answer lost → the second finds it released already:
	// ErrLeaseLost, and the row is released either way.
	releaseSQL := "UPDATE " + s.Table() + " SET state = 'released'"
	for _, when := range []faultproxy.When{faultproxy.Before, faultproxy.After} {
		req := claimReq("alice", "rel-"+randHex(4), "body", time.Minute)
		if _, err := s.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
		var err error
		cut(releaseSQL, when, func() { err = s.Release(ctx, leaseOf(req)) })
		if when == faultproxy.Before && err != nil || when == faultproxy.After && !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("release with the cut %v: %v", when, err)
		}
		if rec, err := e.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateReleased {
			t.Fatalf("row after release with the cut %v: %s, %v", when, rec.State, err)
		}
	}
	// BEGIN: a connection found broken when BEGIN goes out is replaced,
	// and the transaction begins on another one; the request then runs
	// and settles as usual, with one effect.
	req := claimReq("alice", "begin-"+randHex(4), "body", time.Minute)
	if _, err := s.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	var (
		txCtx context.Context
		tx    idemstore.Tx
	)
	cut("begin isolation level read committed", faultproxy.Before, func() {
		txCtx, tx, err = s.BeginTx(ctx, leaseOf(req))
	})
	if err != nil {
		t.Fatalf("BeginTx over a connection cut under BEGIN: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	htx, _ := idempgx.Tx(txCtx)
	if _, err := htx.Exec(txCtx, "INSERT INTO "+e.EffectsTable()+" (id) VALUES ($1)", req.Key); err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, okResponse("ok")); err != nil {
		t.Fatalf("settle after BeginTx replaced its connection: %v", err)
	}
	if got := e.mustCount(t, req.Key); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}

	// A connection that breaks under the handler's statement fails that
	// statement: the server rolls the transaction back with the
	// connection, the settle stores nothing, and the release leaves the key
	// free for the retry, with no effect.
	req = claimReq("alice", "stmt-"+randHex(4), "body", time.Minute)
	if _, err := s.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err = s.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	htx, _ = idempgx.Tx(txCtx)
	var stmtErr error
	cut("INSERT INTO "+e.EffectsTable(), faultproxy.Before, func() {
		_, stmtErr = htx.Exec(txCtx, "INSERT INTO "+e.EffectsTable()+" (id) VALUES ($1)", req.Key)
	})
	if stmtErr == nil {
		t.Fatal("the handler's statement succeeded on a cut connection")
	}
	if err := tx.Settle(ctx, okResponse("ok")); err == nil || !errors.Is(err, idemstore.ErrTransient) || errors.Is(err, idemstore.ErrTxEnded) {
		t.Fatalf("settle after the transaction's connection broke = %v, want a transient error (not ErrTxEnded)", err)
	}
	if err := s.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release after the broken transaction: %v", err)
	}
	if got := e.mustCount(t, req.Key); got != 0 {
		t.Fatalf("%d effects after the broken transaction, want 0", got)
	}
	if rec, err := e.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateReleased {
		t.Fatalf("row after release: %s, %v", rec.State, err)
	}
}
