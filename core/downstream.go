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
// key and step only, so every attempt at the same request sends the
// provider the same key and the provider deduplicates: one that took over
// a crashed holder's claim, and one that runs after an attempt was released
// (the handler failed after calling the provider, or its commit failed).
// The key is 64 lowercase hex characters and reveals neither the principal
// nor the client's key.
//
// Because it is deterministic, a key claimed again after its record expired
// gets the same downstream key, and a provider that still remembers it
// answers with the earlier request's effect. Config.Retention must
// therefore cover the provider's key window (Stripe keeps keys 24 hours,
// for one). The record's nonce (Record.Nonce) is not mixed in: a release
// deletes the record and its nonce with it, so the retry of a released
// attempt would get a new key and the provider would charge twice.
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
