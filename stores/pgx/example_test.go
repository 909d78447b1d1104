package idempgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

// A payment handler whose insert commits together with the stored response.
// The second attempt with the same key is answered from the store, and the
// handler does not run again. In a service, an adapter (idemhttp, idemgin,
// idemecho, idemfiber) makes the engine calls shown here; the handler's part
// is the same: idempgx.Tx(ctx).
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("IDEM_PG_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	store, err := idempgx.New(pool, idempgx.WithTable("example_idempotency_keys"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // or run store.Schema() with your own tool
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_payments (
		id text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store})
	if err != nil {
		log.Fatal(err)
	}

	// The handler writes through the store's transaction.
	createPayment := func(ctx context.Context, account, id string) (int, []byte) {
		tx, ok := idempgx.Tx(ctx)
		if !ok {
			return http.StatusInternalServerError, nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO example_payments (id, account, amount) VALUES ($1, $2, $3)`,
			id, account, 1000); err != nil {
			return http.StatusInternalServerError, nil // released: the retry runs again
		}
		return http.StatusCreated, []byte(`{"status":"succeeded"}`)
	}

	var b [8]byte
	_, _ = rand.Read(b[:])
	key := hex.EncodeToString(b[:]) // the client's Idempotency-Key
	for range 2 {                   // the client retries
		attempt, resp := engine.Begin(ctx, idem.Request{
			Method: http.MethodPost, Path: "/payments", Principal: "acct_1", Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1000,"currency":"EUR"}`),
		})
		if attempt != nil { // claimed: run the handler
			func() {
				defer attempt.Abort() // a panicking handler releases the key
				status, body := createPayment(attempt.Context(), "acct_1", "pay_"+key)
				resp = attempt.Finish(idem.Result{Status: status, Body: body,
					Header: http.Header{"Content-Type": {"application/json"}}})
			}()
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
	}

	var payments int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM example_payments WHERE id = $1`, "pay_"+key).Scan(&payments)
	fmt.Println("payments:", payments)
	// Output:
	// 201 {"status":"succeeded"} replayed: false
	// 201 {"status":"succeeded"} replayed: true
	// payments: 1
}

// A handler's queries go through the Handle that Tx returns. Code that sqlc
// generates takes it (queries := db.New(tx)), and pgx.BeginFunc runs
// optional work in a savepoint whose failure undoes that work only. The
// handle has no Commit or Rollback: the store commits the handler's writes
// with the stored response after the handler returns, and an error
// returned rolls them back, so defer tx.Rollback(ctx) does not compile.
func ExampleTx() {
	createPayment := func(ctx context.Context, id, account string, amount int64) error {
		tx, ok := idempgx.Tx(ctx)
		if !ok {
			return errors.New("no idempotency transaction")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, account, amount) VALUES ($1, $2, $3)`,
			id, account, amount); err != nil {
			return err // the store rolls back and releases the key: the retry runs again
		}
		// Tagging is optional: its failure must not cost the payment.
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, `INSERT INTO payment_tags (payment_id, tag) VALUES ($1, 'first')`, id)
			return err
		}); err != nil {
			log.Printf("payment %s stays untagged: %v", id, err)
		}
		return nil // committed with the stored response
	}
	_ = createPayment
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
