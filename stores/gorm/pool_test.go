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

// TestPoolPinning: one principal's slow requests cannot make another's
// queue for database/sql's pool (issue 19's figures: a pool of 10, 3 s
// handlers, 12 at once), on PostgreSQL and MySQL. SQLite has one writer at
// a time, so it has no pool to pin.
func TestPoolPinning(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			direct := newFixture(t, d)
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
			sqlDB.SetMaxOpenConns(10)
			table := direct.Store.Table()
			store, err := idemgorm.New(db, idemgorm.WithTable(table[strings.IndexByte(table, '.')+1:]))
			if err != nil {
				t.Fatal(err)
			}
			storetest.PoolPinning(t, store, 10, 3*time.Second)
		})
	}
}
