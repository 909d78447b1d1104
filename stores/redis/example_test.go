package idemredis_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// payments stands for the application's SQL table, whose downstream_key
// column is unique:
//
//	CREATE TABLE payments (id text PRIMARY KEY, downstream_key text UNIQUE NOT NULL, amount int NOT NULL);
//	INSERT INTO payments (id, downstream_key, amount) VALUES ($1, $2, $3)
//	    ON CONFLICT (downstream_key) DO NOTHING;
type payments struct {
	mu    sync.Mutex
	byKey map[string]string // downstream_key → id
}

// insert inserts a payment unless its downstream key exists, and returns
// the row's id either way.
func (p *payments) insert(downstreamKey string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.byKey[downstreamKey]; ok {
		return id
	}
	id := fmt.Sprintf("pay_%d", len(p.byKey)+1)
	p.byKey[downstreamKey] = id
	return id
}

// Example runs the same request twice on a Redis store. The handler writes
// its payment idempotently by its downstream key, because the store shares
// no transaction with it; the second request replays the stored response
// without running the handler.
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
	db := &payments{byKey: map[string]string{}}
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store, Retention: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	handler := func(ctx context.Context) idem.Result {
		h, _ := idemredis.Tx(ctx)
		fmt.Println("handler runs; shares a transaction:", h.Transactional())
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return idem.Result{Status: http.StatusInternalServerError, Err: err}
		}
		id := db.insert(dk)
		return idem.Result{Status: http.StatusCreated, Body: []byte(`{"id":"` + id + `"}`)}
	}
	for range 2 {
		att, resp := engine.Begin(ctx, idem.Request{Method: "POST", Path: "/payments", Principal: "acct_1", Key: "order-7"})
		if att != nil {
			resp = att.Finish(handler(att.Context()))
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
	}
	fmt.Println("payments:", len(db.byKey))
	// Output:
	// handler runs; shares a transaction: false
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
	// payments: 1
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
