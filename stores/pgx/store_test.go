package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestConformance runs core/storetest. It is not parallel: the suite
// measures leases of 400 ms with sleeps, and the CPU-heavy contention test
// running beside it on a small machine can stretch the gap between two of
// its statements past a lease.
//
// The handle has no Commit or Rollback, so the cases that need them are
// not applicable; the ones that end the transaction behind the handle
// take the raw connection through RawConn, which no handler can reach, to
// prove the store detects it.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Backend {
		b := idempgxtest.NewBackend(t)
		b.EndTxAround = func(ctx context.Context) error {
			tx, ok := idempgx.Tx(ctx)
			if !ok {
				return errors.New("no idempgx transaction in context")
			}
			_, err := idempgx.RawConn(tx).Exec(ctx, "COMMIT")
			return err
		}
		return b
	})
}

func TestNewValidatesTable(t *testing.T) {
	pool := newPool(t, 1, nil)
	for _, bad := range []string{"", "1abc", "a-b", `a"b`, "a.b.c", "a b", "x;drop table y", strings.Repeat("t", 41), ".t", "s."} {
		if _, err := idempgx.New(pool, idempgx.WithTable(bad)); err == nil {
			t.Errorf("WithTable(%q) accepted", bad)
		}
	}
	for good, ident := range map[string]string{"idempotency_keys": `"public"."idempotency_keys"`, "Keys2": `"public"."Keys2"`,
		"_k": `"public"."_k"`, "billing.idem_keys": `"billing"."idem_keys"`} {
		s, err := idempgx.New(pool, idempgx.WithTable(good))
		if err != nil {
			t.Errorf("WithTable(%q): %v", good, err)
		} else if s.Table() != ident {
			t.Errorf("WithTable(%q): Table() = %s, want %s", good, s.Table(), ident)
		}
	}
	for _, opt := range []idempgx.Option{idempgx.WithLockTimeout(0), idempgx.WithLockTimeout(-time.Second),
		idempgx.WithLockTimeout(25 * time.Hour), idempgx.WithStatementTimeout(0), idempgx.WithStatementTimeout(25 * time.Hour),
		idempgx.WithTxTimeout(0), idempgx.WithMaxClaimAttempts(0)} {
		if _, err := idempgx.New(pool, opt); err == nil {
			t.Error("an invalid option was accepted")
		}
	}
	if _, err := idempgx.New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
	s, err := idempgx.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Table() != `"public"."idempotency_keys"` {
		t.Errorf("default Table() = %s", s.Table())
	}
}

