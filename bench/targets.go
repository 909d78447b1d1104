package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	idemredis "github.com/idemgo/idem/stores/redis"
)

// Databases are the names OpenTarget takes, PostgreSQL first.
var Databases = []string{"postgres", "mariadb", "sqlite", "redis"}

// Variant is one server on a Target: the library on the target's
// database, or the hand-written floor beside it.
type Variant struct {
	Name  string // benchstat's /variant: floor, pgx, gorm, redis
	Label string // for tables
	// First and Replay bound what TestRoundTrips accepts of the library's
	// variants on a first request and a replay: round trips, or on SQLite
	// statements. Zero leaves it unbounded (the floors).
	First, Replay int64
	// NoHold: a second request cannot be answered while a first one holds
	// its key (the SQLite floor: its claim waits for the writer), so
	// TestRoundTrips skips the 409 case.
	NoHold bool
	// Open starts the variant on a pool of conns connections counted by c
	// (nil: not counted) and returns its handler and what closes the pool.
	Open func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error)
}

// Target is one database with its variants and the tables they use.
type Target struct {
	Variants []Variant
	reset    func(context.Context) error
	close    func()
}

// Reset empties the target's tables (and keys), so each cell starts alike.
func (t *Target) Reset(ctx context.Context) error { return t.reset(ctx) }

// Close drops what the target created, where it can, and closes its
// connections.
func (t *Target) Close() { t.close() }

// OpenTarget creates the tables (or key prefixes) of db, one of Databases:
// on PostgreSQL the schema of Setup, elsewhere tables and prefixes named
// afresh for this target (idem_bench_<random>_…), so that tests and load
// runs beside each other never share a table.
func OpenTarget(ctx context.Context, db string) (*Target, error) {
	switch db {
	case "postgres":
		return openPostgres(ctx)
	case "mariadb":
		return openMariaDB(ctx)
	case "sqlite":
		return openSQLite(ctx)
	case "redis":
		return openRedis(ctx)
	}
	return nil, fmt.Errorf("unknown database %q (want one of %s)", db, strings.Join(Databases, ", "))
}

func openPostgres(ctx context.Context) (*Target, error) {
	admin, err := OpenPool(ctx, 2, nil)
	if err != nil {
		return nil, fmt.Errorf("postgresql (IDEM_PG_DSN, default %s): %w", DefaultDSN, err)
	}
	if err := Setup(ctx, admin); err != nil {
		admin.Close()
		return nil, err
	}
	return &Target{
		Variants: postgresVariants(),
		reset:    func(ctx context.Context) error { return Truncate(ctx, admin) },
		close:    admin.Close,
	}, nil
}

// postgresVariants are the floor, idempgx and idemgorm on the tables of
// Setup.
func postgresVariants() []Variant {
	openPool := func(ctx context.Context, conns int, c *Counter, h func(*pgxpool.Pool) (http.Handler, error)) (http.Handler, func(), error) {
		pool, err := OpenPool(ctx, int32(conns), c)
		if err != nil {
			return nil, nil, err
		}
		s, err := h(pool)
		return s, pool.Close, err
	}
	return []Variant{
		{Name: "floor", Label: "hand-written floor (pgx)", Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
			return openPool(ctx, conns, c, func(p *pgxpool.Pool) (http.Handler, error) { return &Floor{Pool: p}, nil })
		}},
		{Name: "pgx", Label: "idem + idempgx", First: 3, Replay: 1, Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
			return openPool(ctx, conns, c, func(p *pgxpool.Pool) (http.Handler, error) { return NewPgxServer(ctx, p) })
		}},
		{Name: "gorm", Label: "idem + idemgorm (PostgreSQL)", First: 4, Replay: 1, Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
			db, closeDB, err := OpenGorm(conns, c)
			if err != nil {
				return nil, nil, err
			}
			h, err := NewGormServer(ctx, db)
			return h, func() { _ = closeDB() }, err
		}},
	}
}

// sqlTables is a target's tables on a database/sql database: the floor's
// key table and a payment table per variant are created up front,
// idemgorm's key table by its Migrate.
type sqlTables struct {
	admin                               *sql.DB
	floorKeys, floorPayments, pay, keys string
	exists                              string // a query that finds table ? (a row) or not
	afterReset                          []string
}

func (s sqlTables) exec(ctx context.Context, stmts ...string) error {
	for _, q := range stmts {
		if _, err := s.admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%.40s…: %w", q, err)
		}
	}
	return nil
}

// each returns verb followed by each table of the target, idemgorm's last.
func (s sqlTables) each(verb string) []string {
	var out []string
	for _, t := range []string{s.floorKeys, s.floorPayments, s.pay, s.keys} {
		out = append(out, verb+t)
	}
	return out
}

