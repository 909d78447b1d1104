package idemecho_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	idemecho "github.com/idemgo/idem/adapters/echo"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Set, the Echo idiom.
func authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := adaptertest.Principal(c.Request().Header.Get("Authorization")); p != "" {
			c.Set("principal", p)
		}
		return next(c)
	}
}

// principal reads back what authenticate stored.
func principal(c echo.Context) (string, error) {
	p, _ := c.Get("principal").(string)
	return p, nil
}

// newEcho returns an Echo with its usual Recover middleware, quiet.
func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	return e
}

// suiteHandler runs the suite's handler as a native Echo handler.
func suiteHandler(h adaptertest.Handler) echo.HandlerFunc {
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

var harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemecho.New(idemecho.Config{Config: cfg, Principal: principal})
		if err != nil {
			t.Fatal(err)
		}
		e := newEcho()
		api := e.Group("", authenticate, mw)
		api.Any("/*", suiteHandler(h))
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