func TestSchema(t *testing.T) {
	raw, err := idempgx.Migrations.(interface{ ReadFile(string) ([]byte, error) }).ReadFile(idempgx.MigrationFile)
	if err != nil {
		t.Fatal(err)
	}
	schemaOf := func(table string) string {
		t.Helper()
		s, err := idempgx.New(newPool(t, 1, nil), idempgx.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return s.Schema()
	}
	def := schemaOf(idempgx.DefaultTable)
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "public"."idempotency_keys"`, `"idempotency_keys_lease_expires_at_idx"`,
		`"idempotency_keys_expires_at_idx"`, `WHERE state = 'in_progress'`, "PRIMARY KEY (principal, key)",
		"headers     bytea"} {
		if !strings.Contains(def, want) {
			t.Errorf("Schema(default) lacks %q", want)
		}
	}
	// PostgreSQL parses each CHECK anew on every INSERT and UPDATE; Claim
	// holds the bounds instead (TestClaimBounds).
	if strings.Contains(def, "CHECK (") {
		t.Error("Schema(default) has a CHECK constraint")
	}
	if strings.ReplaceAll(def, `"`, "") != strings.ReplaceAll(string(raw), `"`, "") {
		t.Error("Schema(default) differs from the embedded file other than by quoting")
	}
	other := schemaOf("billing.Keys")
	if strings.Contains(other, "idempotency_keys") || !strings.Contains(other, `"billing"."Keys"`) ||
		!strings.Contains(other, `INDEX IF NOT EXISTS "Keys_expires_at_idx"`) {
		t.Errorf("Schema(billing.Keys) =\n%s", other)
	}

	// The embedded file names public.idempotency_keys, which the tests
	// leave alone (other suites share the database): it runs here as
	// Schema renders it for a fresh schema, the same text but for the
	// name, twice (idempotent), then Check accepts what it made, and
	// Migrate runs concurrently without tripping.
	pool := newPool(t, 6, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	rendered := schemaOf(e.Schema + ".by_hand")
	for range 2 {
		if _, err := pool.Exec(ctx, rendered); err != nil {
			t.Fatalf("rendered migration: %v", err)
		}
	}
	byHand, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".by_hand"))
	if err != nil {
		t.Fatal(err)
	}
	if err := byHand.Check(ctx); err != nil {
		t.Fatalf("Check of the rendered migration's table: %v", err)
	}
	s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".concurrent"))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- s.Migrate(ctx) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
}

// TestExactlyOnceUnderContention: many rounds of 16 goroutines claiming the
// same fresh key; each winner writes a business row and settles in the
// shared transaction.
func TestExactlyOnceUnderContention(t *testing.T) {
	t.Parallel()
	rounds := envInt("IDEM_PGX_ROUNDS", 2000)
	const goroutines = 16
	pool := newPool(t, 10, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	start := time.Now()
	var transient int
	for round := range rounds {
		key := "k" + randHex(6)
		type result struct {
			claimed bool
			err     error
		}
		results := make(chan result, goroutines)
		gate := make(chan struct{})
		for range goroutines {
			go func() {
				req := claimReq("alice", key, "body", 30*time.Second)
				<-gate
				res, err := e.Store.Claim(ctx, req)
				if err != nil || !res.Claimed {
					results <- result{err: err}
					return
				}
				results <- result{claimed: true, err: e.runAttempt(ctx, leaseOf(req), key, key)}
			}()
		}
		close(gate)
		winners := 0
		for range goroutines {
			r := <-results
			switch {
			case r.err != nil && errors.Is(r.err, idemstore.ErrTransient) && !r.claimed:
				transient++
			case r.err != nil:
				t.Fatalf("round %d: %v", round, r.err)
			case r.claimed:
				winners++
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners, want 1", round, winners)
		}
	}
	elapsed := time.Since(start)
	var keys, effects, inProgress int
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+e.Store.Table()+`),
		(SELECT count(*) FROM `+e.EffectsTable()+`),
		(SELECT count(*) FROM `+e.Store.Table()+` WHERE state <> 'completed')`).Scan(&keys, &effects, &inProgress)
	if err != nil {
		t.Fatal(err)
	}
	if keys != rounds || effects != rounds || inProgress != 0 {
		t.Fatalf("keys=%d business rows=%d not completed=%d, want %d %d 0", keys, effects, inProgress, rounds, rounds)
	}
	var dup int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM `+e.EffectsTable()+` GROUP BY id HAVING count(*) > 1) d`).Scan(&dup); err != nil || dup != 0 {
		t.Fatalf("%d keys with more than one business row (%v)", dup, err)
	}
	reruns := idempgx.ClaimReruns(e.Store)
	t.Logf("%d rounds × %d goroutines in %v: %d keys, %d business rows, 0 in progress; %d transient claim errors; %d claims re-run",
		rounds, goroutines, elapsed.Round(time.Millisecond), keys, effects, transient, reruns)
	// A loser's INSERT waits for the winner's and finds its row; the
	// claim's SELECT, with a snapshot taken after the INSERT, reads it.
	// Nothing here expires or is purged, so no claim has cause to run
	// again.
	if reruns != 0 {
		t.Errorf("%d claims ran again under contention: the claim's SELECT missed a row its INSERT had met", reruns)
	}
}

