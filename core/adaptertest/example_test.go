package adaptertest_test

import (
	"testing"

	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// Example shows how an adapter's tests run the HTTP-level suite: a Harness
// that mounts the adapter's middleware on a real server (each adapter's
// idem…test package has one), and the stores to run it on.
func Example() {
	var harness adaptertest.Harness // e.g. idemhttptest.Harness
	_ = func(t *testing.T) {
		adaptertest.Run(t, harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
	}
}
