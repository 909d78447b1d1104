package idemgin_test

import (
	"os"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemgo/idem/adapters/gin/idemgintest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// TestMain puts Gin in test mode: without it Gin prints every route it
// registers. The harness leaves Gin's global settings alone.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

// The suite's harness and its auth middleware live in idemgintest, which
// the conformance module mounts too; these tests use the same ones.
var (
	authenticate = idemgintest.Authenticate
	principal    = idemgintest.Principal
)

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, idemgintest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
