package idemredis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// payments stands for the application's SQL table, whose downstream_key
// column is unique and whose rows keep the request's own fields:
//
//	CREATE TABLE payments (id text PRIMARY KEY, downstream_key text UNIQUE NOT NULL, amount bigint NOT NULL);
//	INSERT INTO payments (id, downstream_key, amount) VALUES ($1, $2, $3)
//	    ON CONFLICT (downstream_key) DO NOTHING RETURNING id, amount;
//	SELECT id, amount FROM payments WHERE downstream_key = $1; -- when nothing was inserted
type payments struct {
	mu    sync.Mutex
	byKey map[string]examplePayment // downstream_key → row
}

type examplePayment struct {
	id     string
	amount int64
}

// insert inserts a payment unless its downstream key exists, and returns
// the row either way: the one inserted, or the one an earlier attempt
// wrote, which the caller compares with its request.
func (p *payments) insert(downstreamKey string, amount int64) examplePayment {
	p.mu.Lock()
	defer p.mu.Unlock()
	if row, ok := p.byKey[downstreamKey]; ok {
		return row
	}
	row := examplePayment{id: fmt.Sprintf("pay_%d", len(p.byKey)+1), amount: amount}
	p.byKey[downstreamKey] = row
	return row
}

// Example runs the same request twice on a Redis store, then loses its
// record (as a Redis restart without persistence does) and reuses the key
// with another amount. The handler writes its payment idempotently by its
// downstream key, because the store shares no transaction with it: the
// second request replays the stored response without running the handler,
// and after the lost record the unique column hands the handler the first
// payment, which it compares with the request and refuses (422 key-reused)
// instead of answering another request's payment.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: idemredistest.Addr()})
	defer client.Close()
	store, err := idemredis.New(client, idemredis.WithPrefix("idem-example:"+idemredistest.RandHex(4)+":"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
		log.Fatal(err) // Redis is down: `make services` starts it
	}
	db := &payments{byKey: map[string]examplePayment{}}
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store, Retention: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	handler := func(ctx context.Context, amount int64) idem.Result {
		h, _ := idemredis.Tx(ctx)
		fmt.Println("handler runs; shares a transaction:", h.Transactional())
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return idem.Result{Status: http.StatusInternalServerError, Err: err}
		}
		row := db.insert(dk, amount)
		if row.amount != amount {
			// The key's payment is another request's: answer as the
			// engine does for a reused key, and store nothing.
			p := idem.NewProblem(idem.ProblemKeyReused).Response(0)
			return idem.Result{Status: p.Status, Header: p.Header, Body: p.Body, Err: errors.New("key reused")}
		}
		return idem.Result{Status: http.StatusCreated, Body: []byte(`{"id":"` + row.id + `"}`)}
	}
	pay := func(amount int64) {
		body := fmt.Sprintf(`{"amount":%d}`, amount)
		att, resp := engine.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "acct_1", Key: "order-7",
			ContentType: "application/json", Body: strings.NewReader(body)})
		if att != nil {
			resp = att.Finish(handler(att.Context(), amount))
		}
		out := string(resp.Body)
		if resp.Header.Get("Content-Type") == idem.ProblemContentType {
			var p idem.Problem
			_ = json.Unmarshal(resp.Body, &p)
			out = strings.TrimPrefix(string(p.Type), idem.ProblemTypeBase)
		}
		fmt.Println(resp.Status, out, "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
	}
	pay(100)
	pay(100)
	client.Del(ctx, store.RecordKey("acct_1", "order-7")) // Redis loses the record
	pay(250)
	fmt.Println("payments:", len(db.byKey))
	// Output:
	// handler runs; shares a transaction: false
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
	// handler runs; shares a transaction: false
	// 422 key-reused replayed: false
	// payments: 1
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
