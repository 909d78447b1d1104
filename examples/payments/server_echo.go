package main

import (
	"errors"
	"io"
	"log/slog"
	"net/http"

	idemecho "github.com/idemgo/idem/adapters/echo"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

func init() { frameworks["echo"] = newEcho }

// newEcho mounts the service on Echo: recovery → authentication →
// idempotency → handler.
func newEcho(a *app) (server, error) {
	idempotent, err := idemecho.New(idemecho.Config{
		Engine: a.engine,
		Principal: func(c echo.Context) (string, error) {
			account, _ := c.Get("account").(string)
			return account, nil
		},
	})
	if err != nil {
		return nil, err
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		var he *echo.HTTPError
		if errors.As(err, &he) && he.Code != http.StatusInternalServerError {
			echoReply(c, problem(he.Code, "about:blank", http.StatusText(he.Code), ""))
			return
		}
		echoReply(c, InternalError())
	}
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(c echo.Context, err error, _ []byte) error {
			// idemecho has rolled back and released the key; the error
			// goes on to the HTTPErrorHandler above: a 500 problem.
			a.log.ErrorContext(c.Request().Context(), "handler panicked", slog.String("panic", err.Error()), slog.String("path", c.Path()))
			return err
		},
	}))
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			account := Authenticate(c.Request().Header.Get("Authorization"))
			if account == "" {
				echoReply(c, Unauthorized())
				return nil
			}
			c.Set("account", account)
			return next(c)
		}
	}
	account := func(c echo.Context) string { return c.Get("account").(string) }

	api := e.Group("/payments", auth)
	api.POST("", func(c echo.Context) error {
		body, _ := io.ReadAll(c.Request().Body)
		// The idempotency transaction travels in the request's context.
		echoReply(c, a.svc.Create(c.Request().Context(), account(c), body, c.Request().Header.Get(SimulateHeader)))
		return nil
	}, idempotent)
	api.GET("", func(c echo.Context) error {
		echoReply(c, a.svc.List(c.Request().Context(), account(c)))
		return nil
	})
	api.GET("/:id", func(c echo.Context) error {
		echoReply(c, a.svc.Get(c.Request().Context(), account(c), c.Param("id")))
		return nil
	})
	e.GET("/healthz", func(c echo.Context) error { echoReply(c, a.svc.Health()); return nil })
	e.GET("/metrics", echo.WrapHandler(a.metrics))
	return newHTTPServer(e, a.engine.Config()), nil
}

func echoReply(c echo.Context, r Reply) {
	writeReply(c.Response(), r)
}
