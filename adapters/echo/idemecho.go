// Package idemecho is the idem middleware for Echo (v4).
//
// Build the engine once with idem.New and hand it to the middleware, the
// idem.Sweeper and anything calling Engine.Do. Place the middleware after
// authentication, on the routes or groups that must be idempotent: it reads
// the principal through Config.Principal (typically what the auth
// middleware stored with c.Set), and a request without one is refused with
// 401 before anything is claimed. A service's main, with PostgreSQL and
// Prometheus (Example runs the same on memstore):
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//
//		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer pool.Close()
//		store, err := idempgx.New(pool) // or idemgorm.New(db)
//		if err != nil {
//			log.Fatal(err)
//		}
//		// Migrate creates the table; when your migration tool applies the
//		// store's migration, call store.Check(ctx) instead.
//		if err := store.Migrate(ctx); err != nil {
//			log.Fatal(err)
//		}
//		// At least 32 random bytes (openssl rand -hex 32) from your secret
//		// store, the same on every instance.
//		key, err := hex.DecodeString(os.Getenv("IDEM_FINGERPRINT_KEY"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		metrics, err := idemprom.New(prometheus.DefaultRegisterer, idemprom.Options{})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// One engine for the process: every middleware and interceptor, the
//		// Sweeper and Engine.Do share it. New fails on an invalid Config or a
//		// store without its table.
//		eng, err := idem.New(idem.Config{Store: store, FingerprintKey: key, Observer: metrics})
//		if err != nil {
//			log.Fatal(err)
//		}
//		idempotent, err := idemecho.New(idemecho.Config{
//			Engine: eng,
//			Principal: func(c echo.Context) (string, error) {
//				account, _ := c.Get("account").(string) // what requireAccount stored
//				return account, nil
//			},
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// Only the sweeper deletes expired records and resolves the stale
//		// claims no client retries.
//		go (&idem.Sweeper{Engine: eng, Observer: metrics}).Run(ctx)
//
//		e := echo.New()
//		e.Use(middleware.Recover()) // outermost: it sees the real writer again on a panic
//		// After authentication: keys are claimed per principal, which
//		// requireAccount sets; before it, every request is answered 401.
//		api := e.Group("", requireAccount, idempotent)
//		api.POST("/payments", createPayment)
//
//		srv := &http.Server{Addr: ":8080", Handler: e, ReadHeaderTimeout: 10 * time.Second}
//		go func() {
//			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
//				log.Fatal(err)
//			}
//		}()
//		<-ctx.Done()
//		// Running handlers get their RequestTimeout, then StoreTimeout to
//		// commit.
//		c := eng.Config()
//		shutdown, cancel := context.WithTimeout(context.Background(), c.RequestTimeout+c.StoreTimeout)
//		defer cancel()
//		if err := srv.Shutdown(shutdown); err != nil {
//			log.Print(err)
//		}
//	}
//
// Handlers reach the store's transaction through c.Request().Context() with
// the store's accessor (idempgx.Tx, idemgorm.DB); echo.Context is not a
// context.Context.
//
// While the handler runs, c.Response().Writer is a buffer: nothing reaches
// the client before the outcome is committed, and c.Response().Flush does
// nothing (instead of panicking). An error the handler returns is rendered
// by the Echo's HTTPErrorHandler inside the middleware, into the buffer, so
// the error response is classified like any other; the middleware then
// returns nil. A panic leaves the real writer in place for the Recover
// middleware further out.
package idemecho

import (
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/labstack/echo/v4"
)

// Config configures the middleware: the engine it runs on and how to read
// the authenticated principal.
type Config struct {
	// Engine runs the idempotency state machine. Required. Build it once
	// with idem.New and share it across every middleware and interceptor,
	// the idem.Sweeper and Engine.Do: the per-route hold times behind
	// Retry-After and the MaxInFlightPerPrincipal limit are the engine's
	// own, so a second engine over the same store keeps a second set.
	Engine *idem.Engine
	// Principal returns the authenticated caller of the request, as the auth
	// middleware before this one left it (c.Get, a JWT claim). An empty result
	// or an error answers 401 and claims nothing; the error goes into the Event
	// and is logged at Warn. Required.
	Principal func(c echo.Context) (string, error)
}

// New returns the middleware running on cfg.Engine. It fails with an error
// wrapping idem.ErrInvalidConfig, naming the field, when Engine or
// Principal is nil.
//
// The handler after it runs with c.Response().Writer buffering the whole
// response and c.Request() carrying the attempt's context (the store's
// transaction and the request deadline) and the request body. The error it
// returns is the handler's error: it is rendered by the HTTPErrorHandler
// into the buffer, and by default such an outcome is released, not stored.
func New(cfg Config) (echo.MiddlewareFunc, error) {
	a, err := idemadapter.NewAdapter("idemecho", cfg.Engine, cfg.Principal)
	if err != nil {
		return nil, err
	}
	// The route Echo's router matched, set before e.Use and group
	// middleware run; "" in e.Pre middleware, which runs before routing.
	a.Route = func(c echo.Context) string { return c.Path() }
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			res, req := c.Response(), c.Request()
			var unbuffered error
			// The final response goes through echo's Response, so the
			// middleware further out (a logger) sees its status and size.
			a.HandleHTTP(c, res, req, func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
				if buf == nil {
					unbuffered = next(c)
					return nil
				}
				w, status, size, committed := res.Writer, res.Status, res.Size, res.Committed
				res.Writer = buf
				c.SetRequest(r2)
				// Put the real writer and its state back before anything
				// else happens, a panic included: Recover further out must
				// render its 500 to the client, and must not find the
				// response committed by what the handler buffered.
				defer func() {
					res.Writer, res.Status, res.Size, res.Committed = w, status, size, committed
					c.SetRequest(req)
				}()
				herr := next(c)
				if herr != nil {
					// A handler that wrote before failing left the response
					// committed, and the error handler would then write
					// nothing: start the response over for the error.
					res.Status, res.Size, res.Committed = http.StatusOK, 0, false
					buf.Reset()
					c.Error(herr)
				}
				return herr
			})
			return unbuffered
		}
	}, nil
}
