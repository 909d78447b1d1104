package pgsqltest_test

import (
	"testing"

	"github.com/idemgo/idem/stores/internal/pgsql/pgsqltest"
)

// Example starts a server of the test's own; the DSN opens a pgx pool or
// a database/sql DB on its database "test".
func Example() {
	_ = func(t *testing.T) {
		dsn := pgsqltest.QuietServer(t)
		_ = dsn // pgxpool.New(ctx, dsn), sql.Open("pgx", dsn), …
	}
}
