package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
)

// A waiter that polls claims again after pollFirst, then after intervals
// doubling up to pollMax, each with ±25 % jitter so that the pollers of many
// instances spread out.
const (
	pollFirst = 25 * time.Millisecond
	pollMax   = 500 * time.Millisecond
)

// WaitOutcome names how a request's wait for its key's holder ended (see
// Config.WaitInFlight). The values are stable and are meant as metric
// labels.
type WaitOutcome string

// The ways a wait ends.
const (
	// WaitReplayed: the holder settled and its stored response was
	// replayed.
	WaitReplayed WaitOutcome = "replayed"
	// WaitClaimedAfterRelease: the holder released the key (or its lease
	// ran out) and this request claimed it and ran.
	WaitClaimedAfterRelease WaitOutcome = "claimed_after_release"
	// WaitTimedOut: the holder was still in flight at the bound; the
	// request was answered 409 with Retry-After.
	WaitTimedOut WaitOutcome = "timed_out"
	// WaitCancelled: the client went away (the request's context ended)
	// during the wait.
	WaitCancelled WaitOutcome = "cancelled"
	// WaitRefused: the engine's or the principal's waiter cap was reached
	// (Config.MaxWaiters, Config.MaxWaitersPerPrincipal); the request was
	// answered 409 with Retry-After at once.
	WaitRefused WaitOutcome = "refused"
	// WaitAnswered: the claim made once woken answered something else: a
	// store error, a record whose outcome is unknown, or another request's
	// record under the key (422).
	WaitAnswered WaitOutcome = "answered"
)

// waitBound is how long call c may wait for its key's holder: the call's
// own bound (Call.WaitInFlight, at most the lease), else its route's
// (Config.RouteWaitInFlight), else Config.WaitInFlight; 0 means it does not
// wait.
func (e *Engine) waitBound(c *Call) time.Duration {
	switch {
	case c.WaitInFlight < 0:
		return 0
	case c.WaitInFlight > 0:
		return min(c.WaitInFlight, e.cfg.Lease)
	}
	if d, ok := e.cfg.RouteWaitInFlight[c.Route]; ok {
		return d
	}
	return e.cfg.WaitInFlight
}

// claimAnswer is one claim's answer, as start dispatches on it.
type claimAnswer struct {
	lease idemstore.Lease
	res   idemstore.ClaimResult
	fp    []byte // the fingerprint the record is matched against (see starting.claim)
	err   error
}

// inFlight reports whether the answer is this call's record held by another
// attempt under a live lease: the one answer a call may wait on.
func (ans *claimAnswer) inFlight() bool {
	rec := ans.res.Record
	return ans.err == nil && !ans.res.Claimed && rec.State == idemstore.StateInProgress &&
		ans.res.Now.Before(rec.LeaseExpiresAt) && bytes.Equal(rec.Fingerprint, ans.fp)
}

// wait waits, up to bound, for the attempt holding the key of ans to
// settle or release it, and returns the answer of the claim made once
// woken, through the normal claim path: start dispatches on it as on any
// claim's answer. Between claims the waiter holds nothing of the store's:
// no connection, no transaction, no lock. It is woken by the engine's own
// attempts on the key, by the store's Notifier, and by polling (one waiter
// per key and engine polls for the others), so a lost notification costs
// latency, never an answer. At the bound, or when ctx ends, it returns the
// last in-flight answer, which start answers 409 with Retry-After.
func (s *starting) wait(ctx context.Context, a *Attempt, c *Call, key string, ans claimAnswer, bound time.Duration) claimAnswer {
	e := s.e
	started := time.Now()
	id := idemstore.NotifyID(c.Principal, key)
	kw, ok := e.waits.enter(c.Principal, id)
	if !ok {
		s.ev.Wait = WaitRefused
		return ans
	}
	e.subscribe()
	poller, polls := false, hooks.Polling(ctx)
	defer func() {
		e.waits.leave(c.Principal, id, kw, poller)
		s.ev.Waited = time.Since(started)
	}()
	bounded := time.NewTimer(bound)
	defer bounded.Stop()
	var tick *time.Timer
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	interval, waiting := pollFirst, false
	for {
		if err := context.Cause(ctx); err != nil {
			// Gone while woken: no claim on its behalf.
			s.ev.Wait, s.waitErr = WaitCancelled, err
			return ans
		}
		// Armed before the claim: a settle after the claim's read closes
		// this channel, so no wake-up falls between the two.
		var wake <-chan struct{}
		wake, poller = e.waits.arm(kw, poller, polls)
		claimedAt := time.Now()
		next := s.claim(ctx, a, c, key)
		if err := context.Cause(ctx); err != nil && next.err != nil {
			// Gone during the claim, which failed with it: the wait ends
			// as if the client had gone before it, not as a store error.
			s.ev.Wait, s.waitErr = WaitCancelled, err
			return ans
		}
		if ans = next; !ans.inFlight() {
			if !ans.res.Claimed {
				// The holder is done, as this claim learnt (a poll, or a
				// wake-up by another instance's notification): the key's
				// other waiters in this engine learn it too, now.
				e.waits.wake(id)
			}
			s.ev.Wait = waitOutcome(&ans)
			return ans
		}
		var ticks <-chan time.Time
		var handoff chan struct{}
		switch {
		case poller && tick == nil:
			tick = time.NewTimer(jitter(interval))
			ticks = tick.C
		case poller:
			tick.Reset(jitter(interval))
			ticks = tick.C
		case polls:
			handoff = kw.handoff
		}
		if poller {
			interval = min(2*interval, pollMax)
		}
		if !waiting {
			waiting = true
			hooks.Waiting(ctx)
		}
		select {
		case <-wake:
		case <-ticks:
		case <-handoff:
			poller = e.waits.takePoll(kw)
		case <-bounded.C:
			s.ev.Wait = WaitTimedOut
			// Retry-After counts from now, not from the last claim.
			ans.res.Now = ans.res.Now.Add(time.Since(claimedAt))
			return ans
		case <-ctx.Done():
			s.ev.Wait, s.waitErr = WaitCancelled, context.Cause(ctx)
			return ans
		}
	}
}

