package idemgorm_test

import (
	"strings"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
)

// storeOnPool returns a store on a fresh table of dialect's database whose
// *sql.DB holds at most conns connections. On SQLite it is the fixture's
// own store, on the test's own file.
func storeOnPool(t *testing.T, d string, conns int) *idemgorm.Store {
	t.Helper()
	direct := newFixture(t, d)
	if d == "sqlite" {
		sqlDB, _ := direct.DB.DB()
		sqlDB.SetMaxOpenConns(conns)
		return direct.Store
	}
	dial := postgres.Open(pgDSN())
	if d == "mysql" {
		dial = mysql.Open(idemgormtest.MySQLDSN())
	}
	db, err := gorm.Open(dial, gormConfig())
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { _ = sqlDB.Close() })
	sqlDB.SetMaxOpenConns(conns)
	table := direct.Store.Table()
	store, err := idemgorm.New(db, idemgorm.WithTable(table[strings.IndexByte(table, '.')+1:]))
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestPoolPinning: one principal's slow requests cannot make another's
// queue for database/sql's pool (issue 19's figures: a pool of 10, 3 s
// handlers, 12 at once), on PostgreSQL and MySQL. SQLite has one writer at
// a time, so it has no pool to pin.
func TestPoolPinning(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			storetest.PoolPinning(t, storeOnPool(t, d, 10), 10, 3*time.Second)
		})
	}
}

// TestDownstreamKeyOnAFullPool: handlers that hold every connection of the
// pool between them all get their downstream keys. On PostgreSQL each one's
// Sync waits for the claim's WAL flush on its own transaction's connection;
// MySQL and SQLite have no Sync, and the test shows that DownstreamKey
// takes no connection there either. SQLite runs one handler at a time (one
// writer), so its pool is one connection.
func TestDownstreamKeyOnAFullPool(t *testing.T) {
	for d, conns := range map[string]int{"postgres": 4, "mysql": 4, "sqlite": 1} {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			storetest.DownstreamKeyOnAFullPool(t, storeOnPool(t, d, conns), conns)
		})
	}
}
