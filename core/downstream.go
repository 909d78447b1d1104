package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/wire"
)

type attemptKey struct{}

// AttemptContext returns the context of the attempt that ctx runs in: ctx
// itself when it carries the attempt (the request's context or one derived
// from it), or the attempt's context an adapter stored in ctx under
// idemadapter.ContextKey (a *gin.Context). ok is false outside an attempt, and ctx is
// then returned as it is. Stores' accessors call it before they look up
// their transaction, so that a handler never falls back to running outside
// the transaction because it passed the framework's context.
func AttemptContext(ctx context.Context) (context.Context, bool) {
	ac, a := attemptIn(ctx)
	return ac, a != nil
}

// attemptIn returns the attempt ctx runs in and the context that carries
// it (see AttemptContext), or ctx and nil outside an attempt.
func attemptIn(ctx context.Context) (context.Context, *Attempt) {
	if a, ok := ctx.Value(attemptKey{}).(*Attempt); ok {
		return ctx, a
	}
	if ac, ok := ctx.Value(wire.ContextKey).(context.Context); ok && ac != nil {
		if a, ok := ac.Value(attemptKey{}).(*Attempt); ok {
			return ac, a
		}
	}
	return ctx, nil
}

// attemptOf returns the attempt ctx runs in (see AttemptContext).
func attemptOf(ctx context.Context) (*Attempt, bool) {
	_, a := attemptIn(ctx)
	return a, a != nil
}

// leaseFrom is idemadapter.LeaseFrom: it returns the lease of the attempt running with ctx, if any.
func leaseFrom(ctx context.Context) (idemstore.Lease, bool) {
	a, ok := attemptOf(ctx)
	if !ok {
		return idemstore.Lease{}, false
	}
	return a.lease, true
}

// DownstreamKey returns an idempotency key for an effect outside the
// database, such as a payment provider call, named by step ("charge",
// "refund"). It is derived from the principal, the request's key, the
// record's nonce (Record.Nonce) and step, so:
//
//   - every attempt at the same record sends the provider the same key,
//     and the provider deduplicates: one that took over a crashed holder's
//     claim, and one that runs after an attempt was released (the handler
//     failed after calling the provider, or its commit failed), because
//     the released record keeps its nonce until it expires;
//   - a key claimed again after its record expired gets a new nonce and
//     so a new downstream key: the provider never answers a new request
//     with an earlier request's effect, however long it keeps keys.
//
// A retry of a released attempt is deduplicated by the provider only while
// both still remember the key: within Config.Retention of the claim (the
// released record's life) and within the provider's own key window (Stripe
// keeps keys 24 hours). Clients must stop retrying before the shorter of
// the two ends; a Retention longer than the provider's window buys nothing
// for such a retry.
//
// When the store commits claims asynchronously (its Tx is a Syncer) and
// the claim was not made durable when it was taken (Config.DurableClaims,
// Call.DurableClaim), the first call of an attempt first waits until the
// claim is durable, on the attempt's own connection and within
// Config.StoreTimeout, so the key never depends on a nonce that a database
// crash could still take back; an error there is returned and no key is
// given. A handler therefore needs no connection beyond its transaction's.
//
// The key is 64 lowercase hex characters and reveals neither the principal
// nor the client's key.
func DownstreamKey(ctx context.Context, step string) (string, error) {
	a, ok := attemptOf(ctx)
	if !ok {
		return "", ErrNoAttempt
	}
	if err := a.syncNonce(ctx); err != nil {
		return "", err
	}
	return DownstreamKeyOf(a.lease.Principal, a.lease.Key, a.nonce, step), nil
}

// DownstreamKeyOf returns the key DownstreamKey gives an attempt at the
// record of principal and key whose nonce (Record.Nonce) is nonce, for
// step: for a reconciler outside the attempt, such as one that idemctl
// reconcile asks, which has the record and must look the effect up at the
// provider. It is the lowercase hex SHA-256 of "idem/downstream/v2"
// followed by principal, key, nonce and step, each preceded by its length
// in bytes as an unsigned varint (encoding/binary.PutUvarint).
func DownstreamKeyOf(principal, key, nonce, step string) string {
	h := sha256.New()
	h.Write([]byte("idem/downstream/v2"))
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{principal, key, nonce, step} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// syncNonce makes the attempt's claim durable, once, when its Tx is a
// Syncer and the claim was not durable already (see DownstreamKey).
func (a *Attempt) syncNonce(ctx context.Context) error {
	s, ok := a.tx.(idemstore.Syncer)
	if !ok || a.durable {
		return nil
	}
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	if a.synced {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.e.cfg.StoreTimeout)
	defer cancel()
	if err := s.Sync(ctx); err != nil {
		return fmt.Errorf("idem: downstream key: make the claim durable: %w", err)
	}
	a.synced = true
	return nil
}
