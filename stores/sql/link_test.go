package idemsql_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

// TestNoPostgresDriverLinked: a program on idemsql with only a MySQL or
// only a SQLite driver links no PostgreSQL driver.
func TestNoPostgresDriverLinked(t *testing.T) {
	for _, driver := range []string{"github.com/go-sql-driver/mysql", "github.com/glebarez/go-sqlite"} {
		storetest.CheckNotLinked(t, []string{"github.com/jackc/", "github.com/lib/pq"}, "github.com/idemgo/idem/stores/sql", driver)
	}
}
