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
// fenced UPDATE was not received either. A claim, a takeover or a release
// whose connection broke runs again on another connection and recognises
// its own token.
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
		Claim:    []byte("ON CONFLICT (principal, key) DO NOTHING"),
		Commit:   []byte("COMMIT"),
		Effect:   []byte("INSERT INTO " + e.EffectsTable()),
		Takeover: []byte("SET lease_token = $4, request_id = $5, locked_at = now()"),
		Release:  []byte("UPDATE " + e.Store.Table() + " SET state = 'released'"),
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

// TestBrokenConnectionIsRetried: a connection found broken when BEGIN goes
// out is replaced, and the transaction begins on another one. A connection
// that breaks under a handler's statement fails the request instead,
// leaving no effect and, after the release, no row. (Claims, takeovers and
// releases sent again after a cut are RunFaults' Resent case.)
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
	cut := func(pattern string, when faultproxy.When, fn func()) {
		t.Helper()
		if !proxy.CutWhile([]byte(pattern), when, time.Second, fn) {
			t.Fatalf("the cut on %q never fired", pattern)
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
