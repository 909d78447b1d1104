package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

type accountKey struct{}

// requireAccount is an application's auth middleware: it puts the
// authenticated account into the request's context.
func requireAccount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || account == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// The middleware goes after authentication, here around a group of routes
// (a ServeMux mounted under /api/); the handler reaches the store's
// transaction through r.Context().
func Example() {
	store := memstore.New() // in production: idempgx.New(pool) or idemgorm.New(db)
	idempotent, err := idemhttp.New(idemhttp.Config{
		Config: idem.Config{FingerprintKey: fingerprintKey, Store: store},
		Principal: func(r *http.Request) (string, error) {
			account, _ := r.Context().Value(accountKey{}).(string)
			return account, nil
		},
	})
	if err != nil {
		panic(err)
	}

	api := http.NewServeMux() // the group: every route under /api/
	api.HandleFunc("POST /api/payments", func(w http.ResponseWriter, r *http.Request) {
		// With pgx: tx, ok := idempgx.Tx(r.Context()); with GORM:
		// db := idemgorm.DB(r.Context(), db). Writes made there commit
		// together with the stored response, or not at all.
		tx, _ := memstore.TxFrom(r.Context())
		tx.OnCommit(func() { fmt.Println("payment row committed") })
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"pay_1"}`)
	})
	mux := http.NewServeMux()
	mux.Handle("/api/", requireAccount(idempotent(api))) // 1. authenticate, 2. claim the key, 3. route

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", "7f3a")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get(idem.ReplayedHeader) == "true")
	}
	// Output:
	// payment row committed
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance.
var fingerprintKey = []byte("example only: read yours from a secret store")
