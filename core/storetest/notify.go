package storetest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// NotifyBound is how long the Notify cases give a notification to reach
// another process's subscriber.
const NotifyBound = 5 * time.Second

// reconnectBound is how long the NotifyAfterReconnect case gives a
// listener to come back after the server dropped it.
const reconnectBound = 20 * time.Second

// peers returns two peers of b's storage, or skips the test when the store
// does not notify.
func peers(t *testing.T, b Backend) (Peer, Peer) {
	t.Helper()
	if b.Peer == nil {
		t.Skip("not applicable: the store does not notify (Backend.Peer); waiters poll")
	}
	p, q := b.Peer(t), b.Peer(t)
	for _, s := range []idemstore.Store{p.Store, q.Store} {
		if _, ok := s.(idemstore.Notifier); !ok {
			t.Fatalf("storetest: Backend.Peer returned a %T, which is no idemstore.Notifier", s)
		}
	}
	return p, q
}

// inbox is a subscriber's record of what it was handed.
type inbox struct {
	mu       sync.Mutex
	ids      []string
	inFlight atomic.Int32
	overlap  atomic.Bool // fn ran on two goroutines at once
	arrived  chan struct{}
}

func newInbox() *inbox { return &inbox{arrived: make(chan struct{}, 1)} }

// fn is the subscriber: it notes id, and whether another call was still
// running, holding on a little so that overlapping calls would meet.
func (in *inbox) fn(id string) {
	if in.inFlight.Add(1) > 1 {
		in.overlap.Store(true)
	}
	time.Sleep(200 * time.Microsecond)
	in.mu.Lock()
	in.ids = append(in.ids, id)
	in.mu.Unlock()
	in.inFlight.Add(-1)
	select {
	case in.arrived <- struct{}{}:
	default:
	}
}

func (in *inbox) has(id string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Contains(in.ids, id)
}

func (in *inbox) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.ids)
}

// await waits up to bound for every id in ids to arrive.
func (in *inbox) await(t testing.TB, bound time.Duration, ids ...string) {
	t.Helper()
	deadline := time.After(bound)
	for {
		missing := slices.DeleteFunc(slices.Clone(ids), in.has)
		if len(missing) == 0 {
			return
		}
		select {
		case <-in.arrived:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d of %d notifications did not arrive within %v (first missing: %s)", len(missing), len(ids), bound, missing[0])
		}
	}
}

func subscribe(t testing.TB, s idemstore.Store, in *inbox) (stop func()) {
	t.Helper()
	stop, err := s.(idemstore.Notifier).Subscribe(in.fn)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(stop)
	return stop
}

