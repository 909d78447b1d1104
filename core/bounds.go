package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// claimBounded runs Store.Claim bounded by StoreTimeout, on a's claim context: a
// claim waiting for a pool connection gives up after StoreTimeout rather
// than queue for as long as the client waits.
//
// The first claim uses a.cctx. A call that claims again (a wait for the
// key's holder, a stale claim taken over under a previous fingerprint key)
// gets a context of its own each time: the store may still read the one
// it was given after Claim returned (database/sql's Rows watch theirs
// until they close), and a context once cancelled stays so.
func (e *Engine) claimBounded(ctx context.Context, a *Attempt, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	cctx := &a.cctx
	if a.claims++; a.claims > 1 {
		cctx = new(deadlineCtx)
	}
	cctx.init(ctx, time.Now().Add(e.cfg.StoreTimeout))
	defer cctx.cancel()
	res, err := e.cfg.Store.Claim(cctx, req)
	if err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w: claim: %w", ErrStoreTimeout, err)
	}
	return res, err
}

// beginTx runs Store.BeginTx with its wait for a connection bounded by
// StoreTimeout. The bound cannot be a deadline on the context BeginTx gets:
// the context it returns, derived from it, is the handler's, whose
// deadline is RequestTimeout. So the context is cancelled by a timer that
// is stopped as soon as BeginTx returns; a transaction begun just as the
// timer fired is rolled back. The handler's context then behaves as ctx.
// a.endBegin, called when the attempt ends, releases it.
func (e *Engine) beginTx(ctx context.Context, a *Attempt) (context.Context, idemstore.Tx, error) {
	bctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(e.cfg.StoreTimeout, func() { cancel(ErrStoreTimeout) })
	txCtx, tx, err := e.cfg.Store.BeginTx(bctx, a.lease)
	if !timer.Stop() {
		if err == nil {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StoreTimeout)
			_ = tx.Rollback(rctx)
			rcancel()
			tx = nil
		}
		err = fmt.Errorf("%w: begin: %w", ErrStoreTimeout, errors.Join(err, context.Cause(bctx)))
	}
	if err != nil {
		cancel(nil)
		return ctx, nil, err
	}
	a.endBegin = cancel
	return txCtx, tx, nil
}

// leave ends what the attempt holds beyond its transaction: the context
// beginTx made, and its principal's in-flight slot. It is safe to call
// more than once.
func (a *Attempt) leave() {
	if a.endBegin != nil {
		a.endBegin(nil)
		a.endBegin = nil
	}
	if a.inFlight {
		a.inFlight = false
		a.e.inFlight.leave(a.lease.Principal)
	}
}

// inFlightLimiter counts each principal's idempotent requests between the
// key check and the end of the attempt (Config.MaxInFlightPerPrincipal).
type inFlightLimiter struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

func newInFlightLimiter(max int) *inFlightLimiter {
	if max <= 0 {
		return nil
	}
	return &inFlightLimiter{max: max, n: make(map[string]int)}
}

// enter takes one of principal's slots, or reports false when all are
// taken.
func (l *inFlightLimiter) enter(principal string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[principal] >= l.max {
		return false
	}
	l.n[principal]++
	return true
}

// leave gives back one of principal's slots.
func (l *inFlightLimiter) leave(principal string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[principal] <= 1 {
		delete(l.n, principal)
		return
	}
	l.n[principal]--
}
