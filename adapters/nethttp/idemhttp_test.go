package idemhttp_test

import (
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	"github.com/idemgo/idem/adapters/nethttp/idemhttptest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, idemhttptest.Harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}

func TestNewRequiresPrincipal(t *testing.T) {
	_, err := idemhttp.New(idemhttp.Config{Config: idem.Config{Store: storetest.MemBackend(t).Store}})
	if err == nil {
		t.Fatal("New without Principal succeeded")
	}
}
