package idempgx_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// dsn is the database the tests use: IDEM_PG_DSN or idempgxtest's default.
var dsn = idempgxtest.DSN

// newPool opens a pool on the test database, through idempgxtest.OpenPool
// (which fails the test loudly when the database is unreachable, and checks
// in cleanup that every connection came back). With c, it counts what the
// pool sends.
func newPool(t testing.TB, maxConns int32, c *idempgxtest.Counter) *pgxpool.Pool {
	t.Helper()
	cfg := idempgxtest.PoolConfig(t, maxConns)
	if c != nil {
		c.Count(cfg)
	}
	return idempgxtest.OpenPool(t, cfg)
}

var randHex = idempgxtest.RandHex

// env is idempgxtest's fresh schema (store, business table effects(id),
// dropped in cleanup) with the helpers these tests add.
type env struct{ *idempgxtest.Env }

func newEnv(t testing.TB, pool *pgxpool.Pool, opts ...idempgx.Option) *env {
	t.Helper()
	return &env{idempgxtest.NewEnv(t, pool, opts...)}
}

func (e *env) mustCount(t testing.TB, id string) int {
	t.Helper()
	n, err := e.CountEffects(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fp(s string) []byte {
	b := make([]byte, idemstore.FingerprintSize)
	copy(b, s)
	return b
}

func claimReq(principal, key, body string, lease time.Duration) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{
		Principal: principal, Key: key, Fingerprint: fp(body), Token: randHex(16), Nonce: randHex(16),
		RequestID: "req-" + randHex(4), Lease: lease, Retention: time.Hour,
	}
}

func leaseOf(r idemstore.ClaimRequest) idemstore.Lease {
	return idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

func okResponse(body string) idemstore.Outcome {
	return idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{
		Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body),
	}}
}

// begin claims a fresh key and begins its transaction; the transaction is
// rolled back in cleanup if the test leaves it open.
func (e *env) begin(t *testing.T, ctx context.Context) (idemstore.ClaimRequest, context.Context, idemstore.Tx, *idempgx.Handle) {
	t.Helper()
	req := claimReq("alice", "tx-"+randHex(6), "body", time.Minute)
	if res, err := e.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	txCtx, stx, err := e.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stx.Rollback(context.Background()) })
	htx, _ := idempgx.Tx(txCtx)
	return req, txCtx, stx, htx
}

// runAttempt is one claimed request: begin, write the effect id, settle.
func (e *env) runAttempt(ctx context.Context, l idemstore.Lease, id, body string) error {
	txCtx, tx, err := e.Store.BeginTx(ctx, l)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := e.WriteEffect(txCtx, id); err != nil {
		return err
	}
	return tx.Settle(ctx, okResponse(body))
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
