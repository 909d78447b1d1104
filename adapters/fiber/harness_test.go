package idemfiber_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/fiber/idemfibertest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// The suite's harness, its auth middleware and its server live in
// idemfibertest, which the conformance module mounts too; these tests use
// the same ones.
var (
	authenticate = idemfibertest.Authenticate
	principal    = idemfibertest.Principal
	serve        = idemfibertest.Serve
)

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, idemfibertest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
