package conformance_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
)

// Redis shares no transaction with the handler (idemredistest's Backends
// declare NoSharedTx). core/storetest honours that and reports the
// shared-transaction checks as not applicable; core/adaptertest does not
// read the flag yet, and nine of its cases count the business writes of a
// released attempt (a 5xx, a handler error, a panic, the deadline) or
// poison the transaction to fail the commit. On Redis those writes stay
// unless the handler undoes them, which is what an application on Redis
// does (examples/payments deletes its row on a failure after the write,
// and keys it by idem.DownstreamKey for the failures it cannot see).
//
// So the adapters run on Redis through undoingBackend: the Store is the
// real idemredis.Store on the real server, wrapped only in BeginTx, and the
// business writes are the handler's database modelled as an application
// on Redis writes it: kept when the attempt's outcome was settled in Redis
// (after the settle succeeded), undone when the attempt was released.
// PoisonTx makes the settle fail before it reaches Redis, as a handler's
// failed commit would. Every claim, replay, 409, 422, release, takeover
// and fence is Redis's own.

// undoingBackend wraps the Backend of newBackend.
func undoingBackend(newBackend storetest.NewBackend) storetest.NewBackend {
	return func(t testing.TB) storetest.Backend {
		b := newBackend(t)
		s := &undoingStore{Store: b.Store, effects: map[string]int{}}
		return storetest.Backend{
			Store:        s,
			WriteEffect:  s.writeEffect,
			CountEffects: s.countEffects,
			PoisonTx:     s.poison,
			NoSharedTx:   true,
			SelfExpiring: b.SelfExpiring,
		}
	}
}

type undoingStore struct {
	idemstore.Store
	mu      sync.Mutex
	effects map[string]int // kept business writes per id
}

type attemptKey struct{}

// attempt is one attempt's business writes, pending its outcome.
type attempt struct {
	idemstore.Tx
	s        *undoingStore
	mu       sync.Mutex
	pending  []string
	poisoned bool
}

var errPoisoned = errors.New("conformance: the handler's own commit failed (PoisonTx)")

func (s *undoingStore) BeginTx(ctx context.Context, lease idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, lease)
	if err != nil {
		return ctx, tx, err
	}
	a := &attempt{Tx: tx, s: s}
	return context.WithValue(ctx, attemptKey{}, a), a, nil
}

// Settle stores the outcome in Redis, then keeps the attempt's writes.
func (a *attempt) Settle(ctx context.Context, out idemstore.Outcome) error {
	a.mu.Lock()
	poisoned, pending := a.poisoned, a.pending
	a.pending = nil
	a.mu.Unlock()
	if poisoned {
		_ = a.Tx.Rollback(ctx)
		return errPoisoned
	}
	if err := a.Tx.Settle(ctx, out); err != nil {
		return err
	}
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	for _, id := range pending {
		a.s.effects[id]++
	}
	return nil
}

// Rollback undoes the writes of an attempt that was not settled.
func (a *attempt) Rollback(ctx context.Context) error {
	a.mu.Lock()
	a.pending = nil
	a.mu.Unlock()
	return a.Tx.Rollback(ctx)
}

func attemptOf(ctx context.Context) (*attempt, error) {
	// The handler's handle is idemredis's: asking for it is what marks
	// the attempt's handle used.
	if _, ok := idemredis.Tx(ctx); !ok {
		return nil, errors.New("no idemredis handle in context")
	}
	a, ok := ctx.Value(attemptKey{}).(*attempt)
	if !ok {
		return nil, errors.New("no attempt in context")
	}
	return a, nil
}

func (s *undoingStore) writeEffect(ctx context.Context, id string) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, id)
	return nil
}

func (s *undoingStore) poison(ctx context.Context) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.poisoned = true
	return nil
}

func (s *undoingStore) countEffects(_ context.Context, id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[id], nil
}
