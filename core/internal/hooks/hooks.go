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

type noPollKey struct{}

// WithoutPolling returns ctx marked so that a request made with it, when it
// waits for its key's holder, never polls the store: it is woken only by a
// signal (the engine's own settle, the store's Notifier). The suites use it
// to prove each wake-up source on its own.
func WithoutPolling(ctx context.Context) context.Context {
	return context.WithValue(ctx, noPollKey{}, true)
}

// Polling reports whether a waiter with ctx may poll (see WithoutPolling).
func Polling(ctx context.Context) bool {
	off, _ := ctx.Value(noPollKey{}).(bool)
	return !off
}

type waitingKey struct{}

// WithWaiting returns ctx carrying fn, which the engine calls once a
// request made with it has found its key in flight and begun to wait, so
// that a test knows its waiters are waiting before it lets the holder end.
func WithWaiting(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, waitingKey{}, fn)
}

// Waiting calls the function WithWaiting put in ctx, if any.
func Waiting(ctx context.Context) {
	if fn, ok := ctx.Value(waitingKey{}).(func()); ok {
		fn()
	}
}
