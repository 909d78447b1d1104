// Package idemechotest mounts the Echo adapter for core/adaptertest:
// Harness serves the suite's handler behind idemecho's middleware, placed
// after an auth middleware on a route group, under Echo's Recover
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
	idem "github.com/idemgo/idem/core"
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
		if reply.Panic != nil {
			panic(reply.Panic)
		}
		status := reply.Status
		if reply.Err != nil {
			if status == 0 {
				status = http.StatusInternalServerError
			}
			return echo.NewHTTPError(status, http.StatusText(status)).SetInternal(reply.Err)
		}
		for k, v := range reply.Header {
			c.Response().Header()[k] = v
		}
		c.Response().WriteHeader(status)
		_, err := c.Response().Write(reply.Body)
		return err
	}
}

// Harness mounts idemecho for core/adaptertest: NewEcho, then a group with
// Authenticate and the middleware, then Handler on every path, on an
// httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemecho.New(idemecho.Config{Config: cfg, Principal: Principal})
		if err != nil {
			t.Fatal(err)
		}
		e := NewEcho()
		api := e.Group("", Authenticate, mw)
		api.Any("/*", Handler(h))
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}