// reset empties the tables; idemgorm's exists once its variant was opened.
func (s sqlTables) reset(ctx context.Context) error {
	stmts := s.each("DELETE FROM ")
	err := s.admin.QueryRowContext(ctx, s.exists, s.keys).Scan(new(int))
	if errors.Is(err, sql.ErrNoRows) {
		stmts = stmts[:3]
	} else if err != nil {
		return err
	}
	return s.exec(ctx, append(stmts, s.afterReset...)...)
}

// target opens the floor and idemgorm on a database/sql database: open
// opens a pool on it, upsert is the floor claim's do-nothing clause,
// writeMu queues the floor's writers (SQLite).
func (s sqlTables) target(dialect, label, upsert string, writeMu *sync.Mutex, closeFn func(),
	open func(ctx context.Context, conns int, c *Counter) (*sql.DB, error)) *Target {
	first, replay := int64(mysqlFirst), int64(mysqlReplay)
	if dialect == "sqlite" {
		first, replay = sqliteFirst, sqliteReplay
	}
	return &Target{
		Variants: []Variant{
			{Name: "floor", Label: "hand-written floor (" + label + ")", NoHold: writeMu != nil, Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
				db, err := open(ctx, conns, c)
				if err != nil {
					return nil, nil, err
				}
				return newSQLFloor(db, s.floorKeys, s.floorPayments, upsert, writeMu), func() { _ = db.Close() }, nil
			}},
			{Name: "gorm", Label: "idem + idemgorm (" + label + ")", First: first, Replay: replay, Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
				db, err := open(ctx, conns, c)
				if err != nil {
					return nil, nil, err
				}
				closeDB := func() { _ = db.Close() }
				g, err := OpenGormOn(db, dialect)
				if err != nil {
					closeDB()
					return nil, nil, err
				}
				h, err := newGormServer(ctx, g, s.keys, s.pay)
				return h, closeDB, err
			}},
		},
		reset: s.reset,
		close: closeFn,
	}
}

// The bounds of TestRoundTrips for idemgorm on MariaDB (round trips with
// the default DSN, where go-sql-driver/mysql prepares, executes and closes
// each statement with arguments but idemgorm's claim, which it keeps
// prepared: 6 and 1 with interpolateParams=true) and on SQLite
// (statements).
const (
	mysqlFirst, mysqlReplay   = 8, 1
	sqliteFirst, sqliteReplay = 7, 1
)

func openMariaDB(ctx context.Context) (*Target, error) {
	admin, err := OpenMySQL(ctx, 2, nil)
	if err != nil {
		return nil, fmt.Errorf("mariadb (IDEM_MYSQL_DSN, default %s): %w", DefaultMySQLDSN, err)
	}
	p := "idem_bench_" + RandHex(3) + "_"
	s := sqlTables{admin: admin, floorKeys: p + "floor_keys", floorPayments: p + "floor_payments", pay: p + "payments", keys: p + "keys",
		exists: "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?"}
	const payment = ` (id VARCHAR(64) PRIMARY KEY, account VARCHAR(64) NOT NULL, amount BIGINT NOT NULL,
		currency CHAR(3) NOT NULL, description TEXT NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`
	err = s.exec(ctx, `CREATE TABLE `+s.floorKeys+` (
			principal   VARBINARY(255) NOT NULL,
			idem_key    VARBINARY(255) NOT NULL,
			fingerprint VARBINARY(32)  NOT NULL,
			state       VARCHAR(16)    NOT NULL,
			lease_token CHAR(32)       NOT NULL,
			expires_at  BIGINT         NOT NULL,
			status      INT,
			location    TEXT,
			body        BLOB,
			PRIMARY KEY (principal, idem_key))`,
		`CREATE TABLE `+s.floorPayments+payment, `CREATE TABLE `+s.pay+payment)
	closeFn := func() {
		_ = s.exec(context.WithoutCancel(ctx), s.each("DROP TABLE IF EXISTS ")...)
		_ = admin.Close()
	}
	if err != nil {
		closeFn()
		return nil, err
	}
	return s.target("mysql", "MariaDB", "ON DUPLICATE KEY UPDATE idem_key = idem_key", nil, closeFn,
		func(ctx context.Context, conns int, c *Counter) (*sql.DB, error) { return OpenMySQL(ctx, conns, c) }), nil
}

