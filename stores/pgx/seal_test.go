package idempgx_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestRefusedStatements: every way a transaction-control statement can go
// through the handle (a QueryRewriter's text and a batch's BeginTx
// included) is refused before it is sent, with ErrTxOwned, and the
// transaction is then aborted as after a failed statement: the next
// statement fails with 25P02 and the settle stores nothing.
func TestRefusedStatements(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 4, nil))
	ways := map[string]func(ctx context.Context, tx *idempgx.Handle, sql string) error{
		"Exec": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			_, err := tx.Exec(ctx, sql)
			return err
		},
		"Exec with an argument": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			_, err := tx.Exec(ctx, sql, pgx.QueryExecModeExec)
			return err
		},
		"Query": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			rows, err := tx.Query(ctx, sql)
			if err == nil || rows == nil || rows.Err() == nil || rows.Next() {
				return errors.New("Query did not return failed rows")
			}
			rows.Close()
			return err
		},
		"QueryRow": func(ctx context.Context, tx *idempgx.Handle, sql string) error { return tx.QueryRow(ctx, sql).Scan() },
		"SendBatch": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			b.Queue(sql)
			return tx.SendBatch(ctx, b).Close()
		},
		"savepoint Prepare": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp.Prepare(ctx, "", sql)
			return err
		},
		"savepoint Exec": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp.Exec(ctx, sql)
			return err
		},
		"a QueryRewriter": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			_, err := tx.Exec(ctx, "SELECT 1", rewriteTo(sql))
			return err
		},
		"Batch.BeginTx": func(ctx context.Context, tx *idempgx.Handle, _ string) error {
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			b.Queue("SELECT 1")
			return tx.SendBatch(ctx, b).Close()
		},
		"nested savepoint Query": func(ctx context.Context, tx *idempgx.Handle, sql string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			sp2, err := sp.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp2.Query(ctx, sql)
			return err
		},
	}
	stmts := []string{"COMMIT", "end", "ROLLBACK", "ABORT", "COMMIT AND CHAIN", "BEGIN", "START TRANSACTION",
		"PREPARE TRANSACTION 'idem'", "COMMIT PREPARED 'idem'", "ROLLBACK PREPARED 'idem'",
		"/* c */ -- d\n CoMmIt", "SELECT 1; COMMIT", `SELECT '\'; COMMIT; --'`, "SELECT $$x$$;ROLLBACK"}
	for way, do := range ways {
		for _, stmt := range stmts {
			req, txCtx, stx, htx := e.begin(t, ctx)
			if err := e.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := do(txCtx, htx, stmt); !errors.Is(err, idemstore.ErrTxOwned) || !strings.HasPrefix(err.Error(), "idempgx: ") {
				t.Fatalf("%s(%q) = %v, want idempgx: … ErrTxOwned", way, stmt, err)
			}
			_, err := htx.Exec(txCtx, "SELECT 1")
			if sqlStateOf(err) != "25P02" {
				t.Fatalf("%s(%q): the next statement answered %v, want 25P02 (aborted)", way, stmt, err)
			}
			if err := stx.Settle(ctx, okResponse("x")); !errors.Is(err, idemstore.ErrTxAborted) || errors.Is(err, idemstore.ErrTxEnded) {
				t.Fatalf("%s(%q): settle = %v, want ErrTxAborted", way, stmt, err)
			}
			if n := e.mustCount(t, req.Key); n != 0 {
				t.Fatalf("%s(%q): %d effects committed", way, stmt, n)
			}
		}
	}
}

// TestRefusalInASavepointIsRecoverable: as with any failed statement,
// rolling back to a savepoint taken before the refusal recovers the
// transaction.
func TestRefusalInASavepointIsRecoverable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	req, txCtx, stx, htx := e.begin(t, ctx)
	if err := e.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	sp, err := htx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Exec(ctx, "COMMIT"); !errors.Is(err, idemstore.ErrTxOwned) {
		t.Fatalf("COMMIT in a savepoint = %v", err)
	}
	if err := sp.Rollback(ctx); err != nil {
		t.Fatalf("rollback to the savepoint: %v", err)
	}
	if err := stx.Settle(ctx, okResponse("x")); err != nil {
		t.Fatalf("settle after recovering: %v", err)
	}
	if n := e.mustCount(t, req.Key); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// sqlStateOf returns err's SQLSTATE, or "".
func sqlStateOf(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}

