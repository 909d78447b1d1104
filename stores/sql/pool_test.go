package idemsql_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idemgo/idem/core/storetest"
	idemsql "github.com/idemgo/idem/stores/sql"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// storeOnPool returns a store on a fresh table of setup's database whose
// *sql.DB holds at most conns connections. On SQLite it is the fixture's
// own store, on the test's own file.
func storeOnPool(t *testing.T, setup string, conns int) *idemsql.Store {
	t.Helper()
	direct := idemsqltest.NewFixture(t, setup)
	if setup == "sqlite" {
		direct.DB.SetMaxOpenConns(conns)
		return direct.Store
	}
	driver, dsn := "pgx", idemsqltest.PostgresDSN()
	if setup == "mysql" {
		driver, dsn = "mysql", idemsqltest.MySQLDSN()
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(conns)
	store, err := idemsql.New(db, idemsql.WithTable(direct.Store.Table()))
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestPoolPinning: one principal's slow requests cannot make another's
// queue for database/sql's pool (a pool of 10, 3 s handlers, 12 at once),
// on PostgreSQL and MySQL. SQLite has one writer at a time, so it has no
// pool to pin.
func TestPoolPinning(t *testing.T) {
	for _, s := range []string{"pgx", "mysql"} {
		t.Run(s, func(t *testing.T) {
			t.Parallel()
			storetest.PoolPinning(t, storeOnPool(t, s, 10), 10, 3*time.Second)
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
	for s, conns := range map[string]int{"pgx": 4, "mysql": 4, "sqlite": 1} {
		t.Run(s, func(t *testing.T) {
			t.Parallel()
			storetest.DownstreamKeyOnAFullPool(t, storeOnPool(t, s, conns), conns)
		})
	}
}
