package idem

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A 409 tells the client when the holder of the key will most likely have
// finished, not when it must have: the time left until the holder's deadline
// is right but useless (a payment that takes one second answered with
// "Retry-After: 35"). The engine keeps, per route, the last holdSamples
// durations of the attempts that held a key, and answers with the holder's
// lock time plus their 90th percentile, minus now: capped by the worst case
// (the deadline, or the lease once the deadline has passed), and at least
// one second. A route with fewer than minHoldSamples durations (a route
// that has just started serving, after every deploy), beyond the first
// maxHoldRoutes routes, or a request without a route, gets coldRetryAfter
// while its holder may still be running: most handlers take well under a
// second, and a 409 costs the server one indexed read, so an early retry is
// cheap where the worst case would make a client wait half a minute for a
// call that takes one.
const (
	holdSamples    = 64
	minHoldSamples = 8
	maxHoldRoutes  = 512
	coldRetryAfter = time.Second
)

// holdTimes is the per-route record of how long attempts held their key. Its
// hot path, observe, takes no lock and allocates nothing once the route is
// known: a map read and two atomic operations.
type holdTimes struct {
	routes sync.Map // route string -> *holdRing
	n      atomic.Int64
}

// holdRing keeps a route's last holdSamples durations, in nanoseconds.
type holdRing struct {
	next    atomic.Uint64
	samples [holdSamples]atomic.Int64
}

// observe records that an attempt on route held its key for d.
func (h *holdTimes) observe(route string, d time.Duration) {
	if route == "" || d <= 0 {
		return
	}
	v, ok := h.routes.Load(route)
	if !ok {
		if h.n.Load() >= maxHoldRoutes {
			return
		}
		var loaded bool
		if v, loaded = h.routes.LoadOrStore(route, new(holdRing)); !loaded && h.n.Add(1) > maxHoldRoutes {
			// Lost a race for the last places: forget the route again.
			h.routes.Delete(route)
			h.n.Add(-1)
			return
		}
	}
	r := v.(*holdRing)
	r.samples[(r.next.Add(1)-1)%holdSamples].Store(int64(d))
}

// p90 returns the 90th percentile of route's recorded durations, and false
// when the route has too few of them to say.
func (h *holdTimes) p90(route string) (time.Duration, bool) {
	v, ok := h.routes.Load(route)
	if !ok {
		return 0, false
	}
	r := v.(*holdRing)
	n := min(r.next.Load(), holdSamples)
	if n < minHoldSamples {
		return 0, false
	}
	s := make([]int64, 0, holdSamples)
	for i := range n {
		if d := r.samples[i].Load(); d > 0 {
			s = append(s, d)
		}
	}
	if len(s) < minHoldSamples {
		return 0, false
	}
	slices.Sort(s)
	return time.Duration(s[(len(s)*9+9)/10-1]), true
}

// retryAfter tells a 409'd client when the key is likely free, in whole
// seconds, at least 1. The worst case is when the holder's deadline passes
// if it may still be running, otherwise when its lease expires and the key
// can be taken over; when route's holders usually finish sooner, it is
// when this one most likely will (see holdTimes). All of it is measured on
// the store's clock, from the holder's lock time.
func (e *Engine) retryAfter(route string, lockedAt, now time.Time) int {
	elapsed := now.Sub(lockedAt)
	remaining := e.cfg.RequestTimeout + e.cfg.StoreTimeout - elapsed
	if remaining <= 0 {
		remaining = e.cfg.Lease - elapsed
	} else if p90, ok := e.holds.p90(route); ok {
		remaining = min(remaining, p90-elapsed)
	} else {
		remaining = min(remaining, coldRetryAfter)
	}
	secs := int(math.Ceil(remaining.Seconds()))
	return max(secs, 1)
}
