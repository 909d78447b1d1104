package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// recordEvents returns an Observer that keeps every Event, and a reader.
func recordEvents() (idem.Observer, func() []idem.Event) {
	var mu sync.Mutex
	var events []idem.Event
	return idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		}), func() []idem.Event {
			mu.Lock()
			defer mu.Unlock()
			return append([]idem.Event(nil), events...)
		}
}

func TestEventRoute(t *testing.T) {
	t.Parallel()
	obs, events := recordEvents()
	e := newCallEngine(t, idem.Config{Observer: obs})
	var effects atomic.Int64
	named := call("r1", `{}`)
	named.Route = "payments.v1.Payments/Create"
	for _, c := range []idem.Call{call("r0", `{}`), named} {
		if _, err := e.Do(context.Background(), c, effectFn(&effects, 201, "ok")); err != nil {
			t.Fatal(err)
		}
	}
	_, resp := e.Begin(context.Background(), idem.Request{Method: "POST", Path: "/payments?card=4111", Route: "/payments",
		Principal: "alice", Key: "a b"})
	if resp == nil || resp.Status != 400 {
		t.Fatalf("begin = %+v, want a 400 for the invalid key", resp)
	}
	got := events()
	want := []string{"CreatePayment", "payments.v1.Payments/Create", "/payments"}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, ev := range got {
		if ev.Route != want[i] {
			t.Errorf("event %d: Route %q, want %q", i, ev.Route, want[i])
		}
	}
}

type sweepRecorder struct {
	mu   sync.Mutex
	got  []idem.SweepResult
	errs []error
	done chan struct{}
}

func (r *sweepRecorder) ObserveSweep(_ context.Context, res idem.SweepResult, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got, r.errs = append(r.got, res), append(r.errs, err)
	if len(r.got) == 1 {
		close(r.done)
	}
}

func TestSweeperObserver(t *testing.T) {
	t.Parallel()
	store := memstore.MustNew()
	if _, err := store.Claim(context.Background(), idemstore.ClaimRequest{Principal: "p", Key: "k", Token: "t",
		Lease: time.Millisecond, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	rec := &sweepRecorder{done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	s := idem.Sweeper{Store: store, Lease: time.Millisecond, Interval: time.Hour, Observer: rec,
		Logger: slog.New(slog.DiscardHandler)}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep observed in 10s")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.errs[0] != nil || len(rec.got[0].Stale) != 1 || rec.got[0].Stale[0].Key != "k" {
		t.Fatalf("observed %+v, %v; want the one stale claim", rec.got[0], rec.errs[0])
	}
}
