// Package fanout is the subscription side of the stores' idemstore.Notifier:
// the set of subscribers of one Store, the one listener that runs while
// there is any, and the flag that tells the store to publish.
package fanout

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Listen runs a store's listener until ctx ends, handing every
// notification it receives to deliver, one at a time, from one goroutine.
type Listen func(ctx context.Context, deliver func(id string))

// Hub is the subscriptions of one Store. The zero value has none.
type Hub struct {
	publishing atomic.Bool

	mu     sync.Mutex
	subs   map[*sub]struct{}
	cancel context.CancelFunc // stops the running listener; nil when none runs
	done   chan struct{}      // closed when the last listener returned
}

// sub is one subscription; mu is held while its fn runs, so that stop
// returns only once no call of fn is in progress.
type sub struct {
	mu      sync.Mutex
	stopped bool
	fn      func(id string)
}

// Publishing reports whether the Hub has a subscription: the store then
// publishes each settle and release, and otherwise sends nothing of the
// sort.
func (h *Hub) Publishing() bool { return h.publishing.Load() }

// Subscribe adds fn. The first subscription calls open, which connects
// the listener (its error is returned, and nothing subscribed) and returns
// what runs it; the listener runs until the last subscription stops. A
// listener that stopped is waited for before another starts, so that a
// Store has one listening connection at a time. stop waits for a call of
// fn in progress to return, so fn must not call it.
func (h *Hub) Subscribe(fn func(id string), open func() (Listen, error)) (stop func(), err error) {
	if fn == nil {
		return nil, errors.New("nil func")
	}
	s := &sub{fn: fn}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A stopped listener may still be delivering, which takes h.mu: wait
	// for it without holding h.mu.
	for h.cancel == nil && h.done != nil {
		done := h.done
		select {
		case <-done:
			h.done = nil
		default:
			h.mu.Unlock()
			<-done
			h.mu.Lock()
		}
	}
	if h.cancel == nil {
		listen, err := open()
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		h.cancel, h.done = cancel, done
		go func() {
			defer close(done)
			listen(ctx, h.deliver)
		}()
	}
	if h.subs == nil {
		h.subs = make(map[*sub]struct{})
	}
	h.subs[s] = struct{}{}
	h.publishing.Store(true)
	var once sync.Once
	return func() { once.Do(func() { h.unsubscribe(s) }) }, nil
}

func (h *Hub) unsubscribe(s *sub) {
	h.mu.Lock()
	delete(h.subs, s)
	if len(h.subs) == 0 {
		h.publishing.Store(false)
		h.cancel()
		h.cancel = nil
	}
	h.mu.Unlock()
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}

// deliver calls every subscription's fn with id.
func (h *Hub) deliver(id string) {
	h.mu.Lock()
	subs := make([]*sub, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.mu.Lock()
		if !s.stopped {
			s.fn(id)
		}
		s.mu.Unlock()
	}
}

// The backoff between a listener's attempts to reconnect: doubled from
// BackoffMin up to BackoffMax.
const (
	BackoffMin = 50 * time.Millisecond
	BackoffMax = 5 * time.Second
)

// Backoff is a listener's reconnect backoff. The zero value starts at
// BackoffMin.
type Backoff struct{ d time.Duration }

// Wait sleeps for the next backoff, doubled each time up to BackoffMax,
// and reports false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	if b.d == 0 {
		b.d = BackoffMin
	}
	t := time.NewTimer(b.d)
	defer t.Stop()
	b.d = min(2*b.d, BackoffMax)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Reset makes the next Wait sleep BackoffMin again: the listener is
// connected.
func (b *Backoff) Reset() { b.d = 0 }
