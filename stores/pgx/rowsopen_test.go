package idempgx_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

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
	ways := []struct {
		name  string
		leave func(ctx context.Context, tx *idempgx.Handle, id string) error
	}{
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
			req := claimReq("alice", "open-"+randHex(6), "body", time.Minute)
			if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			txCtx, tx, err := e.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			htx, _ := idempgx.Tx(txCtx)
			if err := w.leave(txCtx, htx, req.Key); err != nil {
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
