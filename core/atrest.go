package idem

import (
	"context"
	"fmt"
)

// BodySealer encrypts the response bodies a store keeps, so someone who
// can read the table (a backup, a replica, a support query) cannot read
// what the responses said, which often echoes what the client sent.
//
// Seal is called at settle with the body about to be stored; Open at
// replay with what was stored. principal and key identify the record: bind
// them to the ciphertext (as AEAD additional data), so a sealed body copied
// into another record does not open. Seal's output should carry a version
// or key id, so bodies sealed under a previous key still open after a
// rotation (keep the old key for Retention). An empty stored body is never
// passed to Open: the engine stores a sealed body whatever its length, so
// only an omitted body (Config.OmitStoredBody) or a record stored before
// the sealer is empty.
type BodySealer interface {
	Seal(ctx context.Context, principal, key string, body []byte) ([]byte, error)
	Open(ctx context.Context, principal, key string, sealed []byte) ([]byte, error)
}

// bodyToStore is what settle stores of the handler's body: nothing with
// Config.OmitStoredBody, the sealed body with Config.BodySealer, the body
// itself otherwise.
func (a *Attempt) bodyToStore(ctx context.Context, body []byte) ([]byte, error) {
	switch {
	case a.e.cfg.OmitStoredBody:
		return nil, nil
	case a.e.cfg.BodySealer == nil:
		return body, nil
	}
	sealed, err := a.e.cfg.BodySealer.Seal(ctx, a.lease.Principal, a.lease.Key, body)
	if err != nil {
		return nil, fmt.Errorf("%w: seal: %w", ErrSeal, err)
	}
	return sealed, nil
}

// openStored replaces the body of a record about to be replayed by its
// opened form, when a BodySealer is configured and the body is not empty.
func (e *Engine) openStored(ctx context.Context, rec *Record) error {
	if e.cfg.BodySealer == nil || rec.Response == nil || len(rec.Response.Body) == 0 {
		return nil
	}
	body, err := e.cfg.BodySealer.Open(ctx, rec.Principal, rec.Key, rec.Response.Body)
	if err != nil {
		return fmt.Errorf("%w: open: %w", ErrSeal, err)
	}
	rec.Response.Body = body
	return nil
}