// TestFence: a holder whose lease expired and was taken over cannot commit
// its business write.
func TestFence(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	e := newEnv(t, newPool(t, 6, nil))
	ctx := testCtx(t)

	first := claimReq("alice", "pay-"+randHex(4), "body", lease)
	if res, err := e.Store.Claim(ctx, first); err != nil || !res.Claimed {
		t.Fatalf("first claim: %+v %v", res, err)
	}
	txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(first))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	time.Sleep(lease + 50*time.Millisecond)
	second := claimReq("alice", first.Key, "body", lease)
	res, err := e.Store.Claim(ctx, second)
	if err != nil || !res.Claimed || !res.Reclaimed {
		t.Fatalf("takeover after the lease: %+v %v", res, err)
	}

	// The first holder, unaware, writes its business row and settles.
	if err := e.WriteEffect(txCtx, "first"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, okResponse("first")); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale holder's settle = %v, want ErrLeaseLost", err)
	}
	if n := e.mustCount(t, "first"); n != 0 {
		t.Fatalf("stale holder's business row committed (%d)", n)
	}
	// Its handler's view of the transaction is closed.
	if _, err := idempgx.Tx(txCtx); err == false {
		t.Fatal("Tx(ctx) lost the transaction")
	}
	if h, _ := idempgx.Tx(txCtx); h != nil {
		if _, err := h.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("handler tx after settle: %v, want ErrTxClosed", err)
		}
	}

	if err := e.runAttempt(ctx, leaseOf(second), "second", "second"); err != nil {
		t.Fatalf("new holder: %v", err)
	}
	if n := e.mustCount(t, "second"); n != 1 {
		t.Fatalf("new holder's rows = %d", n)
	}
	rec, err := e.Store.Get(ctx, "alice", first.Key)
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "second" {
		t.Fatalf("final record %+v %v", rec, err)
	}
}

// TestTakeoverRechecksTheRow: the stale takeover's UPDATE decides on the
// row's latest version, not on what the claim read before it: it matches
// nothing for a row whose own lease has not ended, whatever lease the new
// request asks for, nor for an Uncertain row (a Keep that landed between
// the claim's read and its UPDATE) unless the request may take it over,
// and it keeps the Uncertain mark when it may.
func TestTakeoverRechecksTheRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 2, nil))
	ctx := testCtx(t)
	takeover := func(held idemstore.ClaimRequest, takeOverUncertain bool) int64 {
		t.Helper()
		next := claimReq(held.Principal, held.Key, "body", time.Microsecond)
		tag, err := e.Pool.Exec(ctx, idempgx.TakeoverSQL(e.Store), next.Principal, next.Key, next.Fingerprint, next.Token,
			next.RequestID, int64(3600e6), held.Token, int64(1), takeOverUncertain)
		if err != nil {
			t.Fatal(err)
		}
		return tag.RowsAffected()
	}
	claim := func(lease time.Duration) idemstore.ClaimRequest {
		t.Helper()
		req := claimReq("alice", "recheck-"+randHex(4), "body", lease)
		if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		return req
	}

	if n := takeover(claim(time.Hour), true); n != 0 {
		t.Fatalf("the takeover matched %d rows of a record whose own lease has an hour left", n)
	}
	if n := takeover(claim(time.Microsecond), false); n != 1 {
		t.Fatalf("the takeover matched %d rows of a record whose lease ended, want 1", n)
	}
	kept := claim(time.Hour)
	if err := e.Store.Keep(ctx, leaseOf(kept)); err != nil {
		t.Fatal(err)
	}
	if n := takeover(kept, false); n != 0 {
		t.Fatalf("the takeover without TakeOverUncertain matched %d rows of a kept record", n)
	}
	if n := takeover(kept, true); n != 1 {
		t.Fatalf("the takeover with TakeOverUncertain matched %d rows of a kept record, want 1", n)
	}
	if rec, err := e.Store.Get(ctx, "alice", kept.Key); err != nil || !rec.Uncertain || rec.LeaseToken == kept.Token {
		t.Fatalf("taken-over kept record = %+v, %v; want it Uncertain under the new token", rec, err)
	}
}

