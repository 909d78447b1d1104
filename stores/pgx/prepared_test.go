package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPreparedStatementsComeBack: in the default exec mode the store
// prepares its claim and settle statements on each connection under names
// of its own. Whatever the session does to them between two requests, the
// next request prepares them again and runs: removed (DEALLOCATE ALL, a
// pooler's reset), replaced by a statement of the same name, or no longer
// fitting the table (a migration that changes a column's type). One
// connection, so every request meets what the step left.
func TestPreparedStatementsComeBack(t *testing.T) {
	ctx := testCtx(t)
	steps := map[string]func(t *testing.T, e *env, conn *pgx.Conn){
		"DEALLOCATE ALL": func(t *testing.T, _ *env, conn *pgx.Conn) {
			mustExec(ctx, t, conn, "DEALLOCATE ALL")
		},
		"replaced under the same names": func(t *testing.T, e *env, conn *pgx.Conn) {
			mustExec(ctx, t, conn, "DEALLOCATE ALL")
			for _, name := range idempgx.StatementNames(e.Store) {
				mustExec(ctx, t, conn, "PREPARE "+pgx.Identifier{name}.Sanitize()+" AS SELECT 1")
			}
		},
		"column type changed": func(t *testing.T, e *env, conn *pgx.Conn) {
			mustExec(ctx, t, conn, "ALTER TABLE "+pgx.Identifier{e.Schema, "idempotency_keys"}.Sanitize()+
				" ALTER COLUMN request_id TYPE varchar(300)")
		},
	}
	for name, step := range steps {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, newPool(t, 1, nil))
			settled := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
			mustClaimAndSettle(ctx, t, e, settled)

			onConn(ctx, t, e.Pool, func(conn *pgx.Conn) { step(t, e, conn) })
			res, err := e.Store.Claim(ctx, claimReq("alice", settled.Key, "body", time.Minute))
			if err != nil || res.Claimed || res.Record.State != idemstore.StateCompleted {
				t.Fatalf("replay after the step: %+v, %v", res, err)
			}

			onConn(ctx, t, e.Pool, func(conn *pgx.Conn) { step(t, e, conn) })
			mustClaimAndSettle(ctx, t, e, claimReq("alice", "k-"+randHex(4), "body", time.Minute))
		})
	}
}

// TestPreparedStatementsGoneInTheTransaction: a handler that removes the
// store's statements in its own transaction (DEALLOCATE ALL through the
// handle) fails its own settle with nothing committed, and the next
// request on the same connection runs.
func TestPreparedStatementsGoneInTheTransaction(t *testing.T) {
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 1, nil))
	req := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	mustClaim(ctx, t, e, req)
	txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	h, _ := idempgx.Tx(txCtx)
	if _, err := h.Exec(txCtx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, okResponse(`{}`)); err == nil {
		t.Fatal("settle succeeded without its statements")
	}
	_ = tx.Rollback(ctx)
	if n := e.mustCount(t, req.Key); n != 0 {
		t.Fatalf("the failed settle committed the handler's write (%d rows)", n)
	}
	if err := e.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release: %v", err)
	}
	// The store's statements run again (pgx's cache of the handler's
	// own INSERT fails it once more: pgx drops an entry on its error).
	next := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	if res, err := e.Store.Claim(ctx, next); err != nil || !res.Claimed {
		t.Fatalf("claim after: %+v, %v", res, err)
	}
	_, tx, err = e.Store.BeginTx(ctx, leaseOf(next))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, okResponse(`{}`)); err != nil {
		t.Fatalf("settle after: %v", err)
	}
}

// TestSettleOnAConnectionThatNeverClaimed: the settle prepares its
// statements inside the transaction when the connection BeginTx got has
// none yet.
func TestSettleOnAConnectionThatNeverClaimed(t *testing.T) {
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	req := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	mustClaim(ctx, t, e, req)
	// Hold the connection that claimed, so that BeginTx gets the other.
	claimer, err := e.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := e.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if preparedCount(ctx, t, claimer.Conn(), e.Store) == 0 {
		claimer, fresh = fresh, claimer
	}
	if n := preparedCount(ctx, t, fresh.Conn(), e.Store); n != 0 {
		t.Fatalf("control: the second connection already has %d of the store's statements", n)
	}
	fresh.Release()
	defer claimer.Release()
	if err := e.runAttempt(ctx, leaseOf(req), req.Key, `{}`); err != nil {
		t.Fatalf("attempt: %v", err)
	}
	if n := e.mustCount(t, req.Key); n != 1 {
		t.Fatalf("effect rows %d, want 1", n)
	}
	res, err := e.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute))
	if err != nil || res.Record.State != idemstore.StateCompleted {
		t.Fatalf("replay: %+v, %v", res, err)
	}
}

func preparedCount(ctx context.Context, t *testing.T, conn *pgx.Conn, s *idempgx.Store) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE name = ANY($1)",
		idempgx.StatementNames(s)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustClaim(ctx context.Context, t *testing.T, e *env, req idemstore.ClaimRequest) {
	t.Helper()
	if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
}

