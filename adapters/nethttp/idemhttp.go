// Package idemhttp is the idem middleware for net/http and any router that
// takes func(http.Handler) http.Handler middleware (chi, gorilla/mux, the
// standard library's ServeMux).
//
// Place it after authentication: it reads the principal through
// Config.Principal, and a request without one is refused with 401 before
// anything is claimed.
//
//	mw, err := idemhttp.New(idemhttp.Config{
//		Config:    idem.Config{Store: store, FingerprintKey: key},
//		Principal: func(r *http.Request) (string, error) { return auth.Account(r.Context()), nil },
//	})
//	mux.Handle("POST /payments", authenticate(mw(createPayment)))
//
// Handlers reach the store's transaction through r.Context() with the
// store's accessor (idempgx.Tx, idemgorm.DB).
package idemhttp

import (
	"net/http"

	idem "github.com/idemgo/idem/core"
)

// Config configures the middleware: the engine's Config plus how to read the
// authenticated principal.
type Config struct {
	idem.Config
	// Principal returns the authenticated caller of r, as the auth middleware
	// before this one left it. An empty result or an error answers 401 and
	// claims nothing; the error goes into the Event and is logged at Warn.
	// Required.
	Principal func(r *http.Request) (string, error)
}

// New validates cfg and returns the middleware. The middleware buffers the
// handler's whole response and sends it only after the outcome is
// committed; http.Flusher is a no-op and hijacking is not offered.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	a, err := idem.NewAdapter("idemhttp", cfg.Config, cfg.Principal)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.HandleHTTP(r, w, r, func(r2 *http.Request, buf *idem.ResponseBuffer) error {
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
