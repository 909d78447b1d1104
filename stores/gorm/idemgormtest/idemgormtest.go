// Package idemgormtest makes idemgorm stores for the conformance suites
// (core/storetest, core/adaptertest): NewBackend(dialect) is a
// storetest.NewBackend whose every Backend is a fresh store table plus a
// business table, on PostgreSQL (IDEM_PG_DSN), MySQL/MariaDB
// (IDEM_MYSQL_DSN) or a fresh SQLite file. An unreachable server fails the
// test with t.Fatal; it never skips, so a store that was never tested
// cannot look green. The store's own tests and the conformance module
// share it; it imports only core, idemgorm, GORM and its drivers.
//
// Importing the package silences the MySQL driver's logger: PoisonTx kills
// MySQL connections on purpose, and the driver would print a line for each.
package idemgormtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"
)

// Dialects are the dialects NewBackend and NewFixture accept.
var Dialects = []string{"postgres", "mysql", "sqlite"}

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

// GormConfig returns a fresh config for each gorm.Open: Open keeps the
// *gorm.Config it is given and writes the dialector into it, so a shared
// one would end up naming the last dialect opened.
func GormConfig() *gorm.Config {
	return &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true}
}

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*gorm.DB{}
)

// Variant chooses how OpenDBVariant opens a dialect's database.
type Variant struct {
	// PrepareStmt opens the *gorm.DB with gorm.Config.PrepareStmt, so that
	// GORM wraps its pool in *gorm.PreparedStmtDB.
	PrepareStmt bool
	// DSN replaces the dialect's DSN (servers only).
	DSN string
}

// OpenDB returns the test process's *gorm.DB for a server dialect, opened
// once (at most 40 connections); SQLite gets a fresh file per test.
func OpenDB(t testing.TB, dialect string) *gorm.DB { return OpenDBVariant(t, dialect, Variant{}) }

