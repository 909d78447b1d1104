package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// provider is a fake payment provider that deduplicates on the idempotency
// key its clients send, as real providers do.
type provider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	real    int               // charges actually made
}

func (p *provider) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[key]; ok {
		return id
	}
	p.real++
	id := fmt.Sprintf("ch_%d", p.real)
	p.charges[key] = id
	return id
}

func (p *provider) lookup(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.charges[key]
	return id, ok
}

// TestCrashAfterProviderCallChargesOnce: a holder calls the provider and
// dies before its commit; after the lease a retry takes the key over and
// calls the provider again with the same downstream key, so the customer
// is charged once. With a reconciler the retry does not even call the
// handler: it learns the charge from the provider and stores it.
func TestCrashAfterProviderCallChargesOnce(t *testing.T) {
	t.Parallel()
	for _, reconcile := range []bool{false, true} {
		t.Run(fmt.Sprintf("reconciler=%v", reconcile), func(t *testing.T) {
			clk := newClock()
			p := &provider{charges: map[string]string{}}
			handlerRuns := 0
			cfg := idem.Config{FingerprintKey: storetest.FingerprintKey,
				Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: time.Second,
				StoreTimeout: time.Second, Lease: 3 * time.Second,
			}
			if reconcile {
				cfg.Reconcile = func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
					key, err := idem.DownstreamKey(ctx, "charge")
					if err != nil {
						return nil, err
					}
					if id, ok := p.lookup(key); ok {
						return &idem.Response{Status: http.StatusCreated, Body: []byte(id)}, nil
					}
					return nil, nil // never reached the provider: run the handler
				}
			}
			e, err := idem.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			run := func(finish bool) *idem.Response {
				att, resp := e.Begin(context.Background(), request("alice", "pay-1"))
				if att == nil {
					return resp
				}
				handlerRuns++
				key, err := idem.DownstreamKey(att.Context(), "charge")
				if err != nil {
					t.Fatal(err)
				}
				id := p.charge(key)
				if !finish {
					return nil // the process dies here: no commit, no release
				}
				return att.Finish(idem.Result{Status: http.StatusCreated, Body: []byte(id)})
			}
			run(false)
			if r := run(true); r.Status != http.StatusConflict {
				t.Fatalf("retry while the holder's lease is live: %d, want 409", r.Status)
			}
			clk.Add(4 * time.Second)
			final := run(true)
			if final.Status != http.StatusCreated || string(final.Body) != "ch_1" {
				t.Fatalf("retry after the lease: %d %s, want 201 ch_1", final.Status, final.Body)
			}
			if p.real != 1 {
				t.Fatalf("the provider charged %d times", p.real)
			}
			wantRuns := 2
			if reconcile {
				wantRuns = 1
			}
			if handlerRuns != wantRuns {
				t.Fatalf("handler ran %d times, want %d", handlerRuns, wantRuns)
			}
			if replay := run(true); string(replay.Body) != "ch_1" || replay.Header.Get(idem.ReplayedHeader) != "true" {
				t.Fatalf("replay: %d %s", replay.Status, replay.Body)
			}
		})
	}
}
