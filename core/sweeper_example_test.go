package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// ExampleSweeper_reconcile resolves a stale claim no client retries: the
// attempt charged the provider and its process died before the commit.
// The sweeper, given the engine, takes the claim over as a retry would,
// asks Reconcile, and stores the provider's answer; the client that comes
// back later gets it replayed, and the customer is charged once.
func ExampleSweeper_reconcile() {
	charges := map[string]string{} // the provider's: downstream key -> charge id
	now := time.Unix(1_750_000_000, 0)
	clock := func() time.Time { return now }
	engine, _ := idem.New(idem.Config{
		FingerprintKey: fingerprintKey,
		Store:          memstore.MustNew(memstore.WithClock(clock)),
		RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			key, err := idem.DownstreamKey(ctx, "charge") // the dead attempt's
			if err != nil {
				return nil, err
			}
			id, ok := charges[key]
			if !ok {
				return nil, nil // never charged: release, the retry runs the handler
			}
			return &idem.Response{Status: http.StatusCreated, Body: []byte(`{"charge":"` + id + `"}`)}, nil
		},
	})
	req := idem.Request{Method: "POST", Path: "/payments", Principal: "acct_1", Key: "order-42"}
	crashed, _ := engine.Begin(context.Background(), req)
	key, _ := idem.DownstreamKey(crashed.Context(), "charge")
	charges[key] = "ch_1" // charged, then the process died before the commit

	now = now.Add(4 * time.Second) // the lease has run out
	sweeper := idem.Sweeper{Engine: engine}
	res, err := sweeper.Sweep(context.Background())
	fmt.Println("stale:", len(res.Stale), "reconciled:", res.Reconciled, "released:", res.Released, err)

	_, resp := engine.Begin(context.Background(), req) // the client, much later
	fmt.Println(resp.Status, resp.Header.Get(idem.ReplayedHeader), string(resp.Body))
	// Output:
	// stale: 1 reconciled: 1 released: 0 <nil>
	// 201 true {"charge":"ch_1"}
}