// TestTxEndedOnTheRawConnection: a transaction ended on the raw
// connection, which the handle does not hand out (the test takes it
// through RawConn), stands for any route the handle cannot filter.
// Whatever ended the transaction is detected — the connection idle after
// the statement, another transaction with another marker, an aborted
// transaction without the savepoint rawConn sets — and
// reported as idemstore.ErrTxEnded by Settle and by Rollback; Release then
// changes nothing, and Keep, which the engine calls instead, keeps the
// claim in progress, Uncertain. A raw statement that only fails, in the
// store's own transaction, is not mistaken for an end.
func TestTxEndedOnTheRawConnection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 4, nil))
	cases := []struct {
		raw        string
		ended      bool
		effects    int  // committed effects: the write before the raw statement
		nextRefuse bool // the handle refuses the next statement at once (the connection is idle)
	}{
		{"COMMIT", true, 1, true},
		{"ROLLBACK", true, 0, true},
		{"COMMIT; BEGIN", true, 1, false},
		{"COMMIT AND CHAIN", true, 1, false},
		{"ROLLBACK AND CHAIN", true, 0, false},
		{"COMMIT; BEGIN; SELECT 1/0", true, 1, false},
		{"COMMIT; BEGIN; SAVEPOINT idem_raw; SELECT 1/0", true, 1, false},
		{"SELECT 1/0", false, 0, false},
		{"SAVEPOINT mine; SELECT 1/0", false, 0, false},
		{"SELECT 1", false, 1, false},
	}
	for _, c := range cases {
		for _, settle := range []bool{true, false} {
			req, txCtx, stx, htx := e.begin(t, ctx)
			if err := e.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			_, _ = idempgx.RawConn(htx).Exec(txCtx, c.raw)
			_, nextErr := htx.Exec(txCtx, "INSERT INTO "+e.EffectsTable()+" (id) VALUES ($1)", req.Key+"/after")
			if c.nextRefuse && !errors.Is(nextErr, idemstore.ErrTxEnded) {
				t.Fatalf("%q: the next statement through the handle = %v, want ErrTxEnded", c.raw, nextErr)
			}
			if c.nextRefuse {
				if _, err := htx.Exec(txCtx, "SELECT 1"); !errors.Is(err, idemstore.ErrTxEnded) {
					t.Fatalf("%q: a later statement = %v, want ErrTxEnded", c.raw, err)
				}
			}
			var err error
			if settle {
				err = stx.Settle(ctx, okResponse("x"))
			} else {
				err = stx.Rollback(ctx)
			}
			if got := errors.Is(err, idemstore.ErrTxEnded); got != c.ended {
				t.Fatalf("%q (settle %v): %v; want ErrTxEnded %v", c.raw, settle, err, c.ended)
			}
			if settle && !c.ended && c.effects == 0 && !errors.Is(err, idemstore.ErrTxAborted) {
				t.Fatalf("%q: settle = %v, want ErrTxAborted", c.raw, err)
			}
			wantEffects := c.effects
			if !c.ended && !settle {
				wantEffects = 0 // rolled back
			}
			if n := e.mustCount(t, req.Key); n != wantEffects {
				t.Fatalf("%q (settle %v): %d effects, want %d", c.raw, settle, n, wantEffects)
			}
			wantAfter := 0 // the statement after the raw one commits only if nothing ended or failed
			if !c.ended && c.effects == 1 && settle {
				wantAfter = 1
			}
			if n := e.mustCount(t, req.Key+"/after"); n != wantAfter {
				t.Fatalf("%q (settle %v): %d effects of the statement after the raw one, want %d", c.raw, settle, n, wantAfter)
			}
			rerr := e.Store.Release(ctx, leaseOf(req))
			rec, gerr := e.Store.Get(ctx, "alice", req.Key)
			switch {
			case c.ended && (!errors.Is(rerr, idemstore.ErrTxEnded) || gerr != nil || rec.State != idemstore.StateInProgress || rec.Uncertain):
				t.Fatalf("%q (settle %v): release = %v, record %+v %v; want ErrTxEnded and the claim untouched", c.raw, settle, rerr, rec, gerr)
			case c.ended:
				if err := e.Store.Keep(ctx, leaseOf(req)); err != nil {
					t.Fatalf("%q (settle %v): keep = %v", c.raw, settle, err)
				}
				if rec, err := e.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateInProgress ||
					!rec.Uncertain || rec.LeaseToken != req.Token || rec.LeaseExpiresAt.After(time.Now().Add(time.Minute)) {
					t.Fatalf("%q (settle %v): after keep, record %+v %v; want it in progress, Uncertain, its lease ended", c.raw, settle, rec, err)
				}
			case !c.ended && settle && c.effects == 1:
				if rerr == nil || gerr != nil || rec.State != idemstore.StateCompleted {
					t.Fatalf("%q: release after a completed settle = %v, record %s", c.raw, rerr, rec.State)
				}
			case !c.ended && (c.effects == 0 || !settle) && (rerr != nil || gerr != nil || rec.State != idemstore.StateReleased):
				t.Fatalf("%q (settle %v): release = %v, record %+v %v; want the claim released", c.raw, settle, rerr, rec, gerr)
			}
		}
	}
}

