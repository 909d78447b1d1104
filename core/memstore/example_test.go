package memstore_test

import (
	"context"
	"fmt"
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// Example runs two attempts at one key on a memstore: the handler's work,
// registered with OnCommit, happens once, with the stored response.
func Example() {
	store := memstore.MustNew()
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store})
	orders := 0
	for range 2 {
		att, resp := engine.Begin(context.Background(), idem.Request{Method: "POST", Path: "/orders", Principal: "acct_1", Key: "o-1"})
		if att == nil {
			fmt.Println("replayed:", resp.Status, resp.Header.Get(idem.ReplayedHeader))
			continue
		}
		tx, _ := memstore.Tx(att.Context())
		tx.OnCommit(func() { orders++ })
		resp = att.Finish(idem.Result{Status: http.StatusCreated})
		fmt.Println("ran:", resp.Status)
	}
	fmt.Println("orders:", orders)
	// Output:
	// ran: 201
	// replayed: 201 true
	// orders: 1
}

// ExampleHandle_FailCommit makes the commit fail, as a database does after a
// failed statement: nothing is stored and the key is released.
func ExampleHandle_FailCommit() {
	store := memstore.MustNew()
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store})
	att, _ := engine.Begin(context.Background(), idem.Request{Method: "POST", Path: "/orders", Principal: "acct_1", Key: "o-2"})
	tx, _ := memstore.Tx(att.Context())
	tx.FailCommit(fmt.Errorf("constraint violated"))
	resp := att.Finish(idem.Result{Status: http.StatusCreated})
	rec, _ := store.Get(context.Background(), "acct_1", "o-2")
	fmt.Println(resp.Status, rec.State, rec.Response == nil)
	// Output: 500 released true
}

// fingerprintKey stands for the service's Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
