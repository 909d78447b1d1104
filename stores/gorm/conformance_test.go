package idemgorm_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

func TestConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) { storetest.Run(t, newBackend(d)) })
	}
}
