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

// OpenDB returns the test process's *gorm.DB for a server dialect, opened
// once (at most 40 connections); SQLite gets a fresh file per test.
func OpenDB(t testing.TB, dialect string) *gorm.DB {
	t.Helper()
	if dialect == "sqlite" {
		path := filepath.Join(t.TempDir(), "idem.db")
		// foreign_keys on: the effects table's deferred foreign key is
		// how PoisonTx makes a SQLite commit fail.
		db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(path, 0)+"&_pragma=foreign_keys(1)"), GormConfig())
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
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if db, ok := sharedDBs[dialect]; ok {
		return db
	}
	var dial gorm.Dialector
	switch dialect {
	case "postgres":
		dial = postgres.Open(PostgresDSN())
	case "mysql":
		dial = mysql.Open(MySQLDSN())
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	db, err := gorm.Open(dial, GormConfig())
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
	sharedDBs[dialect] = db
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
	db := OpenDB(t, dialect)
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
		ddl = []string{"CREATE TABLE " + f.Effects + " (id VARCHAR(255) NOT NULL, KEY (id)) ENGINE=InnoDB"}
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
		for _, tbl := range []string{f.Effects, table} {
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
	tx, ok := idemgorm.TxFrom(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	return tx.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", id).Error
}

// CountEffects returns the number of committed business rows for id.
func (f *Fixture) CountEffects(ctx context.Context, id string) (int, error) {
	var n int64
	err := f.DB.WithContext(ctx).Raw("SELECT COUNT(*) FROM "+f.Effects+" WHERE id = ?", id).Scan(&n).Error
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
	tx, ok := idemgorm.TxFrom(ctx)
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
	return storetest.Backend{
		Store:        f.Store,
		WriteEffect:  f.WriteEffect,
		CountEffects: f.CountEffects,
		PoisonTx:     f.PoisonTx,
		// SQLite has one writer: the suite must not hold a write open
		// while it expects another write to go through.
		SingleWriter: f.Dialect == "sqlite",
	}
}

// NewBackend returns the storetest.NewBackend of dialect ("postgres",
// "mysql" or "sqlite"): each call makes a NewFixture and returns its
// Backend.
func NewBackend(dialect string) storetest.NewBackend {
	return func(t testing.TB) storetest.Backend {
		t.Helper()
		return NewFixture(t, dialect).Backend()
	}
}
