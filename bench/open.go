package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// Counter counts what goes to a server: statements and batches through
// pgx's tracer (which sees the pgx pool and, under database/sql, GORM's
// connections alike), and request/response turns on the socket, which is
// what a round trip is. It is idempgx's tests' counter.
type Counter = idempgxtest.Counter

// connConfig parses DSN() and, with c, installs the tracer and the
// counting dialer.
func connConfig(c *Counter) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		return nil, err
	}
	if c != nil {
		c.Count(cfg)
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

// OpenPostgresSQL opens database/sql on PostgreSQL (DSN()) through pgx's
// database/sql driver, with at most maxConns connections.
func OpenPostgresSQL(ctx context.Context, maxConns int) (*sql.DB, error) {
	cfg, err := connConfig(nil)
	if err != nil {
		return nil, err
	}
	return pingDB(ctx, stdlib.OpenDB(*cfg.ConnConfig), maxConns)
}

// DefaultMySQLDSN is the MariaDB the benchmarks use unless IDEM_MYSQL_DSN
// says otherwise: the DSN idemgorm's tests use. Only 127.0.0.1.
const DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"

// DefaultRedisAddr is the Redis the benchmarks use unless IDEM_REDIS_ADDR
// says otherwise.
const DefaultRedisAddr = "127.0.0.1:6379"

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

var mysqlNets atomic.Int64

// OpenMySQL opens database/sql on MariaDB (IDEM_MYSQL_DSN) with at most
// maxConns connections, their socket turns counted by c when c is not nil
// (through a dialer registered with go-sql-driver/mysql under a network
// name of its own).
func OpenMySQL(ctx context.Context, maxConns int, c *Counter) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(envOr("IDEM_MYSQL_DSN", DefaultMySQLDSN))
	if err != nil {
		return nil, err
	}
	if c != nil {
		cfg.Net = "idembench" + strconv.FormatInt(mysqlNets.Add(1), 10)
		mysql.RegisterDialContext(cfg.Net, func(ctx context.Context, addr string) (net.Conn, error) {
			return c.Dial(ctx, "tcp", addr)
		})
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return pingDB(ctx, sql.OpenDB(conn), maxConns)
}

// OpenSQLite opens database/sql on the SQLite file path with idemgorm's
// DSN (WAL, a busy timeout, IMMEDIATE transactions) and at most maxConns
// connections. With c, every statement, BEGIN, COMMIT and ROLLBACK the
// driver runs is counted in c.Queries: SQLite runs in the process, so
// statements are what a request costs it, not round trips.
func OpenSQLite(ctx context.Context, path string, maxConns int, c *Counter) (*sql.DB, error) {
	probe, err := sql.Open("sqlite", "")
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	_ = probe.Close()
	return pingDB(ctx, sql.OpenDB(sqliteConnector{drv, idemgorm.SQLiteDSN(path, 10*time.Second), c}), maxConns)
}

func pingDB(ctx context.Context, db *sql.DB, maxConns int) (*sql.DB, error) {
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// OpenRedis connects to IDEM_REDIS_ADDR with a pool of maxConns, its socket
// turns counted by c when c is not nil.
func OpenRedis(ctx context.Context, maxConns int, c *Counter) (*redis.Client, error) {
	return OpenRedisNamed(ctx, "", maxConns, c)
}

// OpenRedisNamed is OpenRedis with every connection named name (CLIENT
// SETNAME), so that CLIENT LIST tells this client's connections apart.
func OpenRedisNamed(ctx context.Context, name string, maxConns int, c *Counter) (*redis.Client, error) {
	opts := &redis.Options{Addr: envOr("IDEM_REDIS_ADDR", DefaultRedisAddr), PoolSize: maxConns, ClientName: name}
	if c != nil {
		opts.Dialer = c.Dial
	}
	rdb := redis.NewClient(opts)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// OpenGormOn opens GORM on db, a MariaDB or SQLite database/sql pool
// (dialect "mysql" or "sqlite"), with a silent logger.
func OpenGormOn(db *sql.DB, dialect string) (*gorm.DB, error) {
	var d gorm.Dialector = gormmysql.New(gormmysql.Config{Conn: db})
	if dialect == "sqlite" {
		d = &sqlite.Dialector{Conn: db}
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Discard})
}

type sqliteConnector struct {
	drv driver.Driver
	dsn string
	c   *Counter
}

func (k sqliteConnector) Driver() driver.Driver { return k.drv }

func (k sqliteConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := k.drv.Open(k.dsn)
	if err != nil || k.c == nil {
		return conn, err
	}
	cc, ok := conn.(countableConn)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("bench: the sqlite driver's connection lacks a context method")
	}
	return countedConn{cc, k.c}, nil
}

// countableConn is what the SQLite driver's connection implements.
type countableConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
}

type countedConn struct {
	countableConn
	c *Counter
}

func (cc countedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	cc.c.Queries.Add(1)
	return cc.countableConn.ExecContext(ctx, q, args)
}

func (cc countedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	cc.c.Queries.Add(1)
	return cc.countableConn.QueryContext(ctx, q, args)
}

func (cc countedConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	cc.c.Queries.Add(1)
	return cc.countableConn.PrepareContext(ctx, q)
}

func (cc countedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cc.c.Queries.Add(1)
	tx, err := cc.countableConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countedTx{tx, cc.c}, nil
}

type countedTx struct {
	driver.Tx
	c *Counter
}

func (t countedTx) Commit() error {
	t.c.Queries.Add(1)
	return t.Tx.Commit()
}

func (t countedTx) Rollback() error {
	t.c.Queries.Add(1)
	return t.Tx.Rollback()
}
