package idemecho_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/echo/idemechotest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// The suite's harness, its auth middleware and its Echo live in
// idemechotest, which the conformance module mounts too; these tests use
// the same ones.
var (
	authenticate = idemechotest.Authenticate
	principal    = idemechotest.Principal
	newEcho      = idemechotest.NewEcho
)

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, idemechotest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
