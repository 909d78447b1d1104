package idemgorm_test

import (
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
	"gorm.io/gorm"
)

// The dialects run side by side: each is its own server (or SQLite file)
// and every Backend its own fresh table, and the suite is mostly waiting on
// them.
func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, newBackend(d))
		})
	}
}

// TestConformanceMySQLOddSession runs the whole suite on MariaDB through a
// DSN whose connections start with sql_mode SIMULTANEOUS_ASSIGNMENT and
// ANSI_QUOTES and a time zone 9½ hours west of UTC: the store's statements
// must not depend on either.
func TestConformanceMySQLOddSession(t *testing.T) {
	cfg, err := mysqldriver.ParseDSN(idemgormtest.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"sql_mode": "'SIMULTANEOUS_ASSIGNMENT,ANSI_QUOTES,STRICT_TRANS_TABLES'", "time_zone": "'-09:30'"}
	storetest.Run(t, idemgormtest.NewBackendVariant("mysql", idemgormtest.Variant{DSN: cfg.FormatDSN()}))
}

// TestConformanceReplicas runs the whole suite on *gorm.DBs with
// dbresolver sending reads to a replica that lacks the store's tables: any
// store read or write that went to the replica fails.
func TestConformanceReplicas(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t testing.TB) storetest.Backend {
				var db *gorm.DB = idemgormtest.OpenResolverDB(t, d, false)
				return idemgormtest.NewFixtureOn(t, db, d).Backend()
			})
		})
	}
}
