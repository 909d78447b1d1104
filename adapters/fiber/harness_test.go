package idemfiber_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

// authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Locals, the Fiber idiom. Like many real auth
// middlewares it does not copy what c.Get returned, so the principal points
// into a buffer Fiber reuses; the adapter must copy it.
func authenticate(c *fiber.Ctx) error {
	if p := adaptertest.Principal(c.Get("Authorization")); p != "" {
		c.Locals("principal", p)
	}
	return c.Next()
}

// principal reads back what authenticate stored.
func principal(c *fiber.Ctx) (string, error) {
	p, _ := c.Locals("principal").(string)
	return p, nil
}

// suiteHandler runs the suite's handler as a native Fiber handler.
func suiteHandler(h adaptertest.Handler) fiber.Handler {
	return func(c *fiber.Ctx) error {
		header := make(http.Header)
		c.Request().Header.VisitAll(func(k, v []byte) { header.Add(string(k), string(v)) })
		reply := h(c.UserContext(), adaptertest.Request{
			Method: c.Method(), Path: c.Path(), Header: header, Body: append([]byte(nil), c.Body()...),
			// fasthttp has no flush: a write is as early as it gets.
			WriteEarly: func(p []byte) { _, _ = c.Write(p) },
		})
		if reply.Panic != nil {
			panic(reply.Panic)
		}
		status := reply.Status
		if reply.Err != nil {
			if status == 0 {
				status = http.StatusInternalServerError
			}
			return fiber.NewError(status, reply.Err.Error())
		}
		for k, vs := range reply.Header {
			for _, v := range vs {
				c.Response().Header.Add(k, v)
			}
		}
		return c.Status(status).Send(reply.Body)
	}
}

// serve runs app on a real listener on 127.0.0.1 until the test ends.
func serve(t testing.TB, app *fiber.App) string {
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

var harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemfiber.New(idemfiber.Config{Config: cfg, Principal: principal})
		if err != nil {
			t.Fatal(err)
		}
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(recover.New())
		api := app.Group("/", authenticate, mw)
		api.All("/*", suiteHandler(h))
		return serve(t, app)
	},
}

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
