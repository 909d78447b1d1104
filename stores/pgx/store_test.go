package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/internal/pgsql"
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
	storetest.Run(t, pgxBackend)
}

// pgxBackend is idempgxtest's Backend with what only these tests can
// reach: the raw connection, the pool's size, a counting dialer.
func pgxBackend(t testing.TB) storetest.Backend {
	e := newEnv(t, newPool(t, 8, nil), idempgx.WithNotifications())
	b := e.Backend()
	b.Rounds = envInt("IDEM_PGX_ROUNDS", 0)
	b.EndTxAround = func(ctx context.Context) error {
		_, err := rawConn(ctx).Exec(ctx, "COMMIT")
		return err
	}
	b.ReplaceTxAround = func(ctx context.Context) error {
		_, err := rawConn(ctx).Exec(ctx, "COMMIT; BEGIN")
		return err
	}
	b.DropConn = func(ctx context.Context) error {
		h, _ := idempgx.Tx(ctx)
		var pid int32
		if err := h.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		var killed bool
		err := e.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed)
		if err == nil && !killed {
			err = errors.New("pg_terminate_backend found no such backend")
		}
		return err
	}
	b.Pool = func(t testing.TB, size int) idemstore.Store { return newEnv(t, newPool(t, int32(size), nil)).Store }
	b.HandlerHoldsConn, b.Syncer = true, true
	b.CountTrips = func(t testing.TB) (storetest.Backend, func() int64) {
		c := &idempgxtest.Counter{}
		return newEnv(t, newPool(t, 1, c), idempgx.WithNotifications()).Backend(), c.Turns.Load
	}
	b.Trips = storetest.Trips{Claim: 1, Begin: 0, Settle: 1, Replay: 1, Conflict: 1, Takeover: 2, Release: 1, Keep: 1, Get: 1, DurableClaim: 1}
	b.CountWrites = func(t testing.TB) (storetest.Backend, func() int64) {
		e := newEnv(t, newPool(t, 4, nil))
		return e.Backend(), rowWrites(t, e)
	}
	b.HoldRecord = e.holdRecord
	b.LockBounded = func(t testing.TB, bound time.Duration) idemstore.Store {
		return e.storeOn(t, e.Pool, e.Schema+".idempotency_keys", idempgx.WithLockTimeout(bound))
	}
	b.StatementBounded = func(t testing.TB, bound time.Duration) idemstore.Store {
		return e.storeOn(t, e.Pool, e.Schema+".idempotency_keys", idempgx.WithLockTimeout(5*time.Second), idempgx.WithStatementTimeout(bound))
	}
	b.Durability = func(t testing.TB) (storetest.Backend, func() func() bool) {
		// Every session starts with synchronous_commit off, as a handler
		// may leave a pooled one.
		cfg := idempgxtest.PoolConfig(t, 2)
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET synchronous_commit = off")
			return err
		}
		return newEnv(t, idempgxtest.OpenPool(t, cfg)).Backend(), func() func() bool {
			pos := walInsert(t, testCtx(t), e.Pool)
			return func() bool { return flushedPast(t, testCtx(t), e.Pool, pos) }
		}
	}
	b.DurabilitySetting = func(t testing.TB) (storetest.Backend, func(context.Context) string) {
		one := newEnv(t, newPool(t, 1, nil))
		return one.Backend(), func(ctx context.Context) string {
			var q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			} = one.Pool
			if h, ok := idempgx.Tx(ctx); ok {
				q = h
			}
			var v string
			if err := q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	b.Peer = func(t testing.TB) storetest.Peer { return notifyPeer(t, e) }
	b.Eavesdrop = func(t testing.TB) func() []string { return eavesdrop(t, e) }
	b.Misconfigured = func(t testing.TB) idemstore.Store { return e.storeOn(t, e.Pool, e.Schema+".missing") }
	// A qualified name: New asks the server nothing.
	b.Unreachable = func(t testing.TB) idemstore.Store { return e.storeOn(t, deadPool(t), "public.idempotency_keys") }
	return b
}

// holdRecord is a storetest.Backend.HoldRecord on e's table.
func (e *env) holdRecord(t testing.TB, principal, key string) func() {
	tx := holdRow(t, testCtx(t), e.Pool, e.Store.Table(), principal, key)
	return func() { _ = tx.Rollback(context.Background()) }
}

// deadPool is a pool on a port where no server listens.
func deadPool(t testing.TB) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	return dead
}

