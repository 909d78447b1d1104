// Package idemgormtest makes idemgorm stores for the conformance suites
// (core/storetest, core/adaptertest): NewBackend(dialect) is a
// storetest.NewBackend whose every Backend is a fresh store table plus a
// business table, on PostgreSQL (IDEM_PG_DSN), MySQL/MariaDB
// (IDEM_MYSQL_DSN) or a fresh SQLite file. An unreachable server fails the
// test with t.Fatal; it never skips, so a store that was never tested
// cannot look green. The store's own tests and the conformance module
// share it; the business table is idemsqltest's, written through GORM.
//
// Importing the package silences the MySQL driver's logger: PoisonTx kills
// MySQL connections on purpose, and the driver would print a line for each.
package idemgormtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"
)

// Dialects are the dialects NewBackend and NewFixture accept.
var Dialects = []string{"postgres", "mysql", "sqlite"}

// PostgresDSN returns IDEM_PG_DSN, or the local test database.
func PostgresDSN() string { return idemsqltest.PostgresDSN() }

// MySQLDSN returns IDEM_MYSQL_DSN, or the local test database.
func MySQLDSN() string { return idemsqltest.MySQLDSN() }

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

// RandSuffix is idemsqltest.RandSuffix.
func RandSuffix() string { return idemsqltest.RandSuffix() }

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
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dialect != "sqlite" {
		t.Cleanup(func() {
			if err := db.Exec("DROP TABLE IF EXISTS " + table).Error; err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		})
	}
	f := &Fixture{DB: db, Store: store, Dialect: dialect, Effects: table + "_effects"}
	idemsqltest.CreateEffects(t, f.primary(t), dialect, f.Effects)
	return f
}

// primary is the *sql.DB of the primary, where the business table is:
// the *gorm.DB's own pool, which dbresolver leaves in place.
func (f *Fixture) primary(t testing.TB) *sql.DB {
	p, err := f.DB.DB()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Backend returns the suites' view of f: idemsqltest's business table,
// written through the *gorm.DB of idemgorm.Tx, and GORM's Commit and
// Rollback as EndHandle, and a store on a missing table as Misconfigured.
func (f *Fixture) Backend() storetest.Backend {
	sqlDB, _ := f.DB.DB() // as primary: NewFixtureOn checked it
	e := idemsqltest.Effects{DB: sqlDB, Dialect: f.Dialect, Table: f.Effects, Exec: Exec}
	b := storetest.Backend{Store: f.Store, EndHandle: EndHandle}
	e.Fill(&b)
	b.Misconfigured = func(t testing.TB) idemstore.Store {
		s, err := idemgorm.New(f.DB, idemgorm.WithTable("idem_missing_"+RandSuffix()))
		if err != nil {
			t.Fatal(err)
		}
		return s
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
