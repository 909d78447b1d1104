// Package idemecho is the idem middleware for Echo (v4).
//
// Place it after authentication, on the routes or groups that must be
// idempotent: it reads the principal through Config.Principal (typically
// what the auth middleware stored with c.Set), and a request without one is
// refused with 401 before anything is claimed.
//
//	mw, err := idemecho.New(idemecho.Config{
//		Config: idem.Config{Store: store},
//		Principal: func(c echo.Context) (string, error) {
//			account, _ := c.Get("account").(string)
//			return account, nil
//		},
//	})
//	api := e.Group("", authenticate)
//	api.POST("/payments", createPayment, mw)
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
	"github.com/labstack/echo/v4"
)

// Config configures the middleware: the engine's Config plus how to read the
// authenticated principal.
type Config struct {
	idem.Config
	// Principal returns the authenticated caller of the request, as the auth
	// middleware before this one left it (c.Get, a JWT claim). An empty result
	// or an error answers 401 and claims nothing; the error goes into the Event
	// and is logged at Warn. Required.
	Principal func(c echo.Context) (string, error)
}

// New validates cfg and returns the middleware.
//
// The handler after it runs with c.Response().Writer buffering the whole
// response and c.Request() carrying the attempt's context (the store's
// transaction and the request deadline) and the request body. The error it
// returns is the handler's error: it is rendered by the HTTPErrorHandler
// into the buffer, and by default such an outcome is released, not stored.
func New(cfg Config) (echo.MiddlewareFunc, error) {
	a, err := idem.NewAdapter("idemecho", cfg.Config, cfg.Principal)
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
			a.HandleHTTP(c, res, req, func(r2 *http.Request, buf *idem.ResponseBuffer) error {
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
