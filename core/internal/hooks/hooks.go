// Package hooks lets package idemadapter reach the parts of the engine that
// package idem keeps unexported because applications have no use for them.
// Package idem sets every hook in its init, so they are set wherever
// idemadapter (which imports idem) is linked.
package hooks

import (
	"context"

	"github.com/idemgo/idem/core/idemstore"
)

// FingerprintVersion is the first byte of every fingerprint the engine
// makes (see idemadapter.FingerprintVersion).
const FingerprintVersion byte = 2

var (
	// Fingerprint is idemadapter.Fingerprint.
	Fingerprint func(key []byte, method, path, principal, contentType string, body []byte, ignore []string) []byte
	// LeaseFrom is idemadapter.LeaseFrom.
	LeaseFrom func(ctx context.Context) (idemstore.Lease, bool)
)
