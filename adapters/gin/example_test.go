package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// requireAccount is an application's auth middleware: it stores the
// authenticated account with c.Set.
func requireAccount(c *gin.Context) {
	account, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || account == "" {
		c.AbortWithStatus(http.StatusUnauthorized)
		return
	}
	c.Set("account", account)
	c.Next()
}

// The middleware goes after authentication; the handler reaches the
// store's transaction through c.Request.Context().
func Example() {
	gin.SetMode(gin.ReleaseMode)
	store := memstore.New() // in production: idempgx.New(pool) or idemgorm.New(db)
	idempotent, err := idemgin.New(idemgin.Config{
		Config:    idem.Config{FingerprintKey: fingerprintKey, Store: store},
		Principal: func(c *gin.Context) (string, error) { return c.GetString("account"), nil },
	})
	if err != nil {
		panic(err)
	}

	r := gin.New()
	r.Use(gin.Recovery())                           // outermost: it sees the real writer again on a panic
	api := r.Group("/", requireAccount, idempotent) // 1. authenticate, 2. claim the key
	api.POST("/payments", func(c *gin.Context) {    // 3. handle
		// With pgx: tx, ok := idempgx.Tx(c.Request.Context()); with GORM:
		// db := idemgorm.DB(c.Request.Context(), db). Writes made there commit
		// together with the stored response, or not at all.
		tx, _ := memstore.TxFrom(c.Request.Context())
		tx.OnCommit(func() { fmt.Println("payment row committed") })
		c.JSON(http.StatusCreated, gin.H{"id": "pay_1"})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", "7f3a")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
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
