package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	idemecho "github.com/idemgo/idem/adapters/echo"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// requireAccount is an application's auth middleware: it stores the
// authenticated account with c.Set.
func requireAccount(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		account, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		if !ok || account == "" {
			return echo.ErrUnauthorized
		}
		c.Set("account", account)
		return next(c)
	}
}

// The middleware goes after authentication; the handler reaches the
// store's transaction through c.Request().Context().
func Example() {
	store := memstore.New() // in production: idempgx.New(pool) or idemgorm.New(db)
	idempotent, err := idemecho.New(idemecho.Config{
		Config: idem.Config{FingerprintKey: fingerprintKey, Store: store},
		Principal: func(c echo.Context) (string, error) {
			account, _ := c.Get("account").(string)
			return account, nil
		},
	})
	if err != nil {
		panic(err)
	}

	e := echo.New()
	e.Use(middleware.Recover())                        // outermost: it sees the real writer again on a panic
	api := e.Group("", requireAccount, idempotent)     // 1. authenticate, 2. claim the key
	api.POST("/payments", func(c echo.Context) error { // 3. handle
		// With pgx: tx, ok := idempgx.Tx(c.Request().Context()); with GORM:
		// db := idemgorm.DB(c.Request().Context(), db). Writes made there
		// commit together with the stored response, or not at all.
		tx, _ := memstore.TxFrom(c.Request().Context())
		tx.OnCommit(func() { fmt.Println("payment row committed") })
		return c.JSON(http.StatusCreated, echo.Map{"id": "pay_1"})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", "7f3a")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get(idem.ReplayedHeader) == "true")
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
