package idem

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemgo/idem/core/idemstore"
	"time"
)

// staleAction is what the sweeper did with one stale claim.
type staleAction int

const (
	staleRaced      staleAction = iota // another attempt took it over or settled it first
	staleReconciled                    // Reconcile's answer stored as completed (or failed)
	staleReleased                      // no effect: the key is free for the next retry
	staleFailed                        // takeover, Reconcile or the store failed
)

// reconcileStale is the sweeper's half of the stale state: it takes stale
// over with the same fenced takeover a retry makes (Store.Claim with the
// record's fingerprint and a new token), so a retrying client and the
// sweeper cannot both hold the key, then asks Config.Reconcile what became
// of the crashed attempt. A Response is stored as a retry's reconcile
// stores it, in one commit (BeginTx, Settle); nil releases the key. When
// anything else happens (BeginTx or Reconcile fails, the answer cannot be
// stored) the claim is kept (Store.Keep), for the next sweep or a client's
// takeover to ask again, instead of letting a retry run the handler blind.
// The caller checked that Reconcile is set.
func (e *Engine) reconcileStale(ctx context.Context, stale Record) (staleAction, error) {
	token, nonce := newTokenAndNonce()
	lease := idemstore.Lease{Principal: stale.Principal, Key: stale.Key, Token: token}
	// e.claim releases, fenced by this token, a claim whose answer was lost
	// but which may have committed, as for a client's failed claim.
	res, err := e.claim(ctx, nil, idemstore.ClaimRequest{
		Principal: lease.Principal, Key: lease.Key, Fingerprint: stale.Fingerprint, Token: lease.Token,
		Nonce: nonce, RequestID: stale.RequestID, Lease: e.cfg.Lease, Retention: e.cfg.Retention,
		TakeOverUncertain: true,
	}, lease)
	switch {
	case err != nil:
		return staleFailed, fmt.Errorf("claim: %w", err)
	case !res.Claimed:
		return staleRaced, nil
	case !res.Reclaimed:
		// The record expired meanwhile and the claim made a new one: the
		// key counts as absent, so give it back.
		if err := e.cfg.Store.Release(ctx, lease); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
			return staleFailed, fmt.Errorf("release an expired record's claim: %w", err)
		}
		return staleRaced, nil
	}

	start := e.cfg.Clock()
	a := &Attempt{e: e, lease: lease, nonce: res.Record.Nonce, start: start, reclaimed: true,
		ev: Event{Principal: lease.Principal, Key: lease.Key, RequestID: stale.RequestID}}
	copy(a.fingerprint[:], stale.Fingerprint)
	txCtx, tx, err := e.cfg.Store.BeginTx(context.WithValue(ctx, attemptKey{}, a), lease)
	if err != nil {
		a.finished = true
		return staleFailed, fmt.Errorf("begin: %w", a.keepClaim(ctx, err))
	}
	a.tx = tx
	a.hctx.init(txCtx, time.Now().Add(e.cfg.RequestTimeout))
	a.ctx = &a.hctx

	resp, err := e.cfg.Reconcile(a.ctx, res.Record)
	a.finished = true
	if err != nil {
		return staleFailed, fmt.Errorf("reconcile: %w", a.keepClaim(ctx, err))
	}
	if resp == nil {
		a.resolved = true // no effect: the key is free
		if ended := a.release(ctx, nil); ended != nil {
			return staleFailed, fmt.Errorf("release: %w", ended)
		}
		if a.ev.Err != nil {
			return staleFailed, fmt.Errorf("release: %w", a.ev.Err)
		}
		return staleReleased, nil
	}
	a.reconciled = true
	v := a.settle(Result{Status: resp.Status, Header: resp.Header, Body: resp.Body})
	switch {
	case v.stored != "":
		return staleReconciled, nil
	case v.outcome == OutcomeReleased && v.problem == "":
		return staleReleased, nil // the classifier released Reconcile's answer
	case v.err != nil:
		return staleFailed, fmt.Errorf("settle: %w", v.err)
	}
	return staleFailed, fmt.Errorf("settle: %s", v.outcome)
}

// keepClaim ends an attempt whose outcome is unknown without releasing its
// claim: it rolls the transaction back (if one began) and keeps the record
// (Store.Keep): in progress, Uncertain, its lease ended, so the next
// retry's takeover asks Reconcile at once. It returns cause, joined with
// the store's errors if any. A Keep that cannot reach the store leaves the
// record in progress under this attempt's lease, which a takeover finds
// stale when the lease ends: never released.
func (a *Attempt) keepClaim(ctx context.Context, cause error) error {
	if a.ctx != nil {
		defer a.hctx.cancel()
	}
	defer a.leave()
	sctx := a.storeContext(ctx, time.Now())
	defer a.sctx.cancel()
	var errs []error
	if a.tx != nil {
		if err := a.tx.Rollback(sctx); err != nil && !errors.Is(err, idemstore.ErrTxEnded) {
			errs = append(errs, err)
		}
	}
	if err := a.keepLease(sctx); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return cause
	}
	return errors.Join(append([]error{cause}, errs...)...)
}

// mustKeep reports whether a failure of this attempt must keep its claim
// rather than release it: it took a stale claim over to ask Reconcile, and
// Reconcile has not said that the earlier attempt had no effect.
func (a *Attempt) mustKeep() bool {
	return a.reclaimed && a.e.cfg.Reconcile != nil && !a.resolved
}
