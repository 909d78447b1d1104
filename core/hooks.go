package idem

import "github.com/idemgo/idem/core/internal/hooks"

func init() {
	hooks.Fingerprint = fingerprintOf
	hooks.LeaseFrom = leaseFrom
}
