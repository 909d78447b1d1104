package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// Example shows the engine as an adapter drives it: Begin claims the key,
// the handler runs with the attempt's context, Finish commits the outcome,
// and a retry is replayed without running the handler.
func Example() {
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: memstore.MustNew()})
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
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: memstore.MustNew()})
	att, _ := engine.Begin(context.Background(), idem.Request{
		Method: "POST", Path: "/payments", Principal: "acct_1", Key: "7f3a",
	})
	defer att.Abort()
	key, _ := idem.DownstreamKey(att.Context(), "charge")
	fmt.Println(len(key))
	// Output: 64
}

// serve runs one request for key through engine with handler, as an adapter
// does, and returns what the client gets.
func serve(engine *idem.Engine, key string, handler func(ctx context.Context) idem.Result) *idem.Response {
	att, resp := engine.Begin(context.Background(), idem.Request{
		Method: "POST", Path: "/payments", Principal: "acct_1", Key: key,
		ContentType: "application/json", Body: strings.NewReader(`{"amount":1000}`),
	})
	if att == nil {
		return resp
	}
	defer att.Abort()
	return att.Finish(handler(att.Context()))
}

// ExampleConfig_classify stores a 409 the handler answers for a business
// conflict (a duplicate order number) as a failed outcome to replay, while
// every other 409 is released so the retry runs again.
func ExampleConfig_classify() {
	errDuplicateOrder := errors.New("duplicate order number")
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey,
		Store: memstore.MustNew(),
		Classify: func(status int, err error) idem.Disposition {
			if status == http.StatusConflict && errors.Is(err, errDuplicateOrder) {
				return idem.Fail
			}
			return idem.DefaultClassifier(status, err)
		},
	})
	runs := 0
	conflict := func(context.Context) idem.Result {
		runs++
		return idem.Result{Status: http.StatusConflict, Body: []byte(`{"error":"duplicate order"}`), Err: errDuplicateOrder}
	}
	first, retry := serve(engine, "k1", conflict), serve(engine, "k1", conflict)
	fmt.Println(first.Status, retry.Status, retry.Header.Get(idem.ReplayedHeader), "runs:", runs)
	// Output: 409 409 true runs: 1
}

// ExampleDefaultClassifier shows which outcomes are stored and which are
// released for the retry to run again.
func ExampleDefaultClassifier() {
	names := map[idem.Disposition]string{idem.Complete: "complete", idem.Fail: "fail", idem.Release: "release"}
	for _, status := range []int{200, 303, 400, 404, 408, 429, 500, 503} {
		fmt.Println(status, names[idem.DefaultClassifier(status, nil)])
	}
	fmt.Println("201 with an error:", names[idem.DefaultClassifier(201, errors.New("boom"))])
	// Output:
	// 200 complete
	// 303 complete
	// 400 fail
	// 404 fail
	// 408 release
	// 429 release
	// 500 release
	// 503 release
	// 201 with an error: release
}

// ExampleConfig_reconcile charges a provider with the key DownstreamKey
// derives. The first attempt's process dies after the charge; when its
// lease has run out, the retry takes the key over and Reconcile asks the
// provider, which already charged that downstream key: the provider's
// answer is stored and replayed, and the customer is charged once.
func ExampleConfig_reconcile() {
	provider := map[string]string{} // downstream key -> charge id
	charge := func(ctx context.Context) (string, error) {
		key, err := idem.DownstreamKey(ctx, "charge")
		if err != nil {
			return "", err
		}
		if id, ok := provider[key]; ok {
			return id, nil // the provider deduplicates on the key
		}
		provider[key] = fmt.Sprintf("ch_%d", len(provider)+1)
		return provider[key], nil
	}
	now := time.Unix(1_750_000_000, 0)
	clock := func() time.Time { return now }
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey,
		Store:          memstore.MustNew(memstore.WithClock(clock)),
		RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			id, err := charge(ctx) // same downstream key as the dead attempt
			if err != nil {
				return nil, err
			}
			return &idem.Response{Status: http.StatusCreated, Body: []byte(`{"charge":"` + id + `"}`)}, nil
		},
	})
	req := idem.Request{Method: "POST", Path: "/payments", Principal: "acct_1", Key: "order-42"}
	crashed, _ := engine.Begin(context.Background(), req)
	_, _ = charge(crashed.Context()) // charged, then the process died before the commit

	now = now.Add(4 * time.Second) // the lease has run out
	_, resp := engine.Begin(context.Background(), req)
	fmt.Println(resp.Status, string(resp.Body), "charges:", len(provider))
	// Output: 201 {"charge":"ch_1"} charges: 1
}

// ExampleSweeper deletes records past their retention. It sweeps the
// engine the requests went through: give it the application's one Engine.
// Run it in the background with Sweeper.Run; one sweep is shown here.
func ExampleSweeper() {
	now := time.Unix(1_750_000_000, 0)
	store := memstore.MustNew(memstore.WithClock(func() time.Time { return now }))
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store, Retention: time.Hour})
	for _, key := range []string{"a", "b", "c"} {
		serve(engine, key, func(context.Context) idem.Result { return idem.Result{Status: http.StatusCreated} })
	}
	now = now.Add(2 * time.Hour)
	sweeper := idem.Sweeper{Engine: engine, BatchSize: 100}
	res, err := sweeper.Sweep(context.Background())
	fmt.Println(res.Purged, err, store.Len())
	// Output: 3 <nil> 0
}

// ExampleObserverFunc counts outcomes, the way a metrics back-end does.
func ExampleObserverFunc() {
	counts := map[idem.OutcomeLabel]int{}
	engine, _ := idem.New(idem.Config{FingerprintKey: fingerprintKey,
		Store:    memstore.MustNew(),
		Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { counts[ev.Outcome]++ }),
	})
	ok := func(context.Context) idem.Result { return idem.Result{Status: http.StatusCreated} }
	serve(engine, "k1", ok)
	serve(engine, "k1", ok)
	serve(engine, "", ok)
	fmt.Println(counts[idem.OutcomeClaimed], counts[idem.OutcomeReplayed], counts[idem.OutcomeKeyMissing])
	// Output: 1 1 1
}

// ExampleNewProblem renders one of the library's problem responses.
func ExampleNewProblem() {
	resp := idem.NewProblem(idem.ProblemKeyInUse).Response(3)
	fmt.Println(resp.Status, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"))
	// Output: 409 application/problem+json 3
}

// fingerprintKey stands for the service's Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
