package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/stores/internal/fanout"
)

// fake is a listener that delivers what is sent on in, and counts how
// many run at once.
type fake struct {
	opens, running, most atomic.Int32
	in                   chan string
	fail                 error
}

func (f *fake) open() (fanout.Listen, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	f.opens.Add(1)
	return func(ctx context.Context, deliver func(string)) {
		n := f.running.Add(1)
		defer f.running.Add(-1)
		if n > f.most.Load() {
			f.most.Store(n)
		}
		for {
			select {
			case <-ctx.Done():
				time.Sleep(5 * time.Millisecond) // a slow close
				return
			case id := <-f.in:
				deliver(id)
			}
		}
	}, nil
}

func TestHub(t *testing.T) {
	var h fanout.Hub
	f := &fake{in: make(chan string)}
	if h.Publishing() {
		t.Fatal("a Hub with no subscription publishes")
	}
	var a, b atomic.Int32
	gotB := make(chan struct{}, 2)
	gotA := make(chan struct{}, 2)
	stopA, err := h.Subscribe(func(string) { a.Add(1); gotA <- struct{}{} }, f.open)
	if err != nil {
		t.Fatal(err)
	}
	stopB, err := h.Subscribe(func(string) { b.Add(1); gotB <- struct{}{} }, f.open)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.opens.Load(); got != 1 || !h.Publishing() {
		t.Fatalf("two subscriptions: %d listeners opened, publishing %v; want 1, true", got, h.Publishing())
	}
	f.in <- "x"
	<-gotA
	<-gotB
	stopA()
	stopA()
	f.in <- "y" // delivered to b only; a is stopped
	<-gotB
	f.in <- "z" // delivering while the last stop and the next Subscribe run
	stopB()
	if h.Publishing() {
		t.Fatal("publishing after the last stop")
	}
	for range 3 { // each stopped listener is waited for before the next opens
		stop, err := h.Subscribe(func(string) {}, f.open)
		if err != nil {
			t.Fatal(err)
		}
		stop()
	}
	if a.Load() != 1 || b.Load() < 2 {
		t.Errorf("deliveries: a %d, b %d; want 1, at least 2", a.Load(), b.Load())
	}
	if m := f.most.Load(); m != 1 {
		t.Errorf("%d listeners ran at once, want 1", m)
	}
}

func TestHubOpenFails(t *testing.T) {
	var h fanout.Hub
	boom := errors.New("boom")
	if _, err := h.Subscribe(func(string) {}, (&fake{fail: boom}).open); !errors.Is(err, boom) {
		t.Fatalf("Subscribe = %v, want %v", err, boom)
	}
	if h.Publishing() {
		t.Fatal("a failed Subscribe left the Hub publishing")
	}
	if _, err := h.Subscribe(nil, (&fake{}).open); err == nil {
		t.Fatal("Subscribe(nil) succeeded")
	}
}

func TestBackoff(t *testing.T) {
	var b fanout.Backoff
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	for range 2 {
		if !b.Wait(ctx) {
			t.Fatal("Wait ended early")
		}
	}
	if d := time.Since(start); d < 3*fanout.BackoffMin {
		t.Errorf("two waits took %v, want at least %v (doubling)", d, 3*fanout.BackoffMin)
	}
	cancel()
	if b.Wait(ctx) {
		t.Fatal("Wait on an ended context reported true")
	}
}

func Example() {
	var h fanout.Hub
	in := make(chan string)
	got := make(chan string)
	stop, err := h.Subscribe(func(id string) { got <- id }, func() (fanout.Listen, error) {
		// Connect here; the Listen runs until the last stop.
		return func(ctx context.Context, deliver func(string)) {
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-in:
					deliver(id)
				}
			}
		}, nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("publishing:", h.Publishing())
	in <- "4a3602f570327af7"
	fmt.Println("woken for", <-got)
	stop()
	fmt.Println("publishing:", h.Publishing())
	// Output:
	// publishing: true
	// woken for 4a3602f570327af7
	// publishing: false
}