// storeOn is a store on pool and table, not migrated.
func (e *env) storeOn(t testing.TB, pool *pgxpool.Pool, table string, opts ...idempgx.Option) *idempgx.Store {
	t.Helper()
	s, err := idempgx.New(pool, append([]idempgx.Option{idempgx.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rowWrites counts the writes to e's table, which no other store uses, by
// its rows' versions (storetest.VersionCount).
func rowWrites(t testing.TB, e *env) func() int64 {
	return storetest.VersionCount(t, func() (map[string]string, error) {
		rows, err := e.Pool.Query(testCtx(t), "SELECT principal || '/' || key, xmin::text || '/' || xmax::text || '/' || ctid::text FROM "+e.Store.Table())
		if err != nil {
			return nil, err
		}
		var k, v string
		versions := map[string]string{}
		_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { versions[k] = v; return nil })
		return versions, err
	})
}

// rawConn is the connection under the handle ctx carries, which only
// these tests can reach.
func rawConn(ctx context.Context) *pgx.Conn {
	h, _ := idempgx.Tx(ctx)
	return idempgx.RawConn(h)
}

func TestNewValidatesTable(t *testing.T) {
	pool := newPool(t, 1, nil)
	// Which names are valid is pgsql.ParseTable's (its TestParseTable).
	for _, bad := range []string{"", "a.b.c", "x;drop table y"} {
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

// TestSchema: Schema is pgsql's rendering (its TestSchemaSQL) for the
// store's table; it runs as rendered, twice (idempotent), Check accepts
// what it made, and Migrate runs concurrently without tripping.
func TestSchema(t *testing.T) {
	schemaOf := func(table string) string {
		t.Helper()
		s, err := idempgx.New(newPool(t, 1, nil), idempgx.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return s.Schema()
	}
	if got, want := schemaOf("billing.Keys"), (pgsql.Table{Schema: "billing", Name: "Keys"}).SchemaSQL(); got != want {
		t.Errorf("Schema(billing.Keys) =\n%s\nwant\n%s", got, want)
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

// TestHandlerTx: the handler's view of the transaction runs in it at read
// committed and is closed once settled, savepoints included. (Savepoints
// behaving as pgx's is TestBehaviourSameAsPgxTx.)
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
	if e.mustCount(t, "committed-early") != 1 {
		t.Fatal("settle did not commit the handler's write")
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
}

// TestErrorMapping: what idempgx adds to the classification that
// core/storetest's Misconfigured and Unreachable cases check: New asks an
// unreachable server for the schema of an unqualified name and says it is
// transient; every error carries one "idempgx: op: " prefix and the
// server's SQLSTATE. (The store's lock timeout holding over a session that
// waits forever, the server's default, is BoundedWaits.)
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := pgxBackend(t)
	if _, err := idempgx.New(deadPool(t)); !errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("New on an unreachable server = %v, want ErrTransient", err)
	}
	if _, err := b.Unreachable(t).Claim(ctx, claimReq("a", "k", "b", time.Second)); !strings.HasPrefix(err.Error(), "idempgx: claim: ") {
		t.Fatalf("claim on an unreachable server = %v, want the prefix idempgx: claim: ", err)
	}
	_, err := b.Misconfigured(t).Get(ctx, "a", "k")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.HasPrefix(err.Error(), "idempgx: get: ") || strings.Count(err.Error(), "idempgx: ") != 1 {
		t.Fatalf("missing table = %v, want one idempgx: get: prefix and the 42P01", err)
	}
}

// TestNoClaimRerunsUnderContention: claims of a fresh key racing each
// other never run the claim statement again: a loser's INSERT waits for
// the winner's and its SELECT, with a snapshot taken after the INSERT,
// reads the winner's row. (Exactly one winner is core/storetest's
// ConcurrentClaimsExactlyOnce.)
func TestNoClaimRerunsUnderContention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 10, nil))
	ctx := testCtx(t)
	for round := range envInt("IDEM_PGX_ROUNDS", 60) {
		key, gate, done := "k"+randHex(6), make(chan struct{}), make(chan error, 16)
		for range 16 {
			go func() {
				<-gate
				_, err := e.Store.Claim(ctx, claimReq("alice", key, "body", time.Minute))
				done <- err
			}()
		}
		close(gate)
		for range 16 {
			if err := <-done; err != nil && !errors.Is(err, idemstore.ErrTransient) {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	if n := idempgx.ClaimReruns(e.Store); n != 0 {
		t.Fatalf("%d claims ran again under contention: the claim's SELECT missed a row its INSERT had met", n)
	}
}

// TestQueryExecModes runs the claim, replay, fence, poisoned-transaction,
// contention and left-behind session cases of core/storetest under every
// pgx query execution mode (the simple protocol, where results are text,
// is what PgBouncer users configure) and with a server default isolation
// of SERIALIZABLE, where the claim's snapshot race surfaces as 40001
// instead of an empty result.
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
	for name, mutate := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.RunCases(t, func(t testing.TB) storetest.Backend {
				cfg := idempgxtest.PoolConfig(t, 6)
				mutate(cfg)
				e := newEnv(t, idempgxtest.OpenPool(t, cfg))
				b := e.Backend()
				b.Rounds, b.HoldRecord = 30, e.holdRecord
				return b
			}, "ClaimExistingWritesNothing", "ResponseRoundTrip", "StaleHolderSettleIsFenced", "FailedCommitStoresNothing",
				"ConcurrentClaimsExactlyOnce", "SessionLeftBehind")
		})
	}
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
