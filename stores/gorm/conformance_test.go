package idemgorm_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
)

// TestConformance runs the whole suite on each dialect through GORM: the
// handler's statements, Commit and Rollback go through the *gorm.DB of
// idemgorm.Tx, on *gorm.DBs with dbresolver sending reads to a replica
// that lacks the store's tables, so that any store read or write that went
// to the replica fails.
func TestConformance(t *testing.T) {
	for _, d := range idemgormtest.Dialects {
		t.Run(d, func(t *testing.T) {
			if d != "sqlite" { // SQLite runs alone, as in idemsql's
				t.Parallel()
			}
			storetest.Run(t, func(t testing.TB) storetest.Backend {
				return idemgormtest.NewFixtureOn(t, idemgormtest.OpenResolverDB(t, d, false), d).Backend()
			})
		})
	}
}
