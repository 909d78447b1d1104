package idemfiber_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// requireAccount is an application's auth middleware: it stores the
// authenticated account with c.Locals.
func requireAccount(c *fiber.Ctx) error {
	account, ok := strings.CutPrefix(c.Get("Authorization"), "Bearer ")
	if !ok || account == "" {
		return fiber.ErrUnauthorized
	}
	c.Locals("account", account) // idemfiber copies the principal; no need to here
	return c.Next()
}

// The middleware goes after authentication; the handler reaches the
// store's transaction through c.UserContext().
func Example() {
	store := memstore.New() // in production: idempgx.New(pool) or idemgorm.New(db)
	idempotent, err := idemfiber.New(idemfiber.Config{
		Config: idem.Config{FingerprintKey: fingerprintKey, Store: store},
		Principal: func(c *fiber.Ctx) (string, error) {
			account, _ := c.Locals("account").(string)
			return account, nil
		},
	})
	if err != nil {
		panic(err)
	}

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(recover.New())                            // outermost: a panic releases the key, then reaches it
	api := app.Group("/", requireAccount, idempotent) // 1. authenticate, 2. claim the key
	api.Post("/payments", func(c *fiber.Ctx) error {  // 3. handle
		// With pgx: tx, ok := idempgx.Tx(c.UserContext()); with GORM:
		// db := idemgorm.DB(c.UserContext(), db). Writes made there commit
		// together with the stored response, or not at all.
		tx, _ := memstore.TxFrom(c.UserContext())
		tx.OnCommit(func() { fmt.Println("payment row committed") })
		return c.Status(http.StatusCreated).JSON(fiber.Map{"id": "pay_1"})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", "7f3a")
		resp, err := app.Test(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idem.ReplayedHeader) == "true")
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
