package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// notifyingStore is a memstore that is an idemstore.Notifier within the
// test process: every settle and release is published to every
// subscription, as a store shared by several instances would publish it to
// all of them.
type notifyingStore struct {
	idemstore.Store
	off  error      // Subscribe's answer when set, as a store built without notifications
	mu   sync.Mutex // one delivery at a time, as the contract says
	subs map[int]func(string)
	next int
}

func (s *notifyingStore) Subscribe(fn func(id string)) (func(), error) {
	if s.off != nil {
		return nil, s.off
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs == nil {
		s.subs = map[int]func(string){}
	}
	n := s.next
	s.next++
	s.subs[n] = fn
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs, n)
	}, nil
}

func (s *notifyingStore) publish(l idemstore.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, fn := range s.subs {
		fn(idemstore.NotifyID(l.Principal, l.Key))
	}
}

func (s *notifyingStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, l)
	if err != nil {
		return ctx, tx, err
	}
	return ctx, &notifyingTx{Tx: tx, s: s, l: l}, nil
}

func (s *notifyingStore) Release(ctx context.Context, l idemstore.Lease) error {
	err := s.Store.Release(ctx, l)
	if err == nil {
		s.publish(l)
	}
	return err
}

type notifyingTx struct {
	idemstore.Tx
	s *notifyingStore
	l idemstore.Lease
}

func (t *notifyingTx) Settle(ctx context.Context, out idemstore.Outcome) error {
	err := t.Tx.Settle(ctx, out)
	if err == nil {
		t.s.publish(t.l)
	}
	return err
}

// TestWaitNotified runs storetest's WaitInFlight on a store that is an
// idemstore.Notifier, so its OtherInstanceNotified case runs: waiters on a
// second engine that do not poll are woken by the notification alone.
func TestWaitNotified(t *testing.T) {
	t.Parallel()
	storetest.RunCases(t, func(t testing.TB) storetest.Backend {
		b := storetest.MemBackend(t)
		b.Store = &notifyingStore{Store: b.Store}
		return b
	}, "WaitInFlight")
}

// TestWaitNotificationLost: a store whose notifications never arrive (the
// subscription succeeds, nothing is delivered) costs a waiter on another
// instance latency, not its answer: its poll finds the settle.
func TestWaitNotificationLost(t *testing.T) {
	t.Parallel()
	store := &notifyingStore{Store: memstore.MustNew()}
	one := newCallEngine(t, idem.Config{Store: store, WaitInFlight: 5 * time.Second})
	two := newCallEngine(t, idem.Config{Store: store, WaitInFlight: 5 * time.Second})
	t.Cleanup(func() { _ = one.Close(); _ = two.Close() })
	store.mu.Lock()
	clear(store.subs) // every notification lost from here on
	store.mu.Unlock()
	var effects atomic.Int64
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = one.Do(context.Background(), call("k", `{}`), func(ctx context.Context) (idem.Response, error) {
			close(held)
			<-release
			return effectFn(&effects, 201, "paid")(ctx)
		})
	}()
	<-held
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	start := time.Now()
	res, err := two.Do(context.Background(), call("k", `{}`), effectFn(&effects, 201, "twice"))
	if err != nil || !res.Replayed || string(res.Body) != "paid" || time.Since(start) > 2*time.Second {
		t.Fatalf("the waiter on the other instance, its notification lost: %+v, %v after %v; want the replay by polling",
			res, err, time.Since(start))
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestNotificationsOffIsQuiet: a store that answers Subscribe with
// ErrNotificationsOff (built without notifications) leaves its waiters to
// polling without a word, as a choice the application made; any other
// error is logged at Warn.
func TestNotificationsOffIsQuiet(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		warn bool
	}{
		{fmt.Errorf("store: subscribe: %w", idemstore.ErrNotificationsOff), false},
		{errors.New("store: subscribe: connection refused"), true},
	} {
		var logged bytes.Buffer
		store := &notifyingStore{Store: memstore.MustNew(), off: tc.err}
		e := newCallEngine(t, idem.Config{Store: store, WaitInFlight: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		_ = e.Close()
		if got := strings.Contains(logged.String(), "notifications are unavailable"); got != tc.warn {
			t.Errorf("Subscribe answered %v: warned %v, want %v (log: %q)", tc.err, got, tc.warn, logged.String())
		}
	}
}