// waitOutcome names the end of a wait whose last claim answered ans.
func waitOutcome(ans *claimAnswer) WaitOutcome {
	rec := ans.res.Record
	switch {
	case ans.err != nil:
		return WaitAnswered
	case ans.res.Claimed:
		return WaitClaimedAfterRelease
	case rec.Response != nil && (rec.State == idemstore.StateCompleted || rec.State == idemstore.StateFailed) &&
		bytes.Equal(rec.Fingerprint, ans.fp):
		return WaitReplayed
	}
	return WaitAnswered
}

// jitter returns d ±25 %.
func jitter(d time.Duration) time.Duration {
	return d - d/4 + mrand.N(d/2+1)
}

// waitRoom keeps the requests of one engine that wait for their key's
// holder, by key (its idemstore.NotifyID), and caps them per engine and per
// principal.
type waitRoom struct {
	max, maxPer int
	n           atomic.Int64 // waiters now: signal reads it without the lock
	mu          sync.Mutex
	per         map[string]int         // principal -> waiters
	keys        map[string]*keyWaiters // NotifyID -> the key's waiters
}

// keyWaiters are the waiters of one key.
type keyWaiters struct {
	n int
	// wake is closed, and replaced, each time the key's holder may have
	// settled or released it.
	wake chan struct{}
	// polling is set while one of the waiters polls for the others;
	// handoff passes the role on when that waiter leaves.
	polling bool
	handoff chan struct{}
}

func newWaitRoom(max, maxPer int) *waitRoom {
	return &waitRoom{max: max, maxPer: maxPer, per: make(map[string]int), keys: make(map[string]*keyWaiters)}
}

// enter admits a waiter of principal on key id, or reports that a cap is
// reached.
func (r *waitRoom) enter(principal, id string) (*keyWaiters, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n.Load() >= int64(r.max) || r.per[principal] >= r.maxPer {
		return nil, false
	}
	r.n.Add(1)
	r.per[principal]++
	kw := r.keys[id]
	if kw == nil {
		kw = &keyWaiters{wake: make(chan struct{}), handoff: make(chan struct{}, 1)}
		r.keys[id] = kw
	}
	kw.n++
	return kw, true
}

// leave removes a waiter that enter admitted; a poller passes its role on.
func (r *waitRoom) leave(principal, id string, kw *keyWaiters, poller bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n.Add(-1)
	if r.per[principal]--; r.per[principal] <= 0 {
		delete(r.per, principal)
	}
	if kw.n--; kw.n == 0 {
		delete(r.keys, id)
		return
	}
	if poller {
		kw.polling = false
		select {
		case kw.handoff <- struct{}{}:
		default:
		}
	}
}

// arm returns the channel the key's next wake-up closes, and whether the
// caller polls: it does when it already did, or when it may (polls) and no
// other waiter of the key does.
func (r *waitRoom) arm(kw *keyWaiters, poller, polls bool) (<-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !poller && polls && !kw.polling {
		kw.polling, poller = true, true
		select {
		case <-kw.handoff:
		default:
		}
	}
	return kw.wake, poller
}

// takePoll gives a waiter that received the handoff the poller's role,
// unless another waiter took it meanwhile.
func (r *waitRoom) takePoll(kw *keyWaiters) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kw.polling {
		return false
	}
	kw.polling = true
	return true
}

// wake wakes the waiters of key id, if any. It is the Notifier's callback,
// and never blocks.
func (r *waitRoom) wake(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kw := r.keys[id]; kw != nil {
		close(kw.wake)
		kw.wake = make(chan struct{})
	}
}

// signal wakes the waiters of lease's key after this engine's attempt on it
// settled, released or kept it. With no waiter in the engine it costs one
// atomic load.
func (r *waitRoom) signal(lease idemstore.Lease) {
	if r.n.Load() == 0 {
		return
	}
	r.wake(idemstore.NotifyID(lease.Principal, lease.Key))
}

// subscribe subscribes the engine to the store's notifications, once, when
// the store is an idemstore.Notifier. A store that cannot deliver them is
// logged at Warn; its waiters poll.
func (e *Engine) subscribe() {
	e.subOnce.Do(func() {
		n, ok := e.cfg.Store.(idemstore.Notifier)
		if !ok {
			return
		}
		stop, err := n.Subscribe(e.waits.wake)
		if errors.Is(err, idemstore.ErrNotificationsOff) {
			return
		}
		if err != nil {
			e.cfg.logger().LogAttrs(context.Background(), slog.LevelWarn,
				"idempotency: the store's notifications are unavailable; requests waiting for a key's holder poll",
				slog.String("error", err.Error()))
			return
		}
		e.subMu.Lock()
		e.unsubscribe = stop
		e.subMu.Unlock()
	})
}

// Close stops what the engine runs in the background: its subscription to
// the store's notifications (see idemstore.Notifier), taken by New when a
// wait is configured (Config.WaitInFlight, Config.RouteWaitInFlight) or by
// the first request that waits. The engine keeps working after Close; its
// waiting requests then poll. Close is safe to call more than once and
// returns nil.
func (e *Engine) Close() error {
	e.subOnce.Do(func() {}) // no subscription from here on
	e.subMu.Lock()
	stop := e.unsubscribe
	e.unsubscribe = nil
	e.subMu.Unlock()
	if stop != nil {
		stop()
	}
	return nil
}
