package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlineCtx behaves as context.WithDeadline(parent, deadline) but arms
// no timer until someone needs one. Most requests finish long before their
// deadline, and many (a handler that never blocks, a store that never
// watches its context) never ask for Done: for them the context costs no
// timer and no allocation beyond its own struct, which lives inside the
// Attempt.
//
// The first call to Done, or any call once the context is over (deadline
// passed, parent done, or cancelled), replaces the lazy form by a real
// context.WithDeadline, and every method delegates to that from then on.
// So context.AfterFunc, context.Cause and children derived with WithCancel
// see an ordinary timer context wherever their answer could differ.
//
// Against context.WithDeadline it saves 8 of 46 allocations on a first
// request (docs/design-notes.md, "The engine's hot path").
type deadlineCtx struct {
	parent   context.Context
	deadline time.Time

	mu       sync.Mutex
	real     atomic.Pointer[realDeadline]
	canceled atomic.Bool
}

type realDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *deadlineCtx) init(parent context.Context, deadline time.Time) {
	c.parent, c.deadline = parent, deadline
}

// materialize returns the real context, creating it on first use.
func (c *deadlineCtx) materialize() *realDeadline {
	if r := c.real.Load(); r != nil {
		return r
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.real.Load(); r != nil {
		return r
	}
	ctx, cancel := context.WithDeadline(c.parent, c.deadline)
	r := &realDeadline{ctx: ctx, cancel: cancel}
	if c.canceled.Load() {
		cancel()
	}
	c.real.Store(r)
	return r
}

// overAt reports whether the lazy form is done at now: cancelled, past
// its deadline, or its parent done.
func (c *deadlineCtx) overAt(now time.Time) bool {
	return c.canceled.Load() || c.parent.Err() != nil || !now.Before(c.deadline)
}

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.materialize().ctx.Done() }

func (c *deadlineCtx) Err() error { return c.errAt(time.Now()) }

// errAt is Err with the clock already read: now instead of time.Now().
func (c *deadlineCtx) errAt(now time.Time) error {
	if r := c.real.Load(); r != nil {
		return r.ctx.Err()
	}
	if c.overAt(now) {
		return c.materialize().ctx.Err()
	}
	return nil
}

func (c *deadlineCtx) Value(key any) any {
	if r := c.real.Load(); r != nil {
		return r.ctx.Value(key)
	}
	if c.overAt(time.Now()) {
		return c.materialize().ctx.Value(key)
	}
	return c.parent.Value(key)
}

// cancel cancels the context, as a context.CancelFunc does.
func (c *deadlineCtx) cancel() {
	c.canceled.Store(true)
	if r := c.real.Load(); r != nil {
		r.cancel()
		return
	}
	// A materialize racing with this sees canceled, or stored its context
	// before the load below.
	c.mu.Lock()
	r := c.real.Load()
	c.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// String names the context as context.WithDeadline's does, for debugging.
func (c *deadlineCtx) String() string {
	return "idem.deadlineCtx(" + c.deadline.String() + ")"
}