// TestTakeoverRacingCompletion: a takeover that comes too early (the
// holder's lease is 1µs, so the holder is stale at once) racing the holder's
// settle, in both orders and interleaved at random, never commits two
// effects, and the stored response is always from the one effect that
// committed.
func TestTakeoverRacingCompletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 8, nil))
	ctx := testCtx(t)
	iterations := envInt("IDEM_PGX_RACE_ITERATIONS", 300)
	var holderWins, takerWins int
	for i := range iterations {
		key := "race-" + randHex(6)
		holder := claimReq("alice", key, "body", time.Microsecond)
		if res, err := e.Store.Claim(ctx, holder); err != nil || !res.Claimed {
			t.Fatalf("holder claim: %+v %v", res, err)
		}
		txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(holder))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.WriteEffect(txCtx, key+"/holder"); err != nil {
			t.Fatal(err)
		}

		holderDone := make(chan error, 1)
		settle := func() { holderDone <- tx.Settle(ctx, okResponse("holder")) }
		taker := claimReq("alice", key, "body", time.Hour)
		take := func() error {
			res, err := e.Store.Claim(ctx, taker)
			if err != nil {
				return err
			}
			if !res.Claimed {
				if res.Record.State != idemstore.StateCompleted || string(res.Record.Response.Body) != "holder" {
					t.Errorf("iteration %d: taker not claimed but record is %+v", i, res.Record)
				}
				return nil
			}
			if !res.Reclaimed {
				t.Errorf("iteration %d: takeover not marked Reclaimed", i)
			}
			return e.runAttempt(ctx, leaseOf(taker), key+"/taker", "taker")
		}
		var takeErr, settleErr error
		switch i % 3 {
		case 0: // completion commits first
			settle()
			settleErr = <-holderDone
			takeErr = take()
		case 1: // takeover first
			takeErr = take()
			settle()
			settleErr = <-holderDone
		default: // at the same time
			go settle()
			takeErr = take()
			settleErr = <-holderDone
		}
		_ = tx.Rollback(ctx)
		if takeErr != nil {
			t.Fatalf("iteration %d: taker: %v", i, takeErr)
		}
		if settleErr != nil && !errors.Is(settleErr, idemstore.ErrLeaseLost) {
			t.Fatalf("iteration %d: holder settle: %v", i, settleErr)
		}
		h, tk := e.mustCount(t, key+"/holder"), e.mustCount(t, key+"/taker")
		if h+tk != 1 {
			t.Fatalf("iteration %d (order %d): holder effects %d, taker effects %d: want exactly one", i, i%3, h, tk)
		}
		rec, err := e.Store.Get(ctx, "alice", key)
		if err != nil {
			t.Fatal(err)
		}
		want := "holder"
		if tk == 1 {
			want = "taker"
			takerWins++
		} else {
			holderWins++
		}
		if rec.State != idemstore.StateCompleted || string(rec.Response.Body) != want {
			t.Fatalf("iteration %d: record %s %q, want completed %q", i, rec.State, rec.Response.Body, want)
		}
		if (settleErr == nil) != (want == "holder") {
			t.Fatalf("iteration %d: holder settle err %v but %s's effect stands", i, settleErr, want)
		}
	}
	t.Logf("%d iterations: holder committed %d, taker committed %d, never both", iterations, holderWins, takerWins)
}

