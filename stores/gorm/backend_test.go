package idemgorm_test

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

// The servers the tests run against. An unreachable server fails the test:
// a store that was never tested must not look green.
func pgDSN() string {
	if dsn := os.Getenv("IDEM_PG_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
}

func mysqlDSN() string {
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

var dialects = []string{"postgres", "mysql", "sqlite"}

// gormConfig returns a fresh config for each gorm.Open: Open keeps the
// *gorm.Config it is given and writes the dialector into it, so a shared
// one would end up naming the last dialect opened.
func gormConfig() *gorm.Config {
	return &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true}
}

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*gorm.DB{}
)

// openDB returns the test process's *gorm.DB for a server dialect, opened
// once; SQLite gets a fresh file per test.
func openDB(t testing.TB, dialect string) *gorm.DB {
	t.Helper()
	if dialect == "sqlite" {
		path := filepath.Join(t.TempDir(), "idem.db")
		// foreign_keys on: the effects table's deferred foreign key is
		// how these tests make a SQLite commit fail.
		db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(path, 0)+"&_pragma=foreign_keys(1)"), gormConfig())
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
		dial = postgres.Open(pgDSN())
	case "mysql":
		dial = mysql.Open(mysqlDSN())
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	db, err := gorm.Open(dial, gormConfig())
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

func randSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fixture is a fresh store on a fresh table, plus a business table.
type fixture struct {
	db      *gorm.DB
	store   *idemgorm.Store
	dialect string
	effects string // business table: one row per committed write
}

func newFixture(t testing.TB, dialect string, opts ...idemgorm.Option) *fixture {
	t.Helper()
	db := openDB(t, dialect)
	table := "idem_test_" + randSuffix()
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
	f := &fixture{db: db, store: store, dialect: dialect, effects: table + "_effects"}
	var ddl []string
	switch dialect {
	case "postgres":
		ddl = []string{"CREATE TABLE " + f.effects + " (id text NOT NULL)"}
	case "mysql":
		ddl = []string{"CREATE TABLE " + f.effects + " (id VARCHAR(255) NOT NULL, KEY (id)) ENGINE=InnoDB"}
	case "sqlite":
		ddl = []string{
			"CREATE TABLE " + f.effects + "_parent (id INTEGER PRIMARY KEY)",
			"CREATE TABLE " + f.effects + " (id TEXT NOT NULL, parent INTEGER REFERENCES " + f.effects +
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
		for _, tbl := range []string{f.effects, table} {
			if err := db.Exec("DROP TABLE IF EXISTS " + tbl).Error; err != nil {
				t.Errorf("drop %s: %v", tbl, err)
			}
		}
	})
	return f
}

// writeEffect inserts one business row for id through the idempotency
// transaction ctx carries, as a handler would.
func (f *fixture) writeEffect(ctx context.Context, id string) error {
	tx, ok := idemgorm.TxFrom(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	return tx.Exec("INSERT INTO "+f.effects+" (id) VALUES (?)", id).Error
}

func (f *fixture) countEffects(ctx context.Context, id string) (int, error) {
	var n int64
	err := f.db.WithContext(ctx).Raw("SELECT COUNT(*) FROM "+f.effects+" WHERE id = ?", id).Scan(&n).Error
	return int(n), err
}

// poisonTx makes the transaction in ctx unable to commit, each dialect
// in the way it really happens:
//   - PostgreSQL: a failing statement aborts the transaction;
//   - MySQL: the connection dies under the transaction (it kills
//     itself) and the server rolls the transaction back;
//   - SQLite: a row that breaks a deferred foreign key, so COMMIT itself
//     fails (and SQLite leaves the transaction open).
func (f *fixture) poisonTx(ctx context.Context) error {
	tx, ok := idemgorm.TxFrom(ctx)
	if !ok {
		return errors.New("no idemgorm transaction in context")
	}
	switch f.dialect {
	case "postgres":
		if err := tx.Exec("SELECT 1/0").Error; err == nil {
			return errors.New("SELECT 1/0 succeeded")
		}
	case "mysql":
		// The connection dies under the transaction, as when the network
		// or the server drops it; the server rolls the transaction back.
		_ = tx.Exec("KILL CONNECTION_ID()").Error
	case "sqlite":
		if err := tx.Exec("INSERT INTO " + f.effects + " (id, parent) VALUES ('poison', 424242)").Error; err != nil {
			return fmt.Errorf("insert the deferred violation: %w", err)
		}
	}
	return nil
}

func (f *fixture) backend() storetest.Backend {
	return storetest.Backend{
		Store:        f.store,
		WriteEffect:  f.writeEffect,
		CountEffects: f.countEffects,
		PoisonTx:     f.poisonTx,
		// SQLite has one writer: the suite must not hold a write open
		// while it expects another write to go through.
		SingleWriter: f.dialect == "sqlite",
	}
}

func newBackend(dialect string) storetest.NewBackend {
	return func(t testing.TB) storetest.Backend {
		return newFixture(t, dialect).backend()
	}
}
