// Package idemsqltest makes idemsql stores for the conformance suites
// (core/storetest, core/adaptertest): NewBackend(setup) is a
// storetest.NewBackend whose every Backend is a fresh store table plus a
// business table, on PostgreSQL through pgx's stdlib driver or lib/pq
// (IDEM_PG_DSN), MySQL/MariaDB (IDEM_MYSQL_DSN) or a fresh SQLite file.
// An unreachable server fails the test with t.Fatal; it never skips, so a
// store that was never tested cannot look green. Effects is the business
// table on its own, for layers on idemsql (idemgorm) that hand the handler
// another handle.
//
// Importing the package links the four drivers and silences the MySQL
// driver's logger: PoisonTx kills MySQL connections on purpose, and the
// driver would print a line for each.
package idemsqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // database/sql driver "sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"            // database/sql driver "postgres"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/core/storetest/faultproxy"
	idemsql "github.com/idemgo/idem/stores/sql"
)

// Setups are the driver set-ups OpenDB, NewFixture and NewBackend accept:
// PostgreSQL through pgx's stdlib ("pgx") and lib/pq ("pq"), MariaDB
// through go-sql-driver/mysql ("mysql"), SQLite through glebarez/go-sqlite
// ("sqlite").
var Setups = []string{"pgx", "pq", "mysql", "sqlite"}

// Dialect returns the store dialect of setup: "postgres", "mysql" or
// "sqlite".
func Dialect(setup string) string {
	switch setup {
	case "pgx", "pq", "postgres":
		return "postgres"
	}
	return setup
}

// PostgresDSN returns IDEM_PG_DSN, or the local test database.
func PostgresDSN() string {
	if dsn := os.Getenv("IDEM_PG_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
}

// MySQLDSN returns IDEM_MYSQL_DSN, or the local test database.
func MySQLDSN() string {
	if dsn := os.Getenv("IDEM_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"
}

func init() {
	// The poisoning tests kill connections on purpose; keep the driver's
	// "invalid connection" lines out of the test output.
	_ = mysqldriver.SetLogger(log.New(io.Discard, "", 0))
}

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*sql.DB{}
)

// OpenDB returns the test process's *sql.DB for a server set-up, opened
// once (at most 40 connections); SQLite gets a fresh file per test.
func OpenDB(t testing.TB, setup string) *sql.DB { return OpenDSN(t, setup, "") }

// OpenDSN is OpenDB with dsn instead of the set-up's DSN (servers only;
// "" for the default). Each server DSN is opened once per process.
func OpenDSN(t testing.TB, setup, dsn string) *sql.DB {
	t.Helper()
	if setup == "sqlite" {
		path := filepath.Join(t.TempDir(), "idem.db")
		// foreign_keys on: the effects table's deferred foreign key is
		// how PoisonTx makes a SQLite commit fail.
		db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path, 0)+"&_pragma=foreign_keys(1)")
		if err != nil {
			t.Fatalf("open sqlite %s: %v", path, err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	driver := map[string]string{"pgx": "pgx", "pq": "postgres", "mysql": "mysql"}[setup]
	if driver == "" {
		t.Fatalf("unknown set-up %q", setup)
	}
	if dsn == "" {
		dsn = PostgresDSN()
		if setup == "mysql" {
			dsn = MySQLDSN()
		}
	}
	key := setup + "|" + dsn
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if db, ok := sharedDBs[key]; ok {
		return db
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", setup, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("%s server unreachable (set IDEM_PG_DSN / IDEM_MYSQL_DSN): %v", setup, err)
	}
	db.SetMaxOpenConns(40)
	// database/sql's default of 2 idle connections would open a
	// connection per claim under the suite's concurrency.
	db.SetMaxIdleConns(40)
	sharedDBs[key] = db
	return db
}

// RandSuffix returns 10 random hex digits, for names no other test uses.
func RandSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Effects is the business table of a test: one row per committed write,
// made through the handle the store gave the handler (Exec).
type Effects struct {
	// DB is the database the table is in (the primary).
	DB *sql.DB
	// Dialect is "postgres", "mysql" or "sqlite".
	Dialect string
	// Table is the table's name.
	Table string
	// Exec runs sql through the handle of the idempotency transaction
	// ctx carries, as a handler would.
	Exec func(ctx context.Context, sql string, args ...any) error
}

// CreateEffects creates the business table name (and, on MySQL, the rows
// EndTxAround deadlocks on; on SQLite, the parent PoisonTx breaks) and
// drops them in cleanup (SQLite's file goes with t.TempDir).
func CreateEffects(t testing.TB, db *sql.DB, dialect, name string) {
	t.Helper()
	var ddl []string
	switch dialect {
	case "postgres":
		ddl = []string{"CREATE TABLE " + name + " (id text NOT NULL)"}
	case "mysql":
		ddl = []string{"CREATE TABLE " + name + " (id VARCHAR(255) NOT NULL, KEY (id)) ENGINE=InnoDB",
			"CREATE TABLE " + name + "_locks (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
			"INSERT INTO " + name + "_locks VALUES (1, 0), (2, 0)"}
	case "sqlite":
		ddl = []string{
			"CREATE TABLE " + name + "_parent (id INTEGER PRIMARY KEY)",
			"CREATE TABLE " + name + " (id TEXT NOT NULL, parent INTEGER REFERENCES " + name +
				"_parent(id) DEFERRABLE INITIALLY DEFERRED)",
		}
	}
	for _, q := range ddl {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if dialect == "sqlite" {
			return
		}
		for _, tbl := range []string{name, name + "_locks"} {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + tbl); err != nil {
				t.Errorf("drop %s: %v", tbl, err)
			}
		}
	})
}

