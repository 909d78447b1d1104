package bench

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Counter counts what goes to PostgreSQL twice: statements and batches
// through pgx's tracer (which sees the pgx pool and, under database/sql,
// GORM's connections alike), and request/response turns on the socket (a
// write that follows a read, or the first write), which is what a round
// trip is.
type Counter struct {
	Queries, Batches, Turns atomic.Int64
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.Queries.Add(1)
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
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Traced is statements sent as queries plus batches.
func (c *Counter) Traced() int64 { return c.Queries.Load() + c.Batches.Load() }

// Reset zeroes every count.
func (c *Counter) Reset() {
	c.Queries.Store(0)
	c.Batches.Store(0)
	c.Turns.Store(0)
}

type countingConn struct {
	net.Conn
	c        *Counter
	mu       sync.Mutex
	lastRead bool
	wrote    bool
}

func (cc *countingConn) Write(p []byte) (int, error) {
	cc.mu.Lock()
	if !cc.wrote || cc.lastRead {
		cc.c.Turns.Add(1)
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

// connConfig parses DSN() and, with c, installs the tracer and the
// counting dialer.
func connConfig(c *Counter) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		return nil, err
	}
	if c != nil {
		cfg.ConnConfig.Tracer = c
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
	return cfg, nil
}

// OpenPool opens a pgx pool of at most maxConns connections, counted by c
// when c is not nil.
func OpenPool(ctx context.Context, maxConns int32, c *Counter) (*pgxpool.Pool, error) {
	cfg, err := connConfig(c)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// OpenGorm opens GORM on PostgreSQL through pgx's database/sql driver (what
// gorm.io/driver/postgres uses by default), with at most maxConns
// connections, counted by c when c is not nil. The logger is silent.
func OpenGorm(maxConns int, c *Counter) (*gorm.DB, func() error, error) {
	cfg, err := connConfig(c)
	if err != nil {
		return nil, nil, err
	}
	sqlDB := stdlib.OpenDB(*cfg.ConnConfig)
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, err
	}
	return db, sqlDB.Close, nil
}
