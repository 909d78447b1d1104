// Package idemgin is the idem middleware for Gin.
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
//		idempotent, err := idemgin.New(idemgin.Config{
//			Engine:    eng,
//			Principal: func(c *gin.Context) (string, error) { return c.GetString("account"), nil }, // what requireAccount stored
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// Only the sweeper deletes expired records and resolves the stale
//		// claims no client retries.
//		go (&idem.Sweeper{Engine: eng, Observer: metrics}).Run(ctx)
//
//		r := gin.New()
//		r.Use(gin.Recovery()) // outermost: it sees the real writer again on a panic
//		// After authentication: keys are claimed per principal, which
//		// requireAccount sets; before it, every request is answered 401.
//		api := r.Group("/", requireAccount, idempotent)
//		api.POST("/payments", createPayment)
//
//		srv := &http.Server{Addr: ":8080", Handler: r, ReadHeaderTimeout: 10 * time.Second}
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
// Handlers reach the store's transaction through c.Request.Context() with
// the store's accessor (idempgx.Tx, idemgorm.DB). The *gin.Context itself
// only forwards Value to the request's context when the engine's
// ContextWithFallback is true, so pass c.Request.Context(), not c.
//
// While the handler runs, c.Writer is a buffer: nothing reaches the client
// before the outcome is committed. Flush does nothing, Hijack is refused
// with ErrHijack, and Pusher is nil. The real writer is put back before a
// panic travels on to gin.Recovery, so the recovery's 500 reaches the
// client.
package idemgin

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
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
	// Principal returns the authenticated caller of the request, as the auth
	// middleware before this one left it (c.Get, a JWT claim). An empty result
	// or an error answers 401 and claims nothing; the error goes into the Event
	// and is logged at Warn. Required.
	Principal func(c *gin.Context) (string, error)
}

// ErrHijack is returned by the buffering writer's Hijack: a hijacked
// connection would bypass the buffer, so its bytes could reach the client
// before, or without, the commit.
var ErrHijack = errors.New("idemgin: hijacking the connection is refused on an idempotent route: the response is buffered until the outcome is committed")

// New returns the middleware running on cfg.Engine. It fails with an error
// wrapping idem.ErrInvalidConfig, naming the field, when Engine or
// Principal is nil.
//
// The handlers after it run with c.Writer buffering the whole response and
// c.Request carrying the attempt's context (the store's transaction and the
// request deadline) and the request body. The errors handlers attach to
// c.Errors while it runs are the handler's error: by default such an
// outcome is released, not stored. When the engine answers by itself (a
// replay, a 409, a 422, a 400 or 401 problem) the rest of the chain is
// aborted.
func New(cfg Config) (gin.HandlerFunc, error) {
	a, err := idemadapter.NewAdapter("idemgin", cfg.Engine, cfg.Principal)
	if err != nil {
		return nil, err
	}
	// The matched route, group prefix included ("/api/payments/:id"): Gin
	// routes before any middleware runs, r.Use's included.
	a.Route = func(c *gin.Context) string { return c.FullPath() }
	return func(c *gin.Context) {
		orig, origReq := c.Writer, c.Request
		ran := false
		a.HandleHTTP(c, orig, origReq, func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
			ran = true
			if buf == nil {
				c.Next()
				return nil
			}
			w := &responseWriter{ResponseBuffer: buf, status: http.StatusOK, size: -1, done: origReq.Context()}
			errs := len(c.Errors)
			c.Writer, c.Request = w, r2
			// *gin.Context passes only string keys through to Value unless
			// the engine's ContextWithFallback is set: store the attempt's
			// context under one, so that a handler passing c itself to a
			// store's accessor (idemgorm.DB(c, db)) or to DownstreamKey
			// finds the transaction instead of falling back.
			c.Set(idemadapter.ContextKey, r2.Context())
			defer c.Set(idemadapter.ContextKey, nil)
			// Put the real writer back before anything else happens, a
			// panic included: a recovery middleware further out must write
			// to the client, not into this buffer.
			defer func() {
				w.stop()
				c.Writer, c.Request = orig, origReq
			}()
			c.Next()
			// Gin sends a status set without a body when the request
			// ends; do the same to the buffer so it is stored.
			w.WriteHeaderNow()
			return handlerError(c.Errors[errs:])
		})
		if !ran {
			// The engine answered (replay, conflict, problem): the
			// handlers after this middleware must not run.
			c.Abort()
		}
	}, nil
}

// handlerError joins the errors the handlers attached with c.Error.
func handlerError(errs []*gin.Error) error {
	if len(errs) == 0 {
		return nil
	}
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// responseWriter is the gin.ResponseWriter installed while the handler runs.
// It keeps gin's own semantics on top of the buffer: WriteHeader only
// records the status, which may change until the first write; Size is -1
// and Written false until the header is written.
type responseWriter struct {
	*idemadapter.ResponseBuffer
	status int
	size   int

	done      context.Context // the client's request context
	closeCh   chan bool
	stopClose func() bool
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

// WriteHeader records code as the status to send, unless the header was
// already written.
func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

// WriteHeaderNow writes the recorded status to the buffer.
func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseBuffer.WriteHeader(w.status)
	}
}

// Write buffers p.
func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseBuffer.Write(p)
	w.size += n
	return n, err
}

// WriteString buffers s.
func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseBuffer.WriteString(s)
	w.size += n
	return n, err
}

// Status returns the recorded status (200 until set).
func (w *responseWriter) Status() int { return w.status }

// Size returns the number of body bytes written, or -1 before the header
// was written.
func (w *responseWriter) Size() int { return w.size }

// Written reports whether the header was written.
func (w *responseWriter) Written() bool { return w.size != -1 }

// Flush writes the header to the buffer, as gin's writer does, and sends
// nothing: the response leaves only after the commit.
func (w *responseWriter) Flush() { w.WriteHeaderNow() }

// Hijack is refused with ErrHijack.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijack
}

// Pusher returns nil: there is no server push from a buffered response.
func (w *responseWriter) Pusher() http.Pusher { return nil }

// CloseNotify returns a channel that receives true when the client's
// request is cancelled (the client went away).
func (w *responseWriter) CloseNotify() <-chan bool {
	if w.closeCh == nil {
		ch := make(chan bool, 1)
		w.closeCh = ch
		w.stopClose = context.AfterFunc(w.done, func() { ch <- true })
	}
	return w.closeCh
}

func (w *responseWriter) stop() {
	if w.stopClose != nil {
		w.stopClose()
	}
}
