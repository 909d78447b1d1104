package idemsqltest_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// Example runs the store conformance suite on each driver set-up idemsql
// is tested with, each on a fresh table of a real server.
func Example() {
	_ = func(t *testing.T) {
		for _, setup := range idemsqltest.Setups {
			t.Run(setup, func(t *testing.T) { storetest.Run(t, idemsqltest.NewBackend(setup)) })
		}
	}
}
