package idemsql_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/internal/pgsql/pgsqltest"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// TestSyncOnAQuietServer runs storetest's Syncer and SyncBehindAnOpenWriter
// through each PostgreSQL driver, on a PostgreSQL server of the test's own
// where nothing else commits: there Sync's wait for the WAL flush stalls
// behind another session's open write unless Sync commits a transaction of
// its own.
func TestSyncOnAQuietServer(t *testing.T) {
	dsn := pgsqltest.QuietServer(t)
	for _, setup := range []string{"pgx", "pq"} {
		t.Run(setup, func(t *testing.T) {
			db := idemsqltest.OpenDSN(t, setup, dsn)
			storetest.RunCases(t, func(t testing.TB) storetest.Backend {
				return idemsqltest.NewFixtureOn(t, db, setup).Backend()
			}, "Syncer", "SyncBehindAnOpenWriter")
		})
	}
}