// WriteEffect inserts one business row for id through the idempotency
// transaction ctx carries, as a handler would.
func (e *Effects) WriteEffect(ctx context.Context, id string) error {
	return e.Exec(ctx, "INSERT INTO "+e.Table+" (id) VALUES ("+e.param(1)+")", id)
}

// param is the dialect's n-th bind parameter.
func (e *Effects) param(n int) string {
	if e.Dialect == "postgres" {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// CountEffects returns the number of committed business rows for id.
func (e *Effects) CountEffects(ctx context.Context, id string) (int, error) {
	var n int
	err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table+" WHERE id = "+e.param(1), id).Scan(&n)
	return n, err
}

// PoisonTx makes the transaction in ctx unable to commit, each dialect
// in the way it really happens:
//   - PostgreSQL: a failing statement aborts the transaction;
//   - MySQL: the connection dies under the transaction (it kills
//     itself) and the server rolls the transaction back;
//   - SQLite: a row that breaks a deferred foreign key, so COMMIT itself
//     fails (and SQLite leaves the transaction open).
func (e *Effects) PoisonTx(ctx context.Context) error {
	switch e.Dialect {
	case "postgres":
		if err := e.Exec(ctx, "SELECT 1/0"); err == nil {
			return errors.New("SELECT 1/0 succeeded")
		}
	case "mysql":
		_ = e.Exec(ctx, "KILL CONNECTION_ID()")
	case "sqlite":
		if err := e.Exec(ctx, "INSERT INTO "+e.Table+" (id, parent) VALUES ('poison', 424242)"); err != nil {
			return fmt.Errorf("insert the deferred violation: %w", err)
		}
	}
	return nil
}

// Fill sets b's fields that the business table and the handle provide:
// WriteEffect, CountEffects, PoisonTx, SingleWriter, Dialect, Exec,
// EndTxAround, and Syncer (on PostgreSQL the store's transaction is an
// idemstore.Syncer).
func (e *Effects) Fill(b *storetest.Backend) {
	b.WriteEffect, b.CountEffects, b.PoisonTx = e.WriteEffect, e.CountEffects, e.PoisonTx
	// SQLite has one writer: the suite must not hold a write open while
	// it expects another write to go through.
	b.SingleWriter = e.Dialect == "sqlite"
	if b.SingleWriter {
		// Its one writer serialises every round of the race cases: under
		// -race on a loaded two-core machine a round takes about a
		// second, and 200 of them missed the cases' two minutes.
		b.Rounds = 100
	}
	b.Dialect, b.Exec = e.Dialect, e.Exec
	b.Syncer = e.Dialect == "postgres"
	switch e.Dialect {
	case "mysql":
		b.EndTxAround = e.deadlock
	case "sqlite":
		b.EndTxAround = e.interrupt
	default:
		// PostgreSQL on database/sql has no route around the handle that
		// ends the transaction and lets anything run after it: the
		// handle filters COMMIT, ROLLBACK, END, ABORT, PREPARE
		// TRANSACTION and BEGIN, and never hands out the connection;
		// PostgreSQL refuses COMMIT inside DO and CALL within a
		// transaction block; a backend that dies (pg_terminate_backend)
		// rolls everything back and leaves a dead connection, on which
		// nothing more runs — a failed statement, which the
		// failing-statement cases cover.
		b.EndTxAround = nil
	}
}

// deadlock ends the MySQL transaction ctx carries by a real deadlock that
// InnoDB resolves by rolling it back: the handler's transaction locks row
// 1, a heavier helper transaction (it has modified more rows, so InnoDB
// picks the handler as the victim) locks row 2 and waits for row 1, and the
// handler asks for row 2.
func (e *Effects) deadlock(ctx context.Context) error {
	locks := e.Table + "_locks"
	if err := e.Exec(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 1"); err != nil {
		return fmt.Errorf("lock row 1: %w", err)
	}
	other, err := e.DB.BeginTx(context.Background(), nil)
	if err != nil {
		return err
	}
	defer func() { _ = other.Rollback() }()
	for i := range 50 {
		if _, err := other.Exec("INSERT INTO "+e.Table+" (id) VALUES (?)", fmt.Sprintf("heavy-%d", i)); err != nil {
			return err
		}
	}
	if _, err := other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 2"); err != nil {
		return err
	}
	otherDone := make(chan error, 1)
	go func() {
		_, err := other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 1")
		otherDone <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it wait for row 1
	err = e.Exec(ctx, "UPDATE "+locks+" SET v = v + 1 WHERE id = 2")
	if oerr := <-otherDone; oerr != nil {
		return fmt.Errorf("the helper transaction: %w", oerr)
	}
	var my *mysqldriver.MySQLError
	if !errors.As(err, &my) || my.Number != 1213 {
		return fmt.Errorf("the handler's UPDATE answered %v, want the deadlock victim's 1213", err)
	}
	return nil
}

// interrupt ends the SQLite transaction ctx carries the way SQLite does
// by itself: a write in it is interrupted (the driver interrupts on a
// cancelled context), and SQLite rolls the whole transaction back.
func (e *Effects) interrupt(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := e.Exec(qctx, `INSERT INTO `+e.Table+` (id)
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000)
		SELECT 'bulk' FROM n`)
	if err == nil {
		return errors.New("the long INSERT was not interrupted")
	}
	return nil
}

// Fixture is a fresh store on a fresh table, plus a business table.
type Fixture struct {
	// DB is the set-up's *sql.DB (shared by the process for the servers,
	// one per test for SQLite).
	DB *sql.DB
	// Store is the store on its own table, migrated.
	Store *idemsql.Store
	// Setup is the driver set-up ("pgx", "pq", "mysql", "sqlite").
	Setup string
	// Effects is the business table, written through idemsql.Tx.
	Effects Effects

	table string // the store's table, unquoted
}

// NewFixture creates a store on a fresh table of setup's database (opts
// follow the table option) and its business table, and drops both in
// cleanup.
func NewFixture(t testing.TB, setup string, opts ...idemsql.Option) *Fixture {
	t.Helper()
	return NewFixtureOn(t, OpenDB(t, setup), setup, opts...)
}

// NewFixtureOn is NewFixture on a *sql.DB of the caller's.
func NewFixtureOn(t testing.TB, db *sql.DB, setup string, opts ...idemsql.Option) *Fixture {
	t.Helper()
	table := "idem_test_" + RandSuffix()
	store, err := idemsql.New(db, append([]idemsql.Option{idemsql.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	dialect := Dialect(setup)
	if store.Dialect() != dialect {
		t.Fatalf("store detected dialect %q on a %s *sql.DB", store.Dialect(), setup)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dialect != "sqlite" {
		t.Cleanup(func() {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		})
	}
	f := &Fixture{DB: db, Store: store, Setup: setup, table: table,
		Effects: Effects{DB: db, Dialect: dialect, Table: table + "_effects", Exec: Exec}}
	CreateEffects(t, db, dialect, f.Effects.Table)
	return f
}

// Exec runs sql through the idempotency transaction ctx carries, as a
// handler would (storetest.Backend.Exec).
func Exec(ctx context.Context, query string, args ...any) error {
	tx, ok := idemsql.Tx(ctx)
	if !ok {
		return errors.New("no idemsql transaction in context")
	}
	_, err := tx.ExecContext(ctx, query, args...)
	return err
}

// Backend returns the suites' view of f: the business table's fields
// (Effects.Fill) and what the server lets the suite do from outside: a
// store on a missing table; on the servers, a held record, a store whose
// lock waits are bounded and one on a port where nothing listens; on
// PostgreSQL, sessions without synchronous_commit and the row versions
// as a write count.
func (f *Fixture) Backend() storetest.Backend {
	b := storetest.Backend{Store: f.Store}
	f.Effects.Fill(&b)
	b.Misconfigured = func(t testing.TB) idemstore.Store { return storeOn(t, f.DB, "idem_missing_"+RandSuffix()) }
	if f.Effects.Dialect == "sqlite" {
		return b // one writer: a held record would block every other call
	}
	b.HoldRecord = f.holdRecord
	b.LockBounded = func(t testing.TB, bound time.Duration) idemstore.Store {
		return storeOn(t, f.DB, f.table, idemsql.WithLockTimeout(bound))
	}
	b.Unreachable = f.unreachable
	if f.Effects.Dialect == "postgres" {
		b.CountWrites = func(t testing.TB) (storetest.Backend, func() int64) {
			g := NewFixture(t, f.Setup)
			return g.Backend(), rowWrites(t, g.DB, g.table)
		}
		b.Durability = f.durability
		b.DurabilitySetting = f.durabilitySetting
	}
	return b
}

// unreachable is a store whose server goes away after New, which asks
// it for its dialect: its connections run through a proxy that is closed
// before the store is returned.
func (f *Fixture) unreachable(t testing.TB) idemstore.Store {
	t.Helper()
	var (
		addr, dsn string
		pg        *pgx.ConnConfig
		my        *mysqldriver.Config
		err       error
	)
	if f.Effects.Dialect == "mysql" {
		if my, err = mysqldriver.ParseDSN(MySQLDSN()); err == nil {
			addr = my.Addr
		}
	} else if pg, err = pgx.ParseConfig(PostgresDSN()); err == nil {
		addr = net.JoinHostPort(pg.Host, strconv.Itoa(int(pg.Port)))
	}
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(proxy.Addr())
	switch f.Setup {
	case "mysql":
		my.Addr = proxy.Addr()
		dsn = my.FormatDSN()
	default:
		dsn = fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable connect_timeout=2", host, port, pg.User, pg.Database)
		if pg.Password != "" {
			dsn += " password=" + pg.Password
		}
	}
	db, err := sql.Open(map[string]string{"pgx": "pgx", "pq": "postgres", "mysql": "mysql"}[f.Setup], dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s := storeOn(t, db, "idem_unreachable")
	if err := proxy.Close(); err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0) // the connection New used goes with the proxy
	return s
}

// openPrivate opens a *sql.DB of its own for setup (a server set-up, not
// sqlite), closed when the test ends: for a test that sizes or configures
// its pool, which OpenDB's shared one must never be.
func openPrivate(t testing.TB, setup string) *sql.DB {
	t.Helper()
	dsn := PostgresDSN()
	if setup == "mysql" {
		dsn = MySQLDSN()
	}
	db, err := sql.Open(map[string]string{"pgx": "pgx", "pq": "postgres", "mysql": "mysql"}[setup], dsn)
	if err != nil {
		t.Fatalf("open %s: %v", setup, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// storeOn is a store on db and table, not migrated.
func storeOn(t testing.TB, db *sql.DB, table string, opts ...idemsql.Option) *idemsql.Store {
	t.Helper()
	s, err := idemsql.New(db, append([]idemsql.Option{idemsql.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holdRecord locks the store's row for principal's key in a transaction
// of its own, as a settle that has run its UPDATE and not yet committed
// holds it (storetest.Backend.HoldRecord).
func (f *Fixture) holdRecord(t testing.TB, principal, key string) func() {
	t.Helper()
	// Bounded: a pool with no connection left (a handler holding the
	// last one) fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := f.DB.Conn(ctx)
	cancel()
	if err != nil {
		t.Fatalf("hold the record: no connection: %v", err)
	}
	other, err := conn.BeginTx(context.Background(), nil)
	if err != nil {
		_ = conn.Close()
		t.Fatalf("hold the record: begin: %v", err)
	}
	q := "UPDATE " + f.table + ` SET state = state WHERE principal = $1 AND "key" = $2`
	if f.Effects.Dialect == "mysql" {
		q = "UPDATE " + f.table + " SET state = state WHERE principal = ? AND `key` = ?"
	}
	res, err := other.Exec(q, principal, key)
	if err != nil {
		_ = other.Rollback()
		_ = conn.Close()
		t.Fatalf("hold the record: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 && f.Effects.Dialect != "mysql" { // MySQL counts changed rows only
		_ = other.Rollback()
		_ = conn.Close()
		t.Fatalf("hold the record: %d rows", n)
	}
	var once sync.Once
	end := func() { once.Do(func() { _ = other.Rollback(); _ = conn.Close() }) }
	t.Cleanup(end)
	return end
}

// durability is storetest.Backend.Durability on PostgreSQL: a fixture
// whose sessions start with synchronous_commit off (through pgx's stdlib,
// whatever the set-up), and the WAL positions, read on f's database.
func (f *Fixture) durability(t testing.TB) (storetest.Backend, func() func() bool) {
	cfg, err := pgx.ParseConfig(PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["synchronous_commit"] = "off"
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	g := NewFixtureOn(t, db, "pgx")
	return g.Backend(), func() func() bool {
		var pos string
		if err := f.DB.QueryRow("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").Scan(&pos); err != nil {
			t.Fatal(err)
		}
		return func() bool {
			var past bool
			if err := f.DB.QueryRow("SELECT pg_catalog.pg_current_wal_flush_lsn() > $1::pg_lsn", pos).Scan(&past); err != nil {
				t.Fatal(err)
			}
			return past
		}
	}
}

// durabilitySetting is storetest.Backend.DurabilitySetting on PostgreSQL:
// a fixture on one connection, and its synchronous_commit.
func (f *Fixture) durabilitySetting(t testing.TB) (storetest.Backend, func(context.Context) string) {
	db := openPrivate(t, f.Setup)
	db.SetMaxOpenConns(1)
	g := NewFixtureOn(t, db, f.Setup)
	return g.Backend(), func(ctx context.Context) string {
		var v string
		var err error
		if h, ok := idemsql.Tx(ctx); ok {
			err = h.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&v)
		} else {
			err = db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&v)
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// rowWrites counts the writes to a PostgreSQL table no other store uses
// by its rows' versions (storetest.VersionCount).
func rowWrites(t testing.TB, db *sql.DB, table string) func() int64 {
	return storetest.VersionCount(t, func() (map[string]string, error) {
		rows, err := db.Query(`SELECT principal || '/' || "key", xmin::text || '/' || xmax::text || '/' || ctid::text FROM ` + table)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		versions := map[string]string{}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				return nil, err
			}
			versions[k] = v
		}
		return versions, rows.Err()
	})
}

// NewBackend returns the storetest.NewBackend of setup (see Setups): each
// call makes a NewFixture and returns its Backend.
func NewBackend(setup string) storetest.NewBackend {
	return func(t testing.TB) storetest.Backend {
		t.Helper()
		return NewFixture(t, setup).Backend()
	}
}
