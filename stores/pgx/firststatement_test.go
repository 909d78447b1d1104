package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	idempgx "github.com/idemgo/idem/stores/pgx"
)

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
	ways := []struct {
		name  string
		first func(ctx context.Context, tx *idempgx.Handle, id string) error
	}{
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
				req := claimReq("alice", "first-"+randHex(6), "body", time.Minute)
				if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
					t.Fatalf("claim: %+v %v", res, err)
				}
				txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
				if err != nil {
					t.Fatal(err)
				}
				// A failed check must still hand the connection back, or the
				// pool's cleanup waits for it forever.
				defer func() { _ = tx.Rollback(ctx) }()
				htx, _ := idempgx.Tx(txCtx)
				if err := w.first(txCtx, htx, req.Key); err != nil {
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