// TestHandlerTx: the handler's view of the transaction runs in it, nests
// with savepoints, and is closed once settled, savepoints included.
func TestHandlerTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 4, nil))
	ctx := testCtx(t)
	if _, ok := idempgx.Tx(ctx); ok {
		t.Fatal("Tx(ctx) found a transaction in a plain context")
	}

	req := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	htx, ok := idempgx.Tx(txCtx)
	if !ok {
		t.Fatal("no transaction in BeginTx's context")
	}
	if err := e.WriteEffect(txCtx, "committed-early"); err != nil {
		t.Fatal(err)
	}
	var iso string
	if err := htx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "read committed" {
		t.Fatalf("isolation %q %v, want read committed", iso, err)
	}
	// A savepoint works as in pgx.
	sp, err := htx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Exec(ctx, "INSERT INTO "+e.EffectsTable()+" VALUES ('undone')"); err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	leaked, err := htx.Begin(ctx) // a savepoint the handler keeps past settle
	if err != nil {
		t.Fatal(err)
	}
	if n := e.mustCount(t, "committed-early"); n != 0 {
		t.Fatal("handler's write visible before settle")
	}
	if err := tx.Settle(ctx, okResponse("ok")); err != nil {
		t.Fatal(err)
	}
	if e.mustCount(t, "committed-early") != 1 || e.mustCount(t, "undone") != 0 {
		t.Fatal("settle did not commit exactly the handler's surviving writes")
	}
	if _, err := htx.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after settle = %v, want ErrTxClosed", err)
	}
	if _, err := leaked.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("savepoint Exec after settle = %v, want ErrTxClosed", err)
	}
	if err := leaked.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("savepoint Rollback after settle = %v, want ErrTxClosed", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback after Settle: %v", err)
	}

	// A cancelled request context does not strand the transaction: settle
	// and rollback run on the engine's own context.
	req3 := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req3); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	txCtx3, tx3, err := e.Store.BeginTx(reqCtx, leaseOf(req3))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx3.Rollback(ctx) }()
	if err := e.WriteEffect(txCtx3, "cancelled"); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := tx3.Settle(context.WithoutCancel(reqCtx), okResponse("c")); err != nil {
		t.Fatalf("settle after the request was cancelled: %v", err)
	}
	if e.mustCount(t, "cancelled") != 1 {
		t.Fatal("write lost")
	}
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)

	// Unreachable server: transient.
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	// New qualifies an unqualified name on the server: unreachable, it
	// says so, transient.
	if _, err := idempgx.New(dead); !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("New on an unreachable server = %v, want ErrTransient", err)
	}
	ds, err := idempgx.New(dead, idempgx.WithTable("public.idempotency_keys"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ds.Claim(ctx, claimReq("a", "k", "b", time.Second))
	if !errors.Is(err, idemstore.ErrTransient) || !strings.HasPrefix(err.Error(), "idempgx: claim: ") {
		t.Fatalf("claim on an unreachable server = %v, want idempgx: claim: … ErrTransient", err)
	}

	pool := newPool(t, 4, nil)
	e := newEnv(t, pool)
	// Missing table: misconfigured, not transient, SQLSTATE reachable,
	// one prefix.
	missing, _ := idempgx.New(pool, idempgx.WithTable(e.Schema+".nope"))
	_, err = missing.Get(ctx, "a", "k")
	var pgErr *pgconn.PgError
	if errors.Is(err, idemstore.ErrTransient) || !errors.Is(err, idem.ErrMisconfigured) || !errors.As(err, &pgErr) ||
		pgErr.Code != "42P01" || !strings.HasPrefix(err.Error(), "idempgx: get: ") || strings.Count(err.Error(), "idempgx: ") != 1 {
		t.Fatalf("missing table = %v, want idempgx: get: … ErrMisconfigured with the 42P01", err)
	}

	// A lock timeout (55P03) is transient.
	req := claimReq("alice", "locked", "body", time.Minute)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, "SELECT 1 FROM "+e.Store.Table()+" WHERE key = 'locked' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// The session says to wait forever; the store's own bound wins.
	lcfg := pool.Config().Copy()
	lcfg.ConnConfig.RuntimeParams["lock_timeout"] = "0"
	lcfg.MaxConns = 1
	lpool, err := pgxpool.NewWithConfig(ctx, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lpool.Close()
	ls, _ := idempgx.New(lpool, idempgx.WithTable(e.Schema+".idempotency_keys"), idempgx.WithLockTimeout(50*time.Millisecond))
	err = ls.Release(ctx, leaseOf(req))
	if !errors.Is(err, idemstore.ErrTransient) || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("release under lock_timeout = %v, want transient 55P03", err)
	}

	// The caller giving up is not transient.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Store.Get(cctx, "a", "k"); err == nil || errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("cancelled Get = %v", err)
	}
}

