// Package idemfibertest mounts the Fiber v2 adapter for core/adaptertest:
// Harness serves the suite's handler behind idemfiber's middleware, placed
// as the suite's Setup asks (on a route group or the whole app, after an
// auth middleware or, wrongly, before it), under Fiber's recover
// middleware, on a real listener on 127.0.0.1. The adapter's own tests and
// the conformance module (which runs the suite against every store) share
// it. It imports only core and Fiber.
package idemfibertest

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
	"github.com/idemgo/idem/core/adaptertest"
)

// Authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Locals, the Fiber idiom. Like many real auth
// middlewares it does not copy what c.Get returned, so the principal points
// into a buffer Fiber reuses; the adapter must copy it.
func Authenticate(c *fiber.Ctx) error {
	if p := adaptertest.Principal(c.Get("Authorization")); p != "" {
		c.Locals("principal", p)
	}
	return c.Next()
}

// Principal is the adapter's principal function: it reads back what
// Authenticate stored.
func Principal(c *fiber.Ctx) (string, error) {
	p, _ := c.Locals("principal").(string)
	return p, nil
}

// Handler runs the suite's handler as a native Fiber handler.
func Handler(h adaptertest.Handler) fiber.Handler {
	return func(c *fiber.Ctx) error {
		header := make(http.Header)
		c.Request().Header.VisitAll(func(k, v []byte) { header.Add(string(k), string(v)) })
		reply := h(c.UserContext(), adaptertest.Request{
			Method: c.Method(), Path: c.Path(), Header: header, Body: append([]byte(nil), c.Body()...),
			// fasthttp has no flush: a write is as early as it gets.
			WriteEarly: func(p []byte) { _, _ = c.Write(p) },
		})
		if reply.Err != nil {
			status := reply.Status
			if status == 0 {
				status = http.StatusInternalServerError
			}
			return fiber.NewError(status, reply.Err.Error())
		}
		if reply.Status != 0 || reply.Panic == nil {
			for k, vs := range reply.Header {
				for _, v := range vs {
					c.Response().Header.Add(k, v)
				}
			}
			_ = c.Status(reply.Status).Send(reply.Body)
		}
		if reply.Panic != nil {
			panic(reply.Panic)
		}
		return nil
	}
}

// Serve runs app on a real listener on 127.0.0.1 until the test ends, and
// returns its base URL.
func Serve(t testing.TB, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Listener(ln) }()
	// fasthttp's Shutdown waits for every connection to go idle, and a
	// connection the client opened but never used is not idle: bound it.
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(time.Second) })
	return "http://" + ln.Addr().String()
}

// Harness mounts idemfiber for core/adaptertest: recover on the app, the
// Setup's early headers, Authenticate and the middleware as the Setup
// places them, then Handler, served by Serve.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, s adaptertest.Setup) (string, error) {
		engine, err := adaptertest.Engine(s)
		if err != nil {
			return "", err
		}
		mw, err := idemfiber.New(idemfiber.Config{Engine: engine, Principal: adaptertest.PrincipalFunc(s, Principal)})
		if err != nil {
			return "", err
		}
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(recover.New(), func(c *fiber.Ctx) error {
			for k, vs := range s.Header {
				for _, v := range vs {
					c.Response().Header.Add(k, v)
				}
			}
			return c.Next()
		})
		global, group := adaptertest.Place(s, Authenticate, mw)
		for _, m := range global {
			app.Use(m)
		}
		h := Handler(s.Handler)
		app.All("/outside", h)
		app.Group("/payments", group...).All("/*", h)
		return Serve(t, app), nil
	},
}
