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

// DownstreamKey returns an idempotency key for an effect outside the
// database, such as a payment provider call, named by step ("charge",
// "refund"). It is derived from the principal, the request's key, the
// record's nonce and step, so every attempt at the same record, including
// one that took over a crashed holder's claim, sends the provider the same
// key and the provider deduplicates; and a key claimed again after its
// record expired gets a new record, a new nonce and new downstream keys, so
// a provider that remembers keys longer than Config.Retention never answers
// the new request with the old one's effect. Retention must still cover the
// provider's own key window: while the record is retained a retry replays
// it, after that the request runs again as a new one.
//
// The key is 64 lowercase hex characters and reveals neither the principal
// nor the client's key.
func DownstreamKey(ctx context.Context, step string) (string, error) {
	l, ok := LeaseFrom(ctx)
	if !ok {
		return "", ErrNoAttempt
	}
	h := sha256.New()
	h.Write([]byte("idem/downstream/v2"))
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{l.Principal, l.Key, l.Nonce, step} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