// TestQueryExecModes runs the claim, settle, replay, fence and poisoned
// transaction paths under every pgx query execution mode (the simple
// protocol is what PgBouncer users configure) and with a server default
// isolation of SERIALIZABLE, where the claim's snapshot race surfaces as
// 40001 instead of an empty result.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	modes := map[string]func(*pgxpool.Config){
		"CacheStatement": func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement },
		"CacheDescribe":  func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe },
		"DescribeExec":   func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec },
		"Exec":           func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec },
		"SimpleProtocol": func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol },
		"Serializable": func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
		},
	}
	base := newPool(t, 2, nil)
	for name, mutate := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			e := newEnv(t, base)
			cfg := base.Config().Copy()
			cfg.MaxConns = 6
			mutate(cfg)
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".idempotency_keys"))
			if err != nil {
				t.Fatal(err)
			}
			me := &env{&idempgxtest.Env{Pool: pool, Schema: e.Schema, Store: s}}

			// Settle and replay, with binary-unfriendly content.
			req := claimReq("alice", "k-"+randHex(4), "body\x00\xff", time.Minute)
			if res, err := s.Claim(ctx, req); err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			out := okResponse("\x00\xff'\"; COMMIT; --")
			out.Response.Header["X-Quote"] = []string{`it's "quoted"`}
			txCtx, tx, err := s.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			if err := me.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, out); err != nil {
				t.Fatalf("settle: %v", err)
			}
			res, err := s.Claim(ctx, claimReq("alice", req.Key, "body\x00\xff", time.Minute))
			if err != nil || res.Claimed || string(res.Record.Response.Body) != string(out.Response.Body) ||
				res.Record.Response.Header.Get("X-Quote") != `it's "quoted"` {
				t.Fatalf("replay: %+v %v", res, err)
			}

			// The fence: a lost lease commits nothing.
			old := claimReq("alice", "f-"+randHex(4), "body", time.Microsecond) // stale at once
			if _, err := s.Claim(ctx, old); err != nil {
				t.Fatal(err)
			}
			oldCtx, oldTx, err := s.BeginTx(ctx, leaseOf(old))
			if err != nil {
				t.Fatal(err)
			}
			if err := me.WriteEffect(oldCtx, old.Key+"/old"); err != nil {
				t.Fatal(err)
			}
			taker := claimReq("alice", old.Key, "body", time.Minute)
			if res, err := s.Claim(ctx, taker); err != nil || !res.Reclaimed {
				t.Fatalf("takeover: %+v %v", res, err)
			}
			if err := oldTx.Settle(ctx, okResponse("old")); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("stale settle = %v, want ErrLeaseLost", err)
			}
			if me.mustCount(t, old.Key+"/old") != 0 {
				t.Fatal("stale holder's write committed")
			}

			// A poisoned transaction is a failure, never a success.
			p := claimReq("alice", "p-"+randHex(4), "body", time.Minute)
			if _, err := s.Claim(ctx, p); err != nil {
				t.Fatal(err)
			}
			pCtx, pTx, err := s.BeginTx(ctx, leaseOf(p))
			if err != nil {
				t.Fatal(err)
			}
			if err := me.WriteEffect(pCtx, p.Key); err != nil {
				t.Fatal(err)
			}
			if err := me.Backend().PoisonTx(pCtx); err != nil {
				t.Fatal(err)
			}
			if err := pTx.Settle(ctx, okResponse("p")); err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("settle of a poisoned tx = %v", err)
			}
			if me.mustCount(t, p.Key) != 0 {
				t.Fatal("poisoned tx committed")
			}

			// Contention, briefly.
			for round := range 30 {
				key := "c-" + randHex(6)
				winners := make(chan bool, 8)
				gate := make(chan struct{})
				for range 8 {
					go func() {
						r := claimReq("alice", key, "body", time.Minute)
						<-gate
						res, err := s.Claim(ctx, r)
						if err != nil {
							t.Errorf("round %d: claim: %v", round, err)
						}
						if err == nil && res.Claimed {
							if err := me.runAttempt(ctx, leaseOf(r), key, "x"); err != nil {
								t.Errorf("round %d: %v", round, err)
							}
						}
						winners <- err == nil && res.Claimed
					}()
				}
				close(gate)
				n := 0
				for range 8 {
					if <-winners {
						n++
					}
				}
				if n != 1 || me.mustCount(t, key) != 1 {
					t.Fatalf("round %d: %d winners, %d effects", round, n, me.mustCount(t, key))
				}
			}
		})
	}
}

