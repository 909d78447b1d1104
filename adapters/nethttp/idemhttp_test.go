package idemhttp_test

import (
	"testing"

	"github.com/idemgo/idem/adapters/nethttp/idemhttptest"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, idemhttptest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
