package adaptertest

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
)

// testWaitedReplay: with Config.WaitInFlight, duplicates sent while the
// first request runs wait for it instead of getting 409, and each gets its
// response replayed byte for byte with Idempotent-Replayed: true; the
// handler runs once.
func testWaitedReplay(t *testing.T, s *suite) {
	const duplicates = 4
	var waited atomic.Int64
	cfg := s.config()
	cfg.WaitInFlight = 5 * time.Second
	cfg.Observer = idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		if ev.Wait == idem.WaitReplayed {
			waited.Add(1)
		}
	})
	p := &payments{b: s.b}
	inside, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	base := s.serve(t, cfg, func(ctx context.Context, r Request) Reply {
		once.Do(func() { close(inside) })
		<-gate
		return p.handle(ctx, r)
	})
	firstc := make(chan Response, 1)
	go func() { firstc <- send(t, base, "alice", "k-wait", paymentBody) }()
	select {
	case <-inside:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request's handler did not start")
	}
	var wg sync.WaitGroup
	replies := make([]Response, duplicates)
	for i := range duplicates {
		wg.Go(func() { replies[i] = send(t, base, "alice", "k-wait", paymentBody) })
	}
	// The duplicates are on their way; they find the key held and wait.
	time.AfterFunc(500*time.Millisecond, func() { close(gate) })
	wg.Wait()
	first := <-firstc
	WantStatus(t, "first request", first, http.StatusCreated)
	for i, r := range replies {
		WantStatus(t, "waited duplicate", r, http.StatusCreated)
		if !bytes.Equal(r.Body, first.Body) || !r.Replayed() {
			t.Fatalf("duplicate %d: %s (replayed %v), want the first body %s replayed", i, r.Body, r.Replayed(), first.Body)
		}
		for _, h := range []string{"Content-Type", "Location"} {
			if r.Header.Get(h) != first.Header.Get(h) {
				t.Fatalf("duplicate %d: %s = %q, want %q", i, h, r.Header.Get(h), first.Header.Get(h))
			}
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	if n := waited.Load(); n == 0 {
		t.Fatal("no duplicate waited for the first request: they arrived after it settled")
	}
}
