// Package idemechotest mounts the Echo adapter for core/adaptertest:
// Harness serves the suite's handler behind idemecho's middleware, placed
// as the suite's Setup asks (on a route group or the whole Echo, after an
// auth middleware or, wrongly, before it), under Echo's Recover
// middleware, on a real server on 127.0.0.1. The adapter's own tests and
// the conformance module (which runs the suite against every store) share
// it. It imports only core and Echo.
package idemechotest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	idemecho "github.com/idemgo/idem/adapters/echo"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Set, the Echo idiom.
func Authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := adaptertest.Principal(c.Request().Header.Get("Authorization")); p != "" {
			c.Set("principal", p)
		}
		return next(c)
	}
}

// Principal is the adapter's principal function: it reads back what
// Authenticate stored.
func Principal(c echo.Context) (string, error) {
	p, _ := c.Get("principal").(string)
	return p, nil
}

// NewEcho returns an Echo with its usual Recover middleware, quiet.
func NewEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	return e
}

// Handler runs the suite's handler as a native Echo handler.
func Handler(h adaptertest.Handler) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		body, _ := io.ReadAll(req.Body)
		reply := h(req.Context(), adaptertest.Request{
			Method: req.Method, Path: req.URL.Path, Header: req.Header, Body: body,
			WriteEarly: func(p []byte) {
				_, _ = c.Response().Write(p)
				c.Response().Flush()
			},
		})
		if reply.Err != nil {
			status := reply.Status
			if status == 0 {
				status = http.StatusInternalServerError
			}
			return echo.NewHTTPError(status, http.StatusText(status)).SetInternal(reply.Err)
		}
		if reply.Status != 0 || reply.Panic == nil {
			for k, v := range reply.Header {
				c.Response().Header()[k] = v
			}
			c.Response().WriteHeader(reply.Status)
			_, _ = c.Response().Write(reply.Body)
		}
		if reply.Panic != nil {
			panic(reply.Panic)
		}
		return nil
	}
}

// Harness mounts idemecho for core/adaptertest: NewEcho, the Setup's early
// headers, Authenticate and the middleware as the Setup places them, then
// Handler, on an httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, s adaptertest.Setup) (string, error) {
		engine, err := adaptertest.Engine(s)
		if err != nil {
			return "", err
		}
		mw, err := idemecho.New(idemecho.Config{Engine: engine, Principal: adaptertest.PrincipalFunc(s, Principal)})
		if err != nil {
			return "", err
		}
		global, group := adaptertest.Place(s, Authenticate, mw)
		e := NewEcho()
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error {
				for k, v := range s.Header {
					c.Response().Header()[k] = v
				}
				return next(c)
			}
		})
		e.Use(global...)
		h := Handler(s.Handler)
		e.Any("/outside", h)
		api := e.Group("/payments", group...)
		api.Any("", h)
		api.Any("/*", h)
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}
