package idemsql_test

import (
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// The server set-ups run side by side: each is its own server or driver
// and every Backend its own fresh table, and the suite is mostly waiting
// on them. SQLite runs first, alone: its one writer makes it the slowest
// under a loaded CPU.
func TestConformance(t *testing.T) {
	for _, s := range idemsqltest.Setups {
		t.Run(s, func(t *testing.T) {
			if s != "sqlite" {
				t.Parallel()
			}
			storetest.Run(t, idemsqltest.NewBackend(s))
		})
	}
}

// TestConformanceMySQLOddSession runs the whole suite on MariaDB through a
// DSN whose connections start with sql_mode SIMULTANEOUS_ASSIGNMENT and
// ANSI_QUOTES and a time zone 9½ hours west of UTC: the store's statements
// must not depend on either.
func TestConformanceMySQLOddSession(t *testing.T) {
	cfg, err := mysqldriver.ParseDSN(idemsqltest.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"sql_mode": "'SIMULTANEOUS_ASSIGNMENT,ANSI_QUOTES,STRICT_TRANS_TABLES'", "time_zone": "'-09:30'"}
	storetest.Run(t, func(t testing.TB) storetest.Backend {
		return idemsqltest.NewFixtureOn(t, idemsqltest.OpenDSN(t, "mysql", cfg.FormatDSN()), "mysql").Backend()
	})
}
