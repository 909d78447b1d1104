package idem_test

import (
	"context"
	"fmt"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// A duplicate sent while the first call still runs waits for it, up to
// Config.WaitInFlight, and gets its reply instead of ProblemKeyInUse.
func ExampleConfig_waitInFlight() {
	eng, err := idem.New(idem.Config{Store: memstore.MustNew(), FingerprintKey: fingerprintKey, WaitInFlight: 2 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()
	call := idem.Call{Principal: "acct_1", Key: "order-42", Operation: "CreatePayment",
		Encoding: "application/json", Input: []byte(`{"amount":4200}`)}

	running := make(chan struct{})
	first := make(chan idem.CallResult)
	go func() {
		res, _ := eng.Do(context.Background(), call, func(context.Context) (idem.Response, error) {
			close(running)
			time.Sleep(100 * time.Millisecond) // the provider is slow
			return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
		})
		first <- res
	}()
	<-running
	dup, err := eng.Do(context.Background(), call, func(context.Context) (idem.Response, error) {
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_2"}`)}, nil // never: the first call answers
	})
	fmt.Println((<-first).Status, string(dup.Body), dup.Replayed, err)
	// Output: 201 {"id":"pay_1"} true <nil>
}
