package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	_ "github.com/glebarez/go-sqlite" // the application's driver: "sqlite"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	idem "github.com/idemgo/idem/core"
	idemsql "github.com/idemgo/idem/stores/sql"
)

// The code below is shaped as sqlc generates it (package db, file db.go
// and query.sql.go) for the query
//
//	-- name: CreatePayment :one
//	INSERT INTO payments (account, amount) VALUES (?, ?) RETURNING id;

// DBTX is sqlc's interface; *idemsql.Handle satisfies it.
type DBTX interface {
	ExecContext(context.Context, string, ...interface{}) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...interface{}) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...interface{}) *sql.Row
}

func New(db DBTX) *Queries {
	return &Queries{db: db}
}

type Queries struct {
	db DBTX
}

const createPayment = `-- name: CreatePayment :one
INSERT INTO payments (account, amount) VALUES (?, ?) RETURNING id
`

type CreatePaymentParams struct {
	Account string
	Amount  int64
}

func (q *Queries) CreatePayment(ctx context.Context, arg CreatePaymentParams) (int64, error) {
	row := q.db.QueryRowContext(ctx, createPayment, arg.Account, arg.Amount)
	var id int64
	err := row.Scan(&id)
	return id, err
}

// Example serves POST /payments with net/http and idemhttp on the SQL
// store (SQLite here; PostgreSQL and MySQL the same way), and the handler
// runs sqlc's generated code in the idempotency transaction through
// idemsql.Tx: the payment row commits together with the stored response.
// The client's retry is answered from the store, and the handler does not
// run again.
func Example() {
	dir, _ := os.MkdirTemp("", "idemsql-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(dir, "app.db"), 0))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	store, err := idemsql.New(db) // the dialect from the driver: "sqlite"
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // or feed store.Schema() to your migration tool
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.New(idem.Config{Store: store, FingerprintKey: fingerprintKey})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := idemhttp.New(idemhttp.Config{
		Engine:    engine,
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your auth
	})
	if err != nil {
		log.Fatal(err)
	}

	handler := func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idemsql.Tx(r.Context())
		if !ok {
			http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
			return
		}
		id, err := New(tx).CreatePayment(r.Context(), CreatePaymentParams{Account: r.Header.Get("X-Account"), Amount: 1200})
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError) // rolled back, nothing stored
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
	srv := httptest.NewServer(idempotent(http.HandlerFunc(handler)))
	defer srv.Close()

	for range 2 { // a client and its retry
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1200}`))
		req.Header.Set("X-Account", "acct_42")
		req.Header.Set("Idempotency-Key", "order-7")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
	}
	var n int
	_ = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM payments").Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// payments: 1
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