// settleOn claims a fresh key for principal on s and settles it (release:
// releases it instead), and returns its NotifyID.
func settleOn(t testing.TB, s idemstore.Store, principal string, release bool) string {
	t.Helper()
	id, err := trySettleOn(ctxT(t), s, principal, release)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func trySettleOn(ctx context.Context, s idemstore.Store, principal string, release bool) (string, error) {
	req := claimReq(principal, uniq("n"), "body")
	res, err := s.Claim(ctx, req)
	switch {
	case err != nil:
		return "", fmt.Errorf("claim: %w", err)
	case !res.Claimed:
		return "", fmt.Errorf("claim of a fresh key: %+v", res)
	case release:
		err = s.Release(ctx, leaseOf(req))
	default:
		err = settleStore(ctx, s, leaseOf(req))
	}
	if err != nil {
		return "", fmt.Errorf("settle or release: %w", err)
	}
	return idemstore.NotifyID(req.Principal, req.Key), nil
}

func settleStore(ctx context.Context, s idemstore.Store, l idemstore.Lease) error {
	_, tx, err := s.BeginTx(ctx, l)
	if err != nil {
		return fmt.Errorf("BeginTx: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: http.StatusCreated, Body: []byte("{}")}})
}

// testNotifyWakesPeers: with both peers subscribed, each settle and
// release on one reaches the other's subscriber with the record's
// NotifyID, within NotifyBound, and a burst of them from many goroutines
// reaches it whole, its fn never running on two goroutines at once; a
// second subscription on the same store gets them too.
func testNotifyWakesPeers(t *testing.T, b Backend) {
	a, p := peers(t, b)
	self, other, twice := newInbox(), newInbox(), newInbox()
	subscribe(t, a.Store, self)
	subscribe(t, p.Store, other)
	subscribe(t, p.Store, twice)

	settled := settleOn(t, a.Store, "alice", false)
	other.await(t, NotifyBound, settled)
	released := settleOn(t, a.Store, "alice", true)
	other.await(t, NotifyBound, released)

	const burst = 24
	ids := make([]string, burst)
	errs := make([]error, burst)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = trySettleOn(ctx, a.Store, fmt.Sprintf("p%d", i%3), i%2 == 0)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	other.await(t, NotifyBound, ids...)
	twice.await(t, NotifyBound, append(ids, settled, released)...)
	self.await(t, NotifyBound, settled, released)
	for name, in := range map[string]*inbox{"the peer's": other, "the second": twice, "the publisher's": self} {
		if in.overlap.Load() {
			t.Errorf("%s subscriber's fn ran on two goroutines at once", name)
		}
	}
}

// testNotifyStop: after stop, a subscription's fn is not called again,
// while another subscription on the same store still gets every
// notification; a store keeps one listening connection however many
// subscriptions it has, and none once the last one stopped.
func testNotifyStop(t *testing.T, b Backend) {
	a, p := peers(t, b)
	subscribe(t, a.Store, newInbox())
	stopped, live := newInbox(), newInbox()
	stop := subscribe(t, p.Store, stopped)
	stopLive := subscribe(t, p.Store, live)
	first := settleOn(t, a.Store, "alice", false)
	stopped.await(t, NotifyBound, first)
	live.await(t, NotifyBound, first)
	if p.Listening != nil {
		if n := p.Listening(); n != 1 {
			t.Errorf("a store with two subscriptions has %d listening connections, want 1", n)
		}
	}
	stop()
	stop() // a second stop does nothing
	before := stopped.count()
	second := settleOn(t, a.Store, "alice", true)
	live.await(t, NotifyBound, second)
	time.Sleep(100 * time.Millisecond) // a stray call would have arrived with the live one's
	if got := stopped.count(); got != before {
		t.Fatalf("fn called %d more time(s) after stop", got-before)
	}
	if p.Listening == nil {
		return
	}
	stopLive()
	deadline := time.Now().Add(NotifyBound)
	for p.Listening() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the store still has %d listening connection(s) %v after its last subscription stopped", p.Listening(), NotifyBound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testNotifyOutsidePool: a subscribed store's listening connection is
// none of its pool's: with a notification delivered, the pool has no
// connection in use.
func testNotifyOutsidePool(t *testing.T, b Backend) {
	a, p := peers(t, b)
	if p.Acquired == nil {
		t.Skip("not applicable: the peer's pool cannot say how many connections it has in use (Peer.Acquired)")
	}
	subscribe(t, a.Store, newInbox())
	in := newInbox()
	subscribe(t, p.Store, in)
	in.await(t, NotifyBound, settleOn(t, a.Store, "alice", false))
	if n := p.Acquired(); n != 0 {
		t.Fatalf("a subscribed store with nothing in flight holds %d pool connection(s): the listener must not take one", n)
	}
}

// testNotifyReconnect: when the server drops a subscriber's listening
// connection, the store opens another, and notifications reach the
// subscriber again (those sent meanwhile may be lost).
func testNotifyReconnect(t *testing.T, b Backend) {
	a, p := peers(t, b)
	if p.KillListener == nil {
		t.Skip("not applicable: the listener's connection cannot be dropped from the server (Peer.KillListener)")
	}
	subscribe(t, a.Store, newInbox())
	in := newInbox()
	subscribe(t, p.Store, in)
	in.await(t, NotifyBound, settleOn(t, a.Store, "alice", false))
	if err := p.KillListener(); err != nil {
		t.Fatalf("KillListener: %v", err)
	}
	deadline := time.Now().Add(reconnectBound)
	for {
		id := settleOn(t, a.Store, "alice", false)
		wait := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(wait) && !in.has(id) {
			time.Sleep(10 * time.Millisecond)
		}
		if in.has(id) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no notification arrived within %v of the listener's connection being dropped", reconnectBound)
		}
	}
}

// testNotifyOnlyWhenSubscribed: a store publishes nothing while it has no
// subscription (before the first Subscribe and after the last stop), and
// every settle and release while it has one.
func testNotifyOnlyWhenSubscribed(t *testing.T, b Backend) {
	a, _ := peers(t, b)
	if b.Eavesdrop == nil {
		t.Skip("not applicable: the storage's notifications cannot be heard from outside (Backend.Eavesdrop)")
	}
	heard := b.Eavesdrop(t)
	quiet := []string{settleOn(t, a.Store, "alice", false), settleOn(t, a.Store, "alice", true)}
	stop := subscribe(t, a.Store, newInbox())
	loud := []string{settleOn(t, a.Store, "alice", false), settleOn(t, a.Store, "alice", true)}
	stop()
	quiet = append(quiet, settleOn(t, a.Store, "alice", false), settleOn(t, a.Store, "alice", true))
	// A control published after the quiet ones: once it and the loud ones
	// are heard, any of the quiet ones would have been. All of them are
	// waited for, not the control alone: on a Redis Cluster a message
	// published on another node than the eavesdropper's arrives over the
	// cluster bus, in no order with the rest.
	stop = subscribe(t, a.Store, newInbox())
	control := settleOn(t, a.Store, "alice", false)
	stop()
	want := append([]string{control}, loud...)
	deadline := time.Now().Add(NotifyBound)
	var got []string
	for {
		got = heard()
		missing := slices.DeleteFunc(slices.Clone(want), func(id string) bool { return slices.Contains(got, id) })
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if slices.Contains(missing, control) {
				t.Fatalf("the eavesdropper heard %d notification(s) but not the control within %v", len(got), NotifyBound)
			}
			for _, id := range missing {
				t.Errorf("a settle or release of a subscribed store published nothing within %v (%s)", NotifyBound, id)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range quiet {
		if slices.Contains(got, id) {
			t.Errorf("a store with no subscription published %s", id)
		}
	}
}
