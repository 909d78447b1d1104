package idemgormtest_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
)

// Example runs the store conformance suite on each dialect idemgorm
// supports, each on a fresh table of a real server.
func Example() {
	_ = func(t *testing.T) {
		for _, dialect := range []string{"postgres", "mysql", "sqlite"} {
			t.Run(dialect, func(t *testing.T) { storetest.Run(t, idemgormtest.NewBackend(dialect)) })
		}
	}
}
