package idem

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestHoldTimesQuantile(t *testing.T) {
	t.Parallel()
	var h holdTimes
	for i := 1; i <= 100; i++ {
		h.observe("r", time.Duration(i)*time.Millisecond)
	}
	// The window holds the last 64: 37..100ms. Their 90th percentile is
	// the 58th smallest, 94ms.
	if got, ok := h.p90("r"); !ok || got != 94*time.Millisecond {
		t.Fatalf("p90 = %v, %v; want 94ms", got, ok)
	}
	if _, ok := h.p90("unknown"); ok {
		t.Fatal("p90 known for a route never observed")
	}
	h.observe("", time.Second)
	if _, ok := h.routes.Load(""); ok {
		t.Fatal("the empty route was recorded")
	}
}

// TestHoldTimesBounded: concurrent observers on more routes than the cap
// track exactly maxHoldRoutes of them; the others get no estimate.
func TestHoldTimesBounded(t *testing.T) {
	t.Parallel()
	var h holdTimes
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2 * maxHoldRoutes {
				for range minHoldSamples {
					h.observe("route-"+strconv.Itoa((i*7+w)%(2*maxHoldRoutes)), time.Second)
				}
			}
		})
	}
	wg.Wait()
	tracked, known := 0, 0
	h.routes.Range(func(k, _ any) bool {
		tracked++
		return true
	})
	for i := range 2 * maxHoldRoutes {
		if _, ok := h.p90("route-" + strconv.Itoa(i)); ok {
			known++
		}
	}
	if tracked != maxHoldRoutes || h.n.Load() != maxHoldRoutes || known > maxHoldRoutes {
		t.Fatalf("%d routes tracked (count %d), %d with an estimate; want at most %d", tracked, h.n.Load(), known, maxHoldRoutes)
	}
}

// BenchmarkHoldTimesObserve is what every settled attempt adds to its
// request for Retry-After: one route's duration recorded, here from all
// procs at once.
func BenchmarkHoldTimesObserve(b *testing.B) {
	var h holdTimes
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.observe("POST /payments/{id}", time.Second)
		}
	})
}
