package idempgx_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/internal/pgsql/pgsqltest"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestSyncOnAQuietServer runs storetest's Syncer and SyncBehindAnOpenWriter
// on a PostgreSQL server of the test's own, where nothing else commits:
// there Sync's wait for the WAL flush stalls behind another session's
// open write unless Sync commits a transaction of its own.
func TestSyncOnAQuietServer(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgsqltest.QuietServer(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool := idempgxtest.OpenPool(t, cfg)
	storetest.RunCases(t, func(t testing.TB) storetest.Backend {
		e := newEnv(t, pool)
		b := e.Backend()
		b.Syncer, b.HoldRecord = true, e.holdRecord
		return b
	}, "Syncer", "SyncBehindAnOpenWriter")
}
