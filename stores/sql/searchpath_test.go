package idemsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// TestSettleUnderHandlersSearchPath: the settle runs in the handler's
// transaction, after whatever the handler set. A handler that puts a
// schema of its own before pg_catalog in search_path, with an = for text
// and one for bigint and integer that are always true, must not make the
// fenced settle update another principal's record, nor fail its own.
func TestSettleUnderHandlersSearchPath(t *testing.T) {
	for _, setup := range []string{"pgx", "pq"} {
		t.Run(setup, func(t *testing.T) {
			f := idemsqltest.NewFixture(t, setup)
			ctx := testCtx(t)
			schema := "idem_hijack_" + idemsqltest.RandSuffix()
			if _, err := f.DB.Exec(`CREATE SCHEMA ` + schema + `;
CREATE FUNCTION ` + schema + `.t(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';
CREATE OPERATOR ` + schema + `.= (LEFTARG = text, RIGHTARG = text, FUNCTION = ` + schema + `.t);
CREATE FUNCTION ` + schema + `.i(bigint, integer) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';
CREATE OPERATOR ` + schema + `.= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = ` + schema + `.i)`); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = f.DB.Exec("DROP SCHEMA " + schema + " CASCADE") })

			other := claimReq("bob", "other-"+idemsqltest.RandSuffix(), "body", time.Minute)
			req := claimReq("alice", "mine-"+idemsqltest.RandSuffix(), "body", time.Minute)
			for _, r := range []idemstore.ClaimRequest{other, req} {
				if res, err := f.Store.Claim(ctx, r); err != nil || !res.Claimed {
					t.Fatalf("claim %s: %+v %v", r.Key, res, err)
				}
			}
			txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Effects.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := idemsqltest.Exec(txCtx, "SET LOCAL search_path = "+schema+", pg_catalog"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created(req.Key)); err != nil {
				t.Errorf("settle under the handler's search_path: %v", err)
			}
			for _, c := range []struct {
				r    idemstore.ClaimRequest
				want idemstore.State
			}{{req, idemstore.StateCompleted}, {other, idemstore.StateInProgress}} {
				rec, err := f.Store.Get(context.Background(), c.r.Principal, c.r.Key)
				if err != nil || rec.State != c.want {
					t.Errorf("%s's record is %s (%v), want %s", c.r.Principal, rec.State, err, c.want)
				}
			}
		})
	}
}
