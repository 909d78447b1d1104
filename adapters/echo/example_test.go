package idemecho_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

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

// createPayment writes in the store's transaction, which it reaches
// through c.Request().Context(): with pgx, tx, _ := idempgx.Tx(ctx); with
// GORM, db := idemgorm.DB(ctx, db). What it writes there commits together
// with the stored response, or not at all.
func createPayment(c echo.Context) error {
	tx, _ := memstore.Tx(c.Request().Context())
	tx.OnCommit(func() { fmt.Println("payment row committed") })
	return c.JSON(http.StatusCreated, echo.Map{"id": "pay_1"})
}

// Example is a service's main, on memstore: the store, one engine, the
// middleware after authentication, the sweeper, an observer and a graceful
// shutdown. The comments say what production uses instead.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// With PostgreSQL: store, err := idempgx.New(pool), then
	// store.Migrate(ctx), or store.Check(ctx) when your migration tool
	// applies idempgx's migration. memstore has nothing to migrate.
	store := memstore.MustNew()

	// One engine for the process: every middleware, the Sweeper and
	// Engine.Do share it. New checks the store: one without its table
	// fails here, not at the first request.
	eng, err := idem.New(idem.Config{
		Store:          store,
		FingerprintKey: fingerprintKey,
		// In production: idemprom.New(prometheus.DefaultRegisterer, idemprom.Options{}),
		// or Logger: slog.Default() for one line per request.
		Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { fmt.Println("observed:", ev.Outcome, ev.Route) }),
	})
	if err != nil {
		log.Fatal(err)
	}
	idempotent, err := idemecho.New(idemecho.Config{
		Engine: eng,
		Principal: func(c echo.Context) (string, error) {
			account, _ := c.Get("account").(string) // what requireAccount stored
			return account, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	// Only the sweeper deletes expired records and resolves the stale
	// claims no client retries.
	sweeper := &idem.Sweeper{Engine: eng}
	swept := make(chan error, 1)
	go func() { swept <- sweeper.Run(ctx) }()

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.Recover()) // outermost: it sees the real writer again on a panic
	// After authentication: keys are claimed per principal, which
	// requireAccount sets; before it, every request would be 401.
	api := e.Group("", requireAccount, idempotent)
	api.POST("/payments", createPayment)

	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // in production: your port
	if err != nil {
		log.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	for range 2 { // a client and its retry
		fmt.Println(post("http://"+ln.Addr().String()+"/payments", "alice", "7f3a"))
	}

	stop() // in production: SIGTERM
	<-ctx.Done()
	// Running handlers get their RequestTimeout, then StoreTimeout to
	// commit.
	c := eng.Config()
	shutdown, cancel := context.WithTimeout(context.Background(), c.RequestTimeout+c.StoreTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		log.Print(err)
	}
	fmt.Println(<-served, <-swept)
	// Output:
	// payment row committed
	// observed: claimed /payments
	// 201 {"id":"pay_1"} replayed: false
	// observed: replayed /payments
	// 201 {"id":"pay_1"} replayed: true
	// http: Server closed context canceled
}

// post sends a payment as account under the idempotency key and returns
// the status, the body and whether it was a replay.
func post(url, account, key string) string {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1000}`))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s replayed: %v", resp.StatusCode, strings.TrimSpace(string(body)), resp.Header.Get(idem.ReplayedHeader) == "true")
}

// fingerprintKey stands for the service's idem.Config.FingerprintKey: in
// production, at least 32 random bytes read from a secret store, the same
// on every instance (hex.DecodeString(os.Getenv("IDEM_FINGERPRINT_KEY"))).
var fingerprintKey = []byte("example only: read yours from a secret store")