func openSQLite(ctx context.Context) (*Target, error) {
	dir, err := os.MkdirTemp("", "idem-bench-sqlite-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "bench.db")
	admin, err := OpenSQLite(ctx, path, 1, nil)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := sqlTables{admin: admin, floorKeys: "floor_keys", floorPayments: "floor_payments", pay: "payments", keys: "idem_keys",
		exists: "SELECT 1 FROM sqlite_master WHERE name = ?", afterReset: []string{"PRAGMA wal_checkpoint(TRUNCATE)"}}
	const payment = ` (id TEXT PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL,
		description TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP) STRICT`
	closeFn := func() {
		_ = admin.Close()
		_ = os.RemoveAll(dir)
	}
	err = s.exec(ctx, `CREATE TABLE `+s.floorKeys+` (
			principal   TEXT    NOT NULL,
			idem_key    TEXT    NOT NULL,
			fingerprint BLOB    NOT NULL,
			state       TEXT    NOT NULL,
			lease_token TEXT    NOT NULL,
			expires_at  INTEGER NOT NULL,
			status      INTEGER,
			location    TEXT,
			body        BLOB,
			PRIMARY KEY (principal, idem_key)) STRICT`,
		`CREATE TABLE `+s.floorPayments+payment, `CREATE TABLE `+s.pay+payment)
	if err != nil {
		closeFn()
		return nil, err
	}
	return s.target("sqlite", "SQLite", "ON CONFLICT (principal, idem_key) DO NOTHING", &sync.Mutex{}, closeFn,
		func(ctx context.Context, conns int, c *Counter) (*sql.DB, error) {
			return OpenSQLite(ctx, path, conns, c)
		}), nil
}

func openRedis(ctx context.Context) (*Target, error) {
	admin, err := OpenPool(ctx, 2, nil)
	if err != nil {
		return nil, fmt.Errorf("postgresql for the payments (IDEM_PG_DSN, default %s): %w", DefaultDSN, err)
	}
	rdb, err := OpenRedis(ctx, 2, nil)
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("redis (IDEM_REDIS_ADDR, default %s): %w", DefaultRedisAddr, err)
	}
	p := "idem_bench_" + RandHex(3)
	floorPay, pay, prefix := "public."+p+"_redis_floor_payments", "public."+p+"_redis_payments", p+":"
	tables := floorPay + ", " + pay
	deleteKeys := func(ctx context.Context) error {
		var cursor uint64
		for range 100_000 { // at most 100 million keys
			keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		return errors.New("redis: too many keys to delete")
	}
	closeFn := func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = admin.Exec(ctx, "DROP TABLE IF EXISTS "+tables)
		_ = deleteKeys(ctx)
		admin.Close()
		_ = rdb.Close()
	}
	for _, t := range []string{floorPay, pay} {
		if _, err := admin.Exec(ctx, `CREATE TABLE `+t+` (id text PRIMARY KEY, downstream_key text NOT NULL UNIQUE,
			account text NOT NULL, amount bigint NOT NULL, currency text NOT NULL, description text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			closeFn()
			return nil, err
		}
	}
	// open gives a variant its Redis client and its PostgreSQL pool.
	open := func(ctx context.Context, conns int, c *Counter, h func(*redis.Client, *pgxpool.Pool) (http.Handler, error)) (http.Handler, func(), error) {
		r, err := OpenRedis(ctx, conns, c)
		if err != nil {
			return nil, nil, err
		}
		pg, err := OpenPool(ctx, int32(conns), c)
		if err != nil {
			_ = r.Close()
			return nil, nil, err
		}
		s, err := h(r, pg)
		return s, func() { _ = r.Close(); pg.Close() }, err
	}
	return &Target{
		Variants: []Variant{
			{Name: "floor", Label: "hand-written floor (Redis)", Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
				return open(ctx, conns, c, func(r *redis.Client, pg *pgxpool.Pool) (http.Handler, error) {
					return &redisFloor{rdb: r, pg: pg, prefix: prefix + "floor:", payments: floorPay}, nil
				})
			}},
			{Name: "redis", Label: "idem + idemredis", First: redisFirst, Replay: redisReplay, Open: func(ctx context.Context, conns int, c *Counter) (http.Handler, func(), error) {
				return open(ctx, conns, c, func(r *redis.Client, pg *pgxpool.Pool) (http.Handler, error) {
					return newRedisServer(ctx, r, pg, prefix+"idem:", pay)
				})
			}},
		},
		reset: func(ctx context.Context) error {
			if _, err := admin.Exec(ctx, "TRUNCATE "+tables); err != nil {
				return err
			}
			return deleteKeys(ctx)
		},
		close: closeFn,
	}, nil
}

// The bounds of TestRoundTrips for idemredis: round trips to Redis and to
// the payment's PostgreSQL (claim, CheckLease, the payment, settle).
const redisFirst, redisReplay = 4, 1

// newRedisServer is idemhttp + idemredis in front of the payment handler,
// whose payment goes to PostgreSQL under the request's downstream key after
// a check of the lease, as stores/redis/README.md tells a handler to.
func newRedisServer(ctx context.Context, rdb *redis.Client, pg *pgxpool.Pool, prefix, payments string) (http.Handler, error) {
	store, err := idemredis.New(rdb, idemredis.WithPrefix(prefix))
	if err != nil {
		return nil, err
	}
	return newServer(ctx, store, func(ctx context.Context, id, account string, p PaymentRequest) error {
		h, ok := idemredis.Tx(ctx)
		if !ok {
			return errors.New("no idempotency record")
		}
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return err
		}
		if err := h.CheckLease(ctx); err != nil {
			return err
		}
		return insertKeyedPayment(ctx, pg, payments, dk, id, account, p)
	})
}