// TestUsed: Used reports whether the handler ran anything through the
// handle.
func TestUsed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	for name, c := range map[string]struct {
		do   func(ctx context.Context, tx *idempgx.Handle)
		used bool
	}{
		"nothing": {func(context.Context, *idempgx.Handle) {}, false},
		"Exec":    {func(ctx context.Context, tx *idempgx.Handle) { _, _ = tx.Exec(ctx, "SELECT 1") }, true},
		"a failed Exec": {func(ctx context.Context, tx *idempgx.Handle) {
			_, _ = tx.Exec(ctx, "SELECT 1/0")
		}, true},
		"a refused Exec": {func(ctx context.Context, tx *idempgx.Handle) { _, _ = tx.Exec(ctx, "COMMIT") }, true},
		"QueryRow":       {func(ctx context.Context, tx *idempgx.Handle) { _ = tx.QueryRow(ctx, "SELECT 1").Scan(new(int)) }, true},
		"Begin":          {func(ctx context.Context, tx *idempgx.Handle) { sp, _ := tx.Begin(ctx); _ = sp.Commit(ctx) }, true},
	} {
		_, txCtx, stx, htx := e.begin(t, ctx)
		c.do(txCtx, htx)
		if got := stx.Used(); got != c.used {
			t.Errorf("%s: Used() = %v, want %v", name, got, c.used)
		}
		_ = stx.Rollback(ctx)
	}
}

// TestLargeObjectsNeverPanic: a savepoint's LargeObjects works in the
// transaction, never panics, and once the store has finished the
// transaction, both a new LargeObjects and a large object the handler kept
// answer pgx.ErrTxClosed instead of running on a connection another
// request may hold.
func TestLargeObjectsNeverPanic(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := newPool(t, 1, nil) // one connection: the next request gets the same one
	e := newEnv(t, pool)
	for _, settle := range []bool{true, false} {
		_, txCtx, stx, htx := e.begin(t, ctx)
		sp, err := htx.Begin(txCtx) // kept open: the settle commits it
		if err != nil {
			t.Fatal(err)
		}
		lo := sp.LargeObjects()
		oid, err := lo.Create(txCtx, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // also when a check fails before the unlink below
			_, _ = pool.Exec(context.Background(), "SELECT lo_unlink(oid) FROM pg_largeobject_metadata WHERE oid = $1", oid)
		})
		obj, err := lo.Open(txCtx, oid, pgx.LargeObjectModeWrite|pgx.LargeObjectModeRead)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := obj.Write([]byte("kept")); err != nil {
			t.Fatal(err)
		}
		if settle {
			if err := stx.Settle(ctx, okResponse("x")); err != nil {
				t.Fatal(err)
			}
		} else if err := stx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := obj.Seek(0, io.SeekStart); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("settle %v: a kept large object after the transaction = %v, want ErrTxClosed", settle, err)
		}
		after := sp.LargeObjects()
		if _, err := after.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("settle %v: LargeObjects after the transaction: Create = %v, want ErrTxClosed", settle, err)
		}
		// The connection went back to the pool in good order.
		if _, err := e.Store.Get(ctx, "alice", "nothing"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("the pool after large objects: %v", err)
		}
		if settle {
			var exists bool
			if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)", oid).Scan(&exists); err != nil || !exists {
				t.Fatalf("the large object did not commit with the settle (%v, %v)", exists, err)
			}
		}
	}
	// A savepoint whose transaction settled without large objects: pgx's
	// own transaction was never told it ended, and the savepoint hands out
	// closed large objects instead of its.
	_, txCtx, stx, htx := e.begin(t, ctx)
	sp, err := htx.Begin(txCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Settle(ctx, okResponse("y")); err != nil {
		t.Fatal(err)
	}
	closed := sp.LargeObjects()
	if _, err := closed.Open(ctx, 1, pgx.LargeObjectModeRead); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("LargeObjects on a settled handle: %v", err)
	}
}

// TestBatchReadAsJoined: under the simple protocol pgx joins a batch's
// queries with "\n;" into one text, so two queries that each look harmless
// can together hold a COMMIT. The handle reads the batch that way too.
func TestBatchReadAsJoined(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cfg := idempgxtest.PoolConfig(t, 2)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	e := newEnv(t, idempgxtest.OpenPool(t, cfg))
	req, txCtx, stx, htx := e.begin(t, ctx)
	if err := e.WriteEffect(txCtx, req.Key); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("SELECT '")
	b.Queue("'; COMMIT; --")
	for _, q := range b.QueuedQueries {
		if _, bad := idempgx.TxControlStatement(q.SQL); bad {
			t.Fatalf("%q alone reads as transaction control; the test needs it not to", q.SQL)
		}
	}
	if err := htx.SendBatch(txCtx, b).Close(); !errors.Is(err, idemstore.ErrTxOwned) {
		t.Fatalf("a batch whose joined text holds COMMIT = %v, want ErrTxOwned", err)
	}
	if err := stx.Settle(ctx, okResponse("x")); !errors.Is(err, idemstore.ErrTxAborted) {
		t.Fatalf("settle = %v, want ErrTxAborted", err)
	}
	if n := e.mustCount(t, req.Key); n != 0 {
		t.Fatalf("%d effects committed", n)
	}
}
