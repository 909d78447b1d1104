package idemredis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// pgDSN is the PostgreSQL database the recipe test writes its business
// table to: IDEM_PG_DSN, or the local test database.
func pgDSN() string {
	if v := os.Getenv("IDEM_PG_DSN"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// paymentRequest is the request body of the recipe's handler.
type paymentRequest struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// errKeyReused is the handler's error for a key whose business row is
// another request's: returned with the 422, it makes the default
// classifier release the key instead of storing the 422.
var errKeyReused = errors.New("the payment of this downstream key is another request's")

// createPayment is the README's recipe on PostgreSQL: the payment row
// carries the request's downstream key in a unique column and the request's
// own fields; it is inserted with ON CONFLICT DO NOTHING, read back when an
// earlier attempt wrote it, and compared with the request before anything
// is answered from it.
func createPayment(db *pgx.Conn, table string) func(ctx context.Context, body []byte) idem.Result {
	return func(ctx context.Context, body []byte) idem.Result {
		if _, ok := idemredis.Tx(ctx); !ok {
			return idem.Result{Status: http.StatusInternalServerError, Err: errors.New("no idemredis handle")}
		}
		var req paymentRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return idem.Result{Status: http.StatusBadRequest, Body: []byte(`{"error":"invalid body"}`)}
		}
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return idem.Result{Status: http.StatusInternalServerError, Err: err}
		}
		var (
			id  string
			row paymentRequest
		)
		err = db.QueryRow(ctx, `INSERT INTO `+table+` (id, downstream_key, account, amount, currency)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (downstream_key) DO NOTHING
			RETURNING id, account, amount, currency`,
			"pay_"+idemredistest.RandHex(6), dk, req.Account, req.Amount, req.Currency).Scan(&id, &row.Account, &row.Amount, &row.Currency)
		if errors.Is(err, pgx.ErrNoRows) {
			// An earlier attempt at this key wrote the row.
			err = db.QueryRow(ctx, `SELECT id, account, amount, currency FROM `+table+` WHERE downstream_key = $1`, dk).
				Scan(&id, &row.Account, &row.Amount, &row.Currency)
		}
		if err != nil {
			return idem.Result{Status: http.StatusInternalServerError, Err: err}
		}
		if row != req {
			p := idem.NewProblem(idem.ProblemKeyReused).Response(0)
			return idem.Result{Status: p.Status, Header: p.Header, Body: p.Body, Err: errKeyReused}
		}
		return idem.Result{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
			Body: fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, row.Amount)}
	}
}

// TestRecipeAfterALostRecord plays the README's recipe against PostgreSQL:
// a payment is made, Redis loses its record (the key is deleted, as a
// restart without persistence or an eviction does), and the same key comes
// again with another body. The engine cannot see the reuse (the record
// holding the first fingerprint is gone), so the handler does: the unique
// column turns its insert into a read of the first payment, which is not
// this request's, and it answers 422 key-reused, storing nothing. The first
// request, retried, gets its own payment back from the row. One payment.
func TestRecipeAfterALostRecord(t *testing.T) {
	ctx := testCtx(t)
	db, err := pgx.Connect(ctx, pgDSN())
	if err != nil {
		t.Fatalf("the recipe test needs PostgreSQL at %s (IDEM_PG_DSN): %v; `make services` starts it", pgDSN(), err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	table := "idemredis_payments_" + idemredistest.RandHex(4)
	_, err = db.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, downstream_key text UNIQUE NOT NULL,
		account text NOT NULL, amount bigint NOT NULL, currency text NOT NULL)`)
	mustNil(t, err)
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), `DROP TABLE `+table) })

	env := newEnv(t)
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: env.Store})
	mustNil(t, err)
	handler := createPayment(db, table)
	pay := func(key, body string) *idem.Response {
		t.Helper()
		att, resp := eng.Begin(ctx, idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice", Key: key,
			ContentType: "application/json", Body: strings.NewReader(body)})
		if att == nil {
			return resp
		}
		defer att.Abort()
		return att.Finish(handler(att.Context(), att.Body()))
	}
	const (
		first = `{"account":"acct_1","amount":100,"currency":"EUR"}`
		other = `{"account":"acct_1","amount":999,"currency":"EUR"}`
	)
	key := "order-" + idemredistest.RandHex(4)
	paid := pay(key, first)
	if paid.Status != http.StatusCreated {
		t.Fatalf("first payment: %d %s", paid.Status, paid.Body)
	}
	if r := pay(key, other); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("the key reused while its record stands: %d %s, want the engine's 422", r.Status, r.Body)
	}

	// Redis loses the record.
	mustNil(t, env.Client.Del(ctx, env.Store.RecordKey("alice", key)).Err())
	if _, err := env.Store.Get(ctx, "alice", key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record after the loss: %v, want ErrNotFound", err)
	}
	for i := range 2 {
		r := pay(key, other)
		if r.Status != http.StatusUnprocessableEntity || !bytes.Contains(r.Body, []byte(idem.ProblemKeyReused)) ||
			r.Header.Get(idem.ReplayedHeader) == "true" {
			t.Fatalf("the key reused with another body after its record was lost (%d): %d %v %s; want 422 %s from the handler",
				i, r.Status, r.Header, r.Body, idem.ProblemKeyReused)
		}
	}
	var rows int
	var amount int64
	mustNil(t, db.QueryRow(ctx, `SELECT count(*), max(amount) FROM `+table).Scan(&rows, &amount))
	if rows != 1 || amount != 100 {
		t.Fatalf("%d payments, amount %d; want the first one alone", rows, amount)
	}

	// The first request's retry is answered from its row, then replayed.
	for i, wantReplay := range []bool{false, true} {
		r := pay(key, first)
		if r.Status != http.StatusCreated || !bytes.Equal(r.Body, paid.Body) || (r.Header.Get(idem.ReplayedHeader) == "true") != wantReplay {
			t.Fatalf("retry %d of the first request: %d %v %s, want 201 %s (replayed %v)", i, r.Status, r.Header, r.Body, paid.Body, wantReplay)
		}
	}
	t.Logf("after the lost record: the other body got 422 %s twice (nothing stored), the first request its payment %s; 1 row",
		strings.TrimPrefix(string(idem.ProblemKeyReused), idem.ProblemTypeBase), paid.Body)
}