func mustClaimAndSettle(ctx context.Context, t *testing.T, e *env, req idemstore.ClaimRequest) {
	t.Helper()
	mustClaim(ctx, t, e, req)
	if err := e.runAttempt(ctx, leaseOf(req), req.Key, `{}`); err != nil {
		t.Fatalf("attempt: %v", err)
	}
}

func onConn(ctx context.Context, t *testing.T, pool *pgxpool.Pool, f func(*pgx.Conn)) {
	t.Helper()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	f(c.Conn())
}

func mustExec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// recordingTracer keeps what pgx's batch tracer calls tell it.
type recordingTracer struct {
	mu      sync.Mutex
	batches [][]pgx.TraceBatchQueryData
	ends    []error
}

func (r *recordingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (r *recordingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *recordingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, nil)
	return ctx
}
func (r *recordingTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches[len(r.batches)-1] = append(r.batches[len(r.batches)-1], d)
}
func (r *recordingTracer) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, d.Err)
}

func (r *recordingTracer) last() ([]pgx.TraceBatchQueryData, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.batches[len(r.batches)-1], r.ends[len(r.ends)-1]
}

// TestTracerSeesTheStoresBatches: a pool's pgx.BatchTracer is told of the
// claim's and the settle's batches, statement by statement, with their
// arguments and command tags, and of the statement that failed, as pgx
// tells it of a pgx.Batch.
func TestTracerSeesTheStoresBatches(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) { testTracerSeesTheStoresBatches(t, mode) })
	}
}

func testTracerSeesTheStoresBatches(t *testing.T, mode pgx.QueryExecMode) {
	ctx := testCtx(t)
	tr := &recordingTracer{}
	cfg := idempgxtest.PoolConfig(t, 1)
	cfg.ConnConfig.Tracer = tr
	cfg.ConnConfig.DefaultQueryExecMode = mode
	e := newEnv(t, idempgxtest.OpenPool(t, cfg))

	req := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	mustClaim(ctx, t, e, req)
	qs, end := tr.last()
	if end != nil || len(qs) != 3 || qs[1].CommandTag.String() != "INSERT 0 1" ||
		len(qs[1].Args) != 8 || qs[1].Args[0] != "alice" || qs[1].Args[1] != req.Key ||
		!strings.HasPrefix(qs[1].SQL, "INSERT INTO") || !strings.HasPrefix(qs[2].SQL, "SELECT") {
		t.Fatalf("claim's batch as traced: %+v, end %v", qs, end)
	}

	if err := e.runAttempt(ctx, leaseOf(req), req.Key, `{}`); err != nil {
		t.Fatal(err)
	}
	qs, end = tr.last()
	if end != nil || len(qs) != 3 || qs[2].SQL != "COMMIT" || qs[2].CommandTag.String() != "COMMIT" ||
		qs[1].Args[2] != req.Token {
		t.Fatalf("settle's batch as traced: %+v, end %v", qs, end)
	}

	// A settle whose fence misses: the tracer is told of the check, then
	// of the UPDATE's error, and the batch ends with it.
	lost := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	mustClaim(ctx, t, e, lost)
	l := leaseOf(lost)
	l.Token = "not-" + l.Token
	txCtx, tx, err := e.Store.BeginTx(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	// A statement through the handle begins the transaction, so that the
	// settle's batch is the settle alone.
	h, _ := idempgx.Tx(txCtx)
	if _, err := h.Exec(ctx, "SELECT $1::int", 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, okResponse(`{}`)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("settle with another token: %v, want ErrLeaseLost", err)
	}
	qs, end = tr.last()
	if end == nil || len(qs) != 2 || qs[0].Err != nil || qs[1].Err == nil {
		t.Fatalf("failed settle's batch as traced: %+v, end %v", qs, end)
	}
}

// TestStatementsPreparedInTheDefaultModeOnly: in pgx's default exec mode a
// claim and a settle leave the store's statements prepared on the
// connection under its names; in a mode where pgx prepares nothing by name
// (QueryExecModeCacheDescribe) the store does not either.
func TestStatementsPreparedInTheDefaultModeOnly(t *testing.T) {
	ctx := testCtx(t)
	for mode, want := range map[pgx.QueryExecMode]bool{
		pgx.QueryExecModeCacheStatement: true,
		pgx.QueryExecModeCacheDescribe:  false,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := idempgxtest.PoolConfig(t, 1)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			e := newEnv(t, idempgxtest.OpenPool(t, cfg))
			mustClaimAndSettle(ctx, t, e, claimReq("alice", "k-"+randHex(4), "body", time.Minute))
			names := idempgx.StatementNames(e.Store)
			onConn(ctx, t, e.Pool, func(conn *pgx.Conn) {
				n := preparedCount(ctx, t, conn, e.Store)
				if want && n != len(names) || !want && n != 0 {
					t.Fatalf("%d of the store's %d statements prepared on the connection", n, len(names))
				}
			})
		})
	}
}
