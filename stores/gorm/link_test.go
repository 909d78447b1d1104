package idemgorm_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

// TestNoPostgresDriverLinked: a GORM program on idemgorm with only the
// MySQL or only the SQLite dialector links no PostgreSQL driver.
func TestNoPostgresDriverLinked(t *testing.T) {
	for _, dialector := range []string{"gorm.io/driver/mysql", "github.com/glebarez/sqlite"} {
		storetest.CheckNotLinked(t, []string{"github.com/jackc/", "github.com/lib/pq", "gorm.io/driver/postgres"},
			"github.com/idemgo/idem/stores/gorm", dialector)
	}
}
