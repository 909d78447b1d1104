package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/idemgo/idem/core/memstore"
)

// MemBackend returns a Backend over a fresh memstore, whose business writes
// are entries in a map applied when the memstore transaction commits. It is
// what the suites use to test themselves and what adapters test against.
func MemBackend(t testing.TB, opts ...memstore.Option) Backend {
	var (
		mu      sync.Mutex
		effects = map[string]int{}
	)
	return Backend{
		Store: memstore.MustNew(opts...),
		WriteEffect: func(ctx context.Context, id string) error {
			tx, ok := memstore.Tx(ctx)
			if !ok {
				return errors.New("storetest: no memstore transaction in context")
			}
			tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				effects[id]++
			})
			return nil
		},
		CountEffects: func(_ context.Context, id string) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return effects[id], nil
		},
		PoisonTx: func(ctx context.Context) error {
			tx, ok := memstore.Tx(ctx)
			if !ok {
				return errors.New("storetest: no memstore transaction in context")
			}
			tx.FailCommit(errors.New("poisoned transaction"))
			return nil
		},
	}
}