// OpenDBVariant is OpenDB with a Variant; each server variant is opened
// once per process.
func OpenDBVariant(t testing.TB, dialect string, v Variant) *gorm.DB {
	t.Helper()
	cfg := GormConfig()
	cfg.PrepareStmt = v.PrepareStmt
	if dialect == "sqlite" {
		path := filepath.Join(t.TempDir(), "idem.db")
		// foreign_keys on: the effects table's deferred foreign key is
		// how PoisonTx makes a SQLite commit fail.
		db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(path, 0)+"&_pragma=foreign_keys(1)"), cfg)
		if err != nil {
			t.Fatalf("open sqlite %s: %v", path, err)
		}
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sqlDB.Close() })
		return db
	}
	key := fmt.Sprintf("%s|%v|%s", dialect, v.PrepareStmt, v.DSN)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if db, ok := sharedDBs[key]; ok {
		return db
	}
	var dial gorm.Dialector
	switch dialect {
	case "postgres":
		dsn := PostgresDSN()
		if v.DSN != "" {
			dsn = v.DSN
		}
		dial = postgres.Open(dsn)
	case "mysql":
		dsn := MySQLDSN()
		if v.DSN != "" {
			dsn = v.DSN
		}
		dial = mysql.Open(dsn)
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	db, err := gorm.Open(dial, cfg)
	if err != nil {
		t.Fatalf("%s server unreachable (set IDEM_PG_DSN / IDEM_MYSQL_DSN): %v", dialect, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(ctx); err != nil {
		t.Fatalf("%s server unreachable (set IDEM_PG_DSN / IDEM_MYSQL_DSN): %v", dialect, err)
	}
	sqlDB.SetMaxOpenConns(40)
	sqlDB.SetMaxIdleConns(40)
	sharedDBs[key] = db
	return db
}

// OpenResolverDB opens dialect's database (PrepareStmt as asked) with
// gorm.io/plugin/dbresolver configured so that reads go to a "replica"
// that is another database (PostgreSQL), a user who may read only
// another database (MySQL) or another file (SQLite), without the store's
// tables: a read that goes to the replica fails, where a real replica
// would answer late. Each call opens its own pools.
func OpenResolverDB(t testing.TB, dialect string, prepare bool) *gorm.DB {
	t.Helper()
	cfg := GormConfig()
	cfg.PrepareStmt = prepare
	var primary, replica gorm.Dialector
	switch dialect {
	case "postgres":
		admin := OpenDB(t, "postgres")
		if err := admin.Exec("CREATE DATABASE idem_replica").Error; err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("create the replica database: %v", err)
		}
		primary = postgres.Open(PostgresDSN())
		replica = postgres.Open(strings.Replace(PostgresDSN(), "dbname=test", "dbname=idem_replica", 1))
	case "mysql":
		// The same server: the replica is a database user who may read
		// only another database, since the store names its table with
		// the primary's database.
		admin := OpenDB(t, "mysql")
		for _, q := range []string{
			"CREATE DATABASE IF NOT EXISTS idem_replica",
			"CREATE USER IF NOT EXISTS 'idem_replica'@'%'", "CREATE USER IF NOT EXISTS 'idem_replica'@'localhost'",
			"GRANT SELECT ON idem_replica.* TO 'idem_replica'@'%'", "GRANT SELECT ON idem_replica.* TO 'idem_replica'@'localhost'",
		} {
			if err := admin.Exec(q).Error; err != nil {
				t.Fatalf("set up the replica: %s: %v", q, err)
			}
		}
		mc, err := mysqldriver.ParseDSN(MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		primary = mysql.Open(mc.FormatDSN())
		mc.DBName, mc.User, mc.Passwd = "idem_replica", "idem_replica", ""
		replica = mysql.Open(mc.FormatDSN())
	case "sqlite":
		dir := t.TempDir()
		primary = sqlite.Open(idemgorm.SQLiteDSN(filepath.Join(dir, "primary.db"), 0) + "&_pragma=foreign_keys(1)")
		replica = sqlite.Open(idemgorm.SQLiteDSN(filepath.Join(dir, "replica.db"), 0))
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	db, err := gorm.Open(primary, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", dialect, err)
	}
	if err := db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{replica}})); err != nil {
		t.Fatalf("dbresolver: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(40)
	sqlDB.SetMaxIdleConns(40) // as OpenDB: database/sql's default of 2 would open a connection per claim under the suite's concurrency
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// RandSuffix returns 10 random hex digits, for names no other test uses.
func RandSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Fixture is a fresh store on a fresh table, plus a business table.
type Fixture struct {
	// DB is the *gorm.DB of the dialect (shared by the process for the
	// servers, one per test for SQLite).
	DB *gorm.DB
	// Store is the store on its own table, migrated.
	Store *idemgorm.Store
	// Dialect is "postgres", "mysql" or "sqlite".
	Dialect string
	// Effects is the business table: one row per committed write.
	Effects string
}

// NewFixture creates a store on a fresh table of dialect's database
// (opts follow the table option) and its business table, and drops both
// in cleanup (SQLite's file goes with t.TempDir).
func NewFixture(t testing.TB, dialect string, opts ...idemgorm.Option) *Fixture {
	t.Helper()
	return NewFixtureOn(t, OpenDB(t, dialect), dialect, opts...)
}

// NewFixtureOn is NewFixture on a *gorm.DB of the caller's (a Variant, a
// dbresolver set-up).
func NewFixtureOn(t testing.TB, db *gorm.DB, dialect string, opts ...idemgorm.Option) *Fixture {
	t.Helper()
	table := "idem_test_" + RandSuffix()
	store, err := idemgorm.New(db, append([]idemgorm.Option{idemgorm.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if store.Dialect() != dialect {
		t.Fatalf("store detected dialect %q on a %s *gorm.DB", store.Dialect(), dialect)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := &Fixture{DB: db, Store: store, Dialect: dialect, Effects: table + "_effects"}
	var ddl []string
	switch dialect {
	case "postgres":
		ddl = []string{"CREATE TABLE " + f.Effects + " (id text NOT NULL)"}
	case "mysql":
		ddl = []string{"CREATE TABLE " + f.Effects + " (id VARCHAR(255) NOT NULL, KEY (id)) ENGINE=InnoDB",
			// The rows EndTxAround deadlocks on.
			"CREATE TABLE " + f.Effects + "_locks (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
			"INSERT INTO " + f.Effects + "_locks VALUES (1, 0), (2, 0)"}
	case "sqlite":
		ddl = []string{
			"CREATE TABLE " + f.Effects + "_parent (id INTEGER PRIMARY KEY)",
			"CREATE TABLE " + f.Effects + " (id TEXT NOT NULL, parent INTEGER REFERENCES " + f.Effects +
				"_parent(id) DEFERRABLE INITIALLY DEFERRED)",
		}
	}
	for _, q := range ddl {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if dialect == "sqlite" {
			return // the file goes with t.TempDir
		}
		for _, tbl := range []string{f.Effects, f.Effects + "_locks", table} {
			if err := db.Exec("DROP TABLE IF EXISTS " + tbl).Error; err != nil {
				t.Errorf("drop %s: %v", tbl, err)
			}
		}
	})
	return f
}

// WriteEffect inserts one business row for id through the idempotency
// transaction ctx carries, as a handler would.
func (f *Fixture) WriteEffect(ctx context.Context, id string) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	return tx.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", id).Error
}

// CountEffects returns the number of committed business rows for id.
func (f *Fixture) CountEffects(ctx context.Context, id string) (int, error) {
	var n int64
	// On the primary: with dbresolver configured, reads go to a replica.
	err := f.DB.WithContext(ctx).Clauses(dbresolver.Write).Raw("SELECT COUNT(*) FROM "+f.Effects+" WHERE id = ?", id).Scan(&n).Error
	return int(n), err
}

// PoisonTx makes the transaction in ctx unable to commit, each dialect
// in the way it really happens:
//   - PostgreSQL: a failing statement aborts the transaction;
//   - MySQL: the connection dies under the transaction (it kills
//     itself) and the server rolls the transaction back;
//   - SQLite: a row that breaks a deferred foreign key, so COMMIT itself
//     fails (and SQLite leaves the transaction open).
func (f *Fixture) PoisonTx(ctx context.Context) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	switch f.Dialect {
	case "postgres":
		if err := tx.Exec("SELECT 1/0").Error; err == nil {
			return errors.New("SELECT 1/0 succeeded")
		}
	case "mysql":
		// The connection dies under the transaction, as when the network
		// or the server drops it; the server rolls the transaction back.
		_ = tx.Exec("KILL CONNECTION_ID()").Error
	case "sqlite":
		if err := tx.Exec("INSERT INTO " + f.Effects + " (id, parent) VALUES ('poison', 424242)").Error; err != nil {
			return fmt.Errorf("insert the deferred violation: %w", err)
		}
	}
	return nil
}

// Backend returns the suites' view of f.
func (f *Fixture) Backend() storetest.Backend {
	b := storetest.Backend{
		Store:        f.Store,
		WriteEffect:  f.WriteEffect,
		CountEffects: f.CountEffects,
		PoisonTx:     f.PoisonTx,
		// SQLite has one writer: the suite must not hold a write open
		// while it expects another write to go through.
		SingleWriter: f.Dialect == "sqlite",
		Dialect:      f.Dialect,
		Exec:         Exec,
		EndHandle:    EndHandle,
	}
	switch f.Dialect {
	case "mysql":
		b.EndTxAround = f.deadlock
	case "sqlite":
		b.EndTxAround = f.interrupt
	default:
		// PostgreSQL through GORM has no route around the handle that
		// ends the transaction and lets anything run after it: the
		// handle filters COMMIT, ROLLBACK, END, ABORT, PREPARE
		// TRANSACTION and BEGIN, and never hands out the *sql.Tx or a
		// *sql.DB; PostgreSQL refuses COMMIT inside DO and CALL within a
		// transaction block; a backend that dies (pg_terminate_backend)
		// rolls everything back and leaves a dead connection, on which
		// nothing more runs — a failed statement, which the
		// failing-statement cases cover.
		b.EndTxAround = nil
	}
	return b
}

// Exec runs sql through the idempotency transaction ctx carries, as a
// handler would (storetest.Backend.Exec).
func Exec(ctx context.Context, sql string, args ...any) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	return tx.Exec(sql, args...).Error
}

// EndHandle calls Commit (commit true) or Rollback on the idempotency
// transaction ctx carries, as a handler would (storetest.Backend.EndHandle).
func EndHandle(ctx context.Context, commit bool) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	if commit {
		return tx.Commit().Error
	}
	return tx.Rollback().Error
}

// deadlock ends the MySQL transaction ctx carries by a real deadlock that
// InnoDB resolves by rolling it back: the handler's transaction locks row
// 1, a heavier helper transaction (it has modified more rows, so InnoDB
// picks the handler as the victim) locks row 2 and waits for row 1, and the
// handler asks for row 2.
func (f *Fixture) deadlock(ctx context.Context) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	locks := f.Effects + "_locks"
	if err := tx.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 1").Error; err != nil {
		return fmt.Errorf("lock row 1: %w", err)
	}
	other := f.DB.WithContext(context.Background()).Begin()
	if other.Error != nil {
		return other.Error
	}
	defer other.Rollback()
	for i := range 50 {
		if err := other.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", fmt.Sprintf("heavy-%d", i)).Error; err != nil {
			return err
		}
	}
	if err := other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 2").Error; err != nil {
		return err
	}
	otherDone := make(chan error, 1)
	go func() { otherDone <- other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 1").Error }()
	time.Sleep(200 * time.Millisecond) // let it wait for row 1
	err := tx.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 2").Error
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
func (f *Fixture) interrupt(ctx context.Context) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := tx.WithContext(qctx).Exec(`INSERT INTO ` + f.Effects + ` (id)
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000)
		SELECT 'bulk' FROM n`).Error
	if err == nil {
		return errors.New("the long INSERT was not interrupted")
	}
	return nil
}

// NewBackend returns the storetest.NewBackend of dialect ("postgres",
// "mysql" or "sqlite"): each call makes a NewFixture and returns its
// Backend.
func NewBackend(dialect string) storetest.NewBackend {
	return NewBackendVariant(dialect, Variant{})
}

// NewBackendVariant is NewBackend on OpenDBVariant(dialect, v).
func NewBackendVariant(dialect string, v Variant) storetest.NewBackend {
	return func(t testing.TB) storetest.Backend {
		t.Helper()
		return NewFixtureOn(t, OpenDBVariant(t, dialect, v), dialect).Backend()
	}
}
