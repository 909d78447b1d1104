// Package idemhttp is the idem middleware for net/http and any router that
// takes func(http.Handler) http.Handler middleware (chi, gorilla/mux, the
// standard library's ServeMux).
//
// Build the engine once with idem.New and hand it to the middleware, the
// idem.Sweeper and anything calling Engine.Do. Place the middleware after
// authentication: it reads the principal through Config.Principal, and a
// request without one is refused with 401 before anything is claimed. A
// service's main, with PostgreSQL and Prometheus (Example runs the same on
// memstore):
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
//		idempotent, err := idemhttp.New(idemhttp.Config{
//			Engine: eng,
//			Principal: func(r *http.Request) (string, error) {
//				account, _ := r.Context().Value(accountKey{}).(string) // what requireAccount stored
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
//		mux := http.NewServeMux()
//		// After authentication: keys are claimed per principal, which
//		// requireAccount sets; before it, every request is answered 401.
//		// Around a group of routes, wrap a ServeMux the same way.
//		mux.Handle("POST /payments", requireAccount(idempotent(http.HandlerFunc(createPayment))))
//
//		srv := &http.Server{Addr: ":8080", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
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
// Handlers reach the store's transaction through r.Context() with the
// store's accessor (idempgx.Tx, idemgorm.DB).
package idemhttp

import (
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
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
	// Principal returns the authenticated caller of r, as the auth middleware
	// before this one left it. An empty result or an error answers 401 and
	// claims nothing; the error goes into the Event and is logged at Warn.
	// Required.
	Principal func(r *http.Request) (string, error)
}

// New returns the middleware running on cfg.Engine. It fails with an error
// wrapping idem.ErrInvalidConfig, naming the field, when Engine or
// Principal is nil.
//
// The middleware buffers the handler's whole response and sends it only
// after the outcome is committed; http.Flusher is a no-op and hijacking is
// not offered.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	a, err := idemadapter.NewAdapter("idemhttp", cfg.Engine, cfg.Principal)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.HandleHTTP(r, w, r, func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
				if buf == nil {
					next.ServeHTTP(w, r2)
					return nil
				}
				next.ServeHTTP(buf, r2)
				return nil
			})
		})
	}, nil
}
