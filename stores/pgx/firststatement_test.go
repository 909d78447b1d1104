package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

// handleWay is one way a handler uses its handle, writing the effect id.
type handleWay struct {
	name string
	run  func(ctx context.Context, tx *idempgx.Handle, id string) error
}

// TestFirstStatementInTheTransaction: the handler's first statement runs
// in the store's transaction, whichever way the handler sends it. Each way
// writes an effect as its first statement; a rollback must then leave no
// effect (an effect sent outside the transaction would have committed on
// its own) and a settle exactly one, with the handler's later statements
// in the same transaction.
func TestFirstStatementInTheTransaction(t *testing.T) {
	pool := newPool(t, 2, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	insert := "INSERT INTO " + e.EffectsTable() + " (id) VALUES ($1)"
	ways := []handleWay{
		{"Exec", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			_, err := tx.Exec(ctx, insert, id)
			return err
		}},
		{"Exec in the simple protocol", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, id)
			return err
		}},
		{"Query", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			rows, err := tx.Query(ctx, insert+" RETURNING id", id)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		}},
		{"Query left to Next", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			rows, err := tx.Query(ctx, insert+" RETURNING id", id)
			if err != nil {
				return err
			}
			for rows.Next() { // no Close: Next's last call must free the connection
			}
			return rows.Err()
		}},
		{"QueryRow", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			var got string
			return tx.QueryRow(ctx, insert+" RETURNING id", id).Scan(&got)
		}},
		{"SendBatch", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			b := &pgx.Batch{}
			b.Queue(insert, id)
			b.Queue("SELECT 1")
			return tx.SendBatch(ctx, b).Close()
		}},
		{"a savepoint", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, id); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}},
	}
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			for _, settle := range []bool{false, true} {
				req, txCtx, tx, htx := e.begin(t, ctx)
				if err := w.run(txCtx, htx, req.Key); err != nil {
					t.Fatal(err)
				}
				// A later statement runs in the same transaction.
				var inTx bool
				if err := htx.QueryRow(txCtx, "SELECT txid_current_if_assigned() IS NOT NULL").Scan(&inTx); err != nil || !inTx {
					t.Fatalf("the first statement's transaction is not the later one's (%v, %v)", inTx, err)
				}
				want := 0
				if settle {
					if err := tx.Settle(ctx, okResponse("ok")); err != nil {
						t.Fatal(err)
					}
					want = 1
				} else if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				if got := e.mustCount(t, req.Key); got != want {
					t.Fatalf("settle=%v: %d effects, want %d", settle, got, want)
				}
			}
		})
	}
}

// TestRowsLeftOpen: a handler that leaves its rows open (a Query it never
// closes nor reads to the end, a QueryRow it never scans), as its first
// statement or a later one, gets a settle that stores nothing, says why,
// and leaves none of its work committed; the key stays claimed for the
// engine to release, and the connection goes back to the pool (newPool's
// cleanup checks that every connection came back).
func TestRowsLeftOpen(t *testing.T) {
	pool := newPool(t, 2, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	insert := "INSERT INTO " + e.EffectsTable() + " (id) VALUES ($1)"
	ways := []handleWay{
		{"first Query", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			_, err := tx.Query(ctx, insert+" RETURNING id", id)
			return err
		}},
		{"first QueryRow", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			tx.QueryRow(ctx, insert+" RETURNING id", id)
			return nil
		}},
		{"later Query", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			if _, err := tx.Exec(ctx, insert, id); err != nil {
				return err
			}
			_, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 3) g")
			return err
		}},
		{"later QueryRow", func(ctx context.Context, tx *idempgx.Handle, id string) error {
			if _, err := tx.Exec(ctx, insert, id); err != nil {
				return err
			}
			tx.QueryRow(ctx, "SELECT 1")
			return nil
		}},
	}
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			req, txCtx, tx, htx := e.begin(t, ctx)
			if err := w.run(txCtx, htx, req.Key); err != nil {
				t.Fatal(err)
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := tx.Settle(sctx, okResponse("ok")); err == nil || !strings.Contains(err.Error(), "rows left open") {
				t.Fatalf("settle with rows left open: %v, want an error that says so", err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Errorf("rollback after the failed settle: %v", err)
			}
			if n := e.mustCount(t, req.Key); n != 0 {
				t.Errorf("%d effects committed by a settle that failed", n)
			}
			rec, err := e.Store.Get(ctx, req.Principal, req.Key)
			if err != nil || rec.State != idemstore.StateInProgress {
				t.Errorf("record after the failed settle: %s, %v; want in progress", rec.State, err)
			}
		})
	}
}

// TestFirstStatementCancelled: a request whose context ends while its
// first statement (or a later one) runs gets the context's error, and the
// transaction is over as a pgx.Tx's would be: the handler's next
// statement fails, the settle stores nothing, and nothing the cut
// statement wrote is committed.
func TestFirstStatementCancelled(t *testing.T) {
	pool := newPool(t, 2, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	slow := "WITH x AS (INSERT INTO " + e.EffectsTable() + " (id) VALUES ($1) RETURNING 1) SELECT pg_sleep($2) FROM x"
	for _, first := range []bool{true, false} {
		req, txCtx, tx, htx := e.begin(t, ctx)
		if !first {
			if _, err := htx.Exec(txCtx, "SELECT $1::int", 1); err != nil {
				t.Fatal(err)
			}
		}
		cctx, cancel := context.WithTimeout(txCtx, 200*time.Millisecond)
		_, err := htx.Exec(cctx, slow, req.Key, 3.0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("first=%v: a statement cut by its context: %v, want context.DeadlineExceeded", first, err)
		}
		if _, err := htx.Exec(txCtx, "SELECT $1::int", 2); err == nil {
			t.Errorf("first=%v: the statement after the cut one succeeded", first)
		}
		if err := tx.Settle(ctx, okResponse("ok")); err == nil {
			t.Errorf("first=%v: the settle after a cut statement succeeded", first)
		}
		if n := e.mustCount(t, req.Key); n != 0 {
			t.Errorf("first=%v: %d effects of the cut statement committed", first, n)
		}
	}
}
