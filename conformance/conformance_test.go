package conformance_test

import (
	"os"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemgo/idem/adapters/echo/idemechotest"
	"github.com/idemgo/idem/adapters/fiber/idemfibertest"
	"github.com/idemgo/idem/adapters/gin/idemgintest"
	"github.com/idemgo/idem/adapters/nethttp/idemhttptest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestMain puts Gin in test mode, which idemgintest leaves to its users.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

var adapters = []struct {
	name    string
	harness adaptertest.Harness
}{
	{"nethttp", idemhttptest.Harness},
	{"gin", idemgintest.Harness},
	{"echo", idemechotest.Harness},
	{"fiber", idemfibertest.Harness},
}

var stores = []struct {
	name       string
	newBackend storetest.NewBackend
}{
	{"pgx", idempgxtest.NewBackend},
	{"gorm-postgres", idemgormtest.NewBackend("postgres")},
	{"gorm-mysql", idemgormtest.NewBackend("mysql")},
	{"gorm-sqlite", idemgormtest.NewBackend("sqlite")},
	// Redis shares no transaction with the handler; see redis_test.go for
	// undoingBackend, the handler's own database as an application on
	// Redis writes it.
	{"redis", undoingBackend(idemredistest.NewBackend)},
	{"redis-cluster", undoingBackend(idemredistest.NewClusterBackend)},
}

// TestAdapterSuite runs core/adaptertest for every adapter on every store.
func TestAdapterSuite(t *testing.T) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			for _, a := range adapters {
				t.Run(a.name, func(t *testing.T) { adaptertest.Run(t, a.harness, s.newBackend) })
			}
		})
	}
}
