package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
)

type attemptKey struct{}

// LeaseFrom returns the lease of the attempt running with ctx, if any.
func LeaseFrom(ctx context.Context) (Lease, bool) {
	a, ok := ctx.Value(attemptKey{}).(*Attempt)
	if !ok {
		return Lease{}, false
	}
	return a.lease, true
}

// ErrNoAttempt is returned by DownstreamKey outside an idempotent handler.
var ErrNoAttempt = errors.New("idem: no idempotent attempt in context")

// DownstreamKey returns a deterministic idempotency key for an effect
// outside the database, such as a payment provider call, named by step
// ("charge", "refund"). It is derived from the principal, the request's
// key and step only, so every attempt at the same request, including one
// that took over a crashed holder's claim, sends the provider the same key
// and the provider deduplicates. The key is 64 lowercase hex characters and
// reveals neither the principal nor the client's key.
func DownstreamKey(ctx context.Context, step string) (string, error) {
	l, ok := LeaseFrom(ctx)
	if !ok {
		return "", ErrNoAttempt
	}
	h := sha256.New()
	h.Write([]byte("idem/downstream/v1"))
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{l.Principal, l.Key, step} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
