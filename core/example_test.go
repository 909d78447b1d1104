package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// Example shows the engine as an adapter drives it: Begin claims the key,
// the handler runs with the attempt's context, Finish commits the outcome,
// and a retry is replayed without running the handler.
func Example() {
	engine, err := idem.New(idem.Config{Store: memstore.New()})
	if err != nil {
		panic(err)
	}
	charges := 0
	serve := func() *idem.Response {
		att, resp := engine.Begin(context.Background(), idem.Request{
			Method: "POST", Path: "/payments", Principal: "acct_1", Key: `"7f3a"`,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1000,"currency":"EUR"}`),
		})
		if att == nil {
			return resp // a replay, a 409, a 422 or a 400
		}
		defer att.Abort() // releases the key if the handler panics
		charges++         // the handler's work, in att.Context()'s transaction
		return att.Finish(idem.Result{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   []byte(`{"id":"pay_1"}`),
		})
	}
	first, retry := serve(), serve()
	fmt.Println(first.Status, string(first.Body))
	fmt.Println(retry.Status, string(retry.Body), retry.Header.Get(idem.ReplayedHeader))
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"id":"pay_1"}
	// 201 {"id":"pay_1"} true
	// charges: 1
}

// ExampleDownstreamKey derives the idempotency key to send a payment
// provider, the same for every attempt at one request.
func ExampleDownstreamKey() {
	engine, _ := idem.New(idem.Config{Store: memstore.New()})
	att, _ := engine.Begin(context.Background(), idem.Request{
		Method: "POST", Path: "/payments", Principal: "acct_1", Key: "7f3a",
	})
	defer att.Abort()
	key, _ := idem.DownstreamKey(att.Context(), "charge")
	fmt.Println(len(key))
	// Output: 64
}
