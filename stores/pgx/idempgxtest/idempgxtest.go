// Package idempgxtest makes idempgx stores for the conformance suites
// (core/storetest, core/adaptertest): NewBackend is a storetest.Backend
// on a fresh schema in the PostgreSQL that IDEM_PG_DSN names, dropped when
// the test ends. An unreachable database fails the test with t.Fatal; it
// never skips, so a store that was never tested cannot look green. The
// store's own tests and the conformance module share it; it imports only
// core, idempgx and pgx.
package idempgxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

// DefaultDSN is the database the tests use when IDEM_PG_DSN is not set.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns IDEM_PG_DSN, or DefaultDSN when it is not set.
func DSN() string {
	if v := os.Getenv("IDEM_PG_DSN"); v != "" {
		return v
	}
	return DefaultDSN
}

// PoolConfig parses DSN into a pool configuration of at most maxConns
// connections, failing t on a bad DSN. Callers may adjust it before
// OpenPool.
func PoolConfig(t testing.TB, maxConns int32) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		t.Fatalf("idempgx tests: bad IDEM_PG_DSN %q: %v", DSN(), err)
	}
	cfg.MaxConns = maxConns
	return cfg
}

// OpenPool opens a pool with cfg and fails the test loudly when the
// database is unreachable. The pool is closed in cleanup, after checking
// that the store returned every connection it acquired.
func OpenPool(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		t.Fatalf("idempgx tests need a reachable PostgreSQL (IDEM_PG_DSN, default %s): %v", DefaultDSN, err)
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

// NewPool opens a pool of at most maxConns connections on DSN; see
// OpenPool.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return OpenPool(t, PoolConfig(t, maxConns))
}

// Counter counts what a pool sends to PostgreSQL twice: statements and
// batches through pgx's tracer, and request/response turns on the socket
// (the first bytes read after a write), which is what a round trip is. A
// message that gets no answer rides in the next turn. Install it with
// Count; its Dial counts the turns of any other client too.
type Counter struct {
	Queries, Batches, Turns atomic.Int64
	// Statements counts every statement sent, alone or in a batch.
	Statements atomic.Int64
}

// Count makes cfg's connections counted by c: its tracer, its dialer, and
// no ping before a connection is handed out (an idle second's ping would
// count as a turn).
func (c *Counter) Count(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = c
	c.CountTurns(cfg)
}

// CountTurns is Count without the tracer: only Turns count, and the pool
// runs as one without a tracer does (a benchmark's).
func (c *Counter) CountTurns(cfg *pgxpool.Config) {
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.DialFunc = c.Dial
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.Queries.Add(1)
	c.Statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.Batches.Add(1)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.Statements.Add(1)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Traced is statements sent as queries plus batches: one round trip each
// once pgx has the statement prepared.
func (c *Counter) Traced() int64 { return c.Queries.Load() + c.Batches.Load() }

// Reset zeroes every count.
func (c *Counter) Reset() {
	c.Queries.Store(0)
	c.Batches.Store(0)
	c.Turns.Store(0)
	c.Statements.Store(0)
}

// Dial connects to addr with its turns counted by c.
func (c *Counter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 5 * time.Minute}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: c}, nil
}

type countingConn struct {
	net.Conn
	c       *Counter
	mu      sync.Mutex
	waiting bool // written since the last read
}

func (cc *countingConn) Write(p []byte) (int, error) {
	cc.mu.Lock()
	cc.waiting = true
	cc.mu.Unlock()
	return cc.Conn.Write(p)
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if n > 0 {
		cc.mu.Lock()
		if cc.waiting {
			cc.c.Turns.Add(1)
		}
		cc.waiting = false
		cc.mu.Unlock()
	}
	return n, err
}

// RandHex returns n random bytes in hex, for names no other test uses.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Env is a fresh schema holding the store's table and a business table
// effects(id), dropped in cleanup.
type Env struct {
	// Pool is the pool the store and the business table use.
	Pool *pgxpool.Pool
	// Schema is the schema's name, unquoted.
	Schema string
	// Store is the store on Schema.idempotency_keys, migrated.
	Store *idempgx.Store
}

// NewEnv creates a fresh schema through pool, migrates a store on it
// (opts follow the table option, so they may override it) and registers
// the schema's DROP with t.Cleanup.
func NewEnv(t testing.TB, pool *pgxpool.Pool, opts ...idempgx.Option) *Env {
	t.Helper()
	schema := "idempgx_t_" + RandHex(6)
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
	return &Env{Pool: pool, Schema: schema, Store: s}
}

// EffectsTable is the business table's quoted, schema-qualified name.
func (e *Env) EffectsTable() string { return pgx.Identifier{e.Schema, "effects"}.Sanitize() }

// WriteEffect inserts a business row through the transaction ctx carries,
// as a handler does.
func (e *Env) WriteEffect(ctx context.Context, id string) error {
	tx, ok := idempgx.Tx(ctx)
	if !ok {
		return errors.New("no idempgx transaction in context")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+e.EffectsTable()+" (id) VALUES ($1)", id)
	return err
}

// CountEffects returns the number of committed business rows for id.
func (e *Env) CountEffects(ctx context.Context, id string) (int, error) {
	var n int
	err := e.Pool.QueryRow(ctx, "SELECT count(*) FROM "+e.EffectsTable()+" WHERE id = $1", id).Scan(&n)
	return n, err
}

// Backend returns the suites' view of e.
func (e *Env) Backend() storetest.Backend {
	return storetest.Backend{
		Store:        e.Store,
		WriteEffect:  e.WriteEffect,
		CountEffects: e.CountEffects,
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
		Dialect: "postgres",
		Exec: func(ctx context.Context, sql string, args ...any) error {
			tx, ok := idempgx.Tx(ctx)
			if !ok {
				return errors.New("no idempgx transaction in context")
			}
			_, err := tx.Exec(ctx, sql, args...)
			return err
		},
		Session: func(t testing.TB, session []string) storetest.Backend {
			cfg := e.Pool.Config()
			cfg.MaxConns = 3
			cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
				for _, stmt := range session {
					if _, err := c.Exec(ctx, stmt); err != nil {
						return err
					}
				}
				return nil
			}
			pool := OpenPool(t, cfg)
			s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".idempotency_keys"))
			if err != nil {
				t.Fatal(err)
			}
			return (&Env{Pool: pool, Schema: e.Schema, Store: s}).Backend()
		},
		// EndHandle and EndTxAround stay nil: the handle has no Commit or
		// Rollback, and no route to the connection. (idempgx's own tests
		// set EndTxAround through a hook to the raw connection that only
		// they can reach, to prove the store detects a transaction ended
		// behind the handle.)
	}
}

// NewBackend is a storetest.NewBackend: a store on a fresh schema, with
// its own pool of 8 connections, both gone when t ends.
func NewBackend(t testing.TB) storetest.Backend {
	t.Helper()
	return NewEnv(t, NewPool(t, 8)).Backend()
}

var _ storetest.NewBackend = NewBackend
