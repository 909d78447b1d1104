package idempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func dsn() string {
	if v := os.Getenv("IDEM_PG_DSN"); v != "" {
		return v
	}
	return defaultDSN
}

// counter counts what the store sends: queries and batches through pgx's
// tracer, and network round trips (a write that follows a read, or the
// first write) on the wire, so the two can be compared.
type counter struct {
	queries, batches, roundTrips atomic.Int64
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	return ctx
}
func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// traced is the tracer's view: statements sent as queries plus batches,
// each of which is one round trip once pgx has the statement prepared.
func (c *counter) traced() int64 { return c.queries.Load() + c.batches.Load() }

func (c *counter) reset() {
	c.queries.Store(0)
	c.batches.Store(0)
	c.roundTrips.Store(0)
}

type countingConn struct {
	net.Conn
	c        *counter
	mu       sync.Mutex
	lastRead bool
	wrote    bool
}

func (cc *countingConn) Write(p []byte) (int, error) {
	cc.mu.Lock()
	if !cc.wrote || cc.lastRead {
		cc.c.roundTrips.Add(1)
	}
	cc.wrote, cc.lastRead = true, false
	cc.mu.Unlock()
	return cc.Conn.Write(p)
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if n > 0 {
		cc.mu.Lock()
		cc.lastRead = true
		cc.mu.Unlock()
	}
	return n, err
}

// newPool opens a pool on the test database and fails the test loudly when
// the database is unreachable. The pool is closed in cleanup, after
// checking that the store returned every connection it acquired.
func newPool(t testing.TB, maxConns int32, c *counter) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		t.Fatalf("idempgx tests: bad IDEM_PG_DSN %q: %v", dsn(), err)
	}
	cfg.MaxConns = maxConns
	if c != nil {
		cfg.ConnConfig.Tracer = c
		// A ping after an idle second would be counted as a round trip.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: conn, c: c}, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("idempgx tests need a reachable PostgreSQL (IDEM_PG_DSN, default %s): %v", defaultDSN, err)
	}
	t.Cleanup(func() {
		// Give late Rollbacks a moment, then insist nothing is held.
		deadline := time.Now().Add(5 * time.Second)
		for pool.Stat().AcquiredConns() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%d pool connections still acquired after the test: a transaction was stranded", n)
		}
		pool.Close()
	})
	return pool
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// env is a fresh schema holding the store's table and a business table
// effects(id), dropped in cleanup.
type env struct {
	pool   *pgxpool.Pool
	schema string
	store  *idempgx.Store
}

func newEnv(t testing.TB, pool *pgxpool.Pool, opts ...idempgx.Option) *env {
	t.Helper()
	schema := "idempgx_t_" + randHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+
		"; CREATE TABLE "+pgx.Identifier{schema, "effects"}.Sanitize()+" (id text NOT NULL)"); err != nil {
		t.Fatalf("create test schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	opts = append([]idempgx.Option{idempgx.WithTable(schema + ".idempotency_keys")}, opts...)
	s, err := idempgx.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &env{pool: pool, schema: schema, store: s}
}

func (e *env) effectsTable() string { return pgx.Identifier{e.schema, "effects"}.Sanitize() }

// writeEffect inserts a business row through the handler's transaction.
func (e *env) writeEffect(ctx context.Context, id string) error {
	tx, ok := idempgx.Tx(ctx)
	if !ok {
		return errors.New("no idempgx transaction in context")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+e.effectsTable()+" (id) VALUES ($1)", id)
	return err
}

func (e *env) countEffects(ctx context.Context, id string) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.effectsTable()+" WHERE id = $1", id).Scan(&n)
	return n, err
}

func (e *env) mustCount(t testing.TB, id string) int {
	t.Helper()
	n, err := e.countEffects(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) backend() storetest.Backend {
	return storetest.Backend{
		Store:        e.store,
		WriteEffect:  e.writeEffect,
		CountEffects: e.countEffects,
		PoisonTx: func(ctx context.Context) error {
			tx, ok := idempgx.Tx(ctx)
			if !ok {
				return errors.New("no idempgx transaction in context")
			}
			// A failing statement aborts the PostgreSQL transaction; the
			// handler swallows the error, as buggy handlers do.
			if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
				return errors.New("SELECT 1/0 did not fail")
			}
			return nil
		},
	}
}

func fp(s string) []byte {
	b := make([]byte, 32)
	copy(b, s)
	return b
}

func claimReq(principal, key, body string, lease time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{
		Principal: principal, Key: key, Fingerprint: fp(body), Token: randHex(16),
		RequestID: "req-" + randHex(4), Lease: lease, Retention: time.Hour,
	}
}

func leaseOf(r idem.ClaimRequest) idem.Lease {
	return idem.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

func okResponse(body string) idem.Outcome {
	return idem.Outcome{State: idem.StateCompleted, Response: idem.Response{
		Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body),
	}}
}

// runAttempt is one claimed request: begin, write the effect id, settle.
func (e *env) runAttempt(ctx context.Context, l idem.Lease, id, body string) error {
	txCtx, tx, err := e.store.BeginTx(ctx, l)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := e.writeEffect(txCtx, id); err != nil {
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
