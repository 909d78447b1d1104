package idemgorm_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/glebarez/sqlite"
	idem "github.com/idemgo/idem/core"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Payment is the application's own table, written in the idempotency
// transaction.
type Payment struct {
	ID     uint `gorm:"primaryKey"`
	Amount int
}

// Example wires a GORM store into the idem engine on an SQLite file and
// runs one request twice: the handler writes its payment through
// idemgorm.DB, in the transaction that also stores the response, and the
// retry is answered from the store without running the handler again.
// Adapters (net/http, Gin, Echo, Fiber) make the Begin/Finish calls for you.
func Example() {
	dir, _ := os.MkdirTemp("", "idemgorm-example")
	defer os.RemoveAll(dir)

	db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(filepath.Join(dir, "app.db"), 0)),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	store, err := idemgorm.New(db) // dialect from db: "sqlite"
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil { // or feed store.Schema() to your migration tool
		panic(err)
	}
	if err := db.AutoMigrate(&Payment{}); err != nil {
		panic(err)
	}
	engine, err := idem.New(idem.Config{FingerprintKey: fingerprintKey, Store: store})
	if err != nil {
		panic(err)
	}

	// The handler: idemgorm.DB gives it the idempotency transaction (or db
	// itself when the request runs without a key).
	createPayment := func(ctx context.Context) (int, string) {
		p := Payment{Amount: 1200}
		if err := idemgorm.DB(ctx, db).Create(&p).Error; err != nil {
			return http.StatusInternalServerError, "" // released, not stored: the retry runs again
		}
		return http.StatusCreated, fmt.Sprintf(`{"id":%d}`, p.ID)
	}

	for range 2 {
		attempt, resp := engine.Begin(ctx, idem.Request{
			Method: http.MethodPost, Path: "/payments", Principal: "acct_42",
			Key: "order-7", ContentType: "application/json", Body: strings.NewReader(`{"amount":1200}`),
		})
		if attempt != nil {
			status, body := createPayment(attempt.Context())
			resp = attempt.Finish(idem.Result{Status: status, Body: []byte(body),
				Header: http.Header{"Content-Type": {"application/json"}}})
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
	}

	var n int64
	db.Model(&Payment{}).Count(&n)
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