// TestPurgeRacingReplacement: sweepers delete expired rows while requests
// claim the same expired keys again. A purge must never delete a row a
// claim has just replaced (its expires_at is re-checked on the locked row),
// so every claim settles, and every key ends with exactly one effect.
func TestPurgeRacingReplacement(t *testing.T) {
	t.Parallel()
	const keys = 150
	e := newEnv(t, newPool(t, 8, nil))
	ctx := testCtx(t)
	for i := range keys {
		req := claimReq("alice", fmt.Sprintf("exp-%03d", i), "old", time.Minute)
		req.Retention = 300 * time.Millisecond
		if _, err := e.Store.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
		_, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Settle(ctx, okResponse("old")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond)

	var wg sync.WaitGroup
	var purged atomic.Int64
	for range 2 {
		wg.Go(func() {
			for {
				n, err := e.Store.PurgeExpired(ctx, 3)
				if err != nil {
					t.Errorf("purge: %v", err)
					return
				}
				purged.Add(int64(n))
				if n == 0 {
					return
				}
			}
		})
	}
	// The sweepers go oldest first; the claimers start from the other end,
	// so they meet and race somewhere in the middle.
	work := make(chan int, keys)
	for i := keys - 1; i >= 0; i-- {
		work <- i
	}
	close(work)
	for range 4 {
		wg.Go(func() {
			for i := range work {
				key := fmt.Sprintf("exp-%03d", i)
				req := claimReq("alice", key, "new", time.Minute)
				res, err := e.Store.Claim(ctx, req)
				if err != nil || !res.Claimed || res.Reclaimed {
					t.Errorf("%s: claim of an expired key: %+v %v", key, res, err)
					continue
				}
				if err := e.runAttempt(ctx, leaseOf(req), key, "new"); err != nil {
					t.Errorf("%s: settle after replacing an expired row: %v", key, err)
				}
			}
		})
	}
	wg.Wait()
	var completed, effects int
	if err := e.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+e.Store.Table()+` WHERE state = 'completed' AND body = 'new'),
		(SELECT count(DISTINCT id) FROM `+e.EffectsTable()+`)`).Scan(&completed, &effects); err != nil {
		t.Fatal(err)
	}
	if completed != keys || effects != keys {
		t.Fatalf("%d keys completed anew, %d effects; want %d each", completed, effects, keys)
	}
	t.Logf("%d expired keys re-claimed while sweepers purged %d of them", keys, purged.Load())
}

// A table named without a schema lands in the schema the pool's search_path
// selects when New runs (as with idemgorm), and stays there whatever the
// session's search_path says later.
func TestUnqualifiedTableFollowsTheDSNsSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 2, nil))
	cfg := idempgxtest.PoolConfig(t, 2)
	cfg.ConnConfig.RuntimeParams["search_path"] = e.Schema
	s, err := idempgx.New(idempgxtest.OpenPool(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	want := pgx.Identifier{e.Schema, idempgx.DefaultTable}.Sanitize()
	if s.Table() != want {
		t.Fatalf("Table() = %s, want %s", s.Table(), want)
	}
}
