package idemfiber_test

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
	"github.com/idemgo/idem/adapters/fiber/idemfibertest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/valyala/fasthttp"
)

// BenchmarkMiddleware is the engine overhead on Fiber (see
// adaptertest.RoundTripBenchmarks), through the app's fasthttp handler with
// one reused RequestCtx, as fasthttp serves a keep-alive connection:
//
//	go test -run '^$' -bench . -benchmem
func BenchmarkMiddleware(b *testing.B) {
	adaptertest.RoundTripBenchmarks(b, func(eng *idem.Engine) adaptertest.RoundTrip {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(idemfibertest.Authenticate)
		if eng != nil {
			mw, err := idemfiber.New(idemfiber.Config{Engine: eng, Principal: idemfibertest.Principal})
			if err != nil {
				b.Fatal(err)
			}
			app.Use(mw)
		}
		app.Post("/payments", func(c *fiber.Ctx) error {
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			c.Set(fiber.HeaderLocation, adaptertest.BenchLocation)
			return c.Status(http.StatusCreated).Send(adaptertest.BenchReply)
		})
		h := app.Handler()
		var ctx fasthttp.RequestCtx
		return func(key string) (int, bool) {
			ctx.Request.Reset()
			ctx.Response.Reset()
			ctx.Request.Header.SetMethod(fiber.MethodPost)
			ctx.Request.SetRequestURI("/payments")
			ctx.Request.Header.SetContentType(fiber.MIMEApplicationJSON)
			ctx.Request.Header.Set(fiber.HeaderAuthorization, "Bearer acct_1")
			ctx.Request.Header.Set(idem.DefaultHeader, key)
			ctx.Request.SetBodyString(adaptertest.BenchBody)
			h(&ctx)
			return ctx.Response.StatusCode(), string(ctx.Response.Header.Peek(idem.ReplayedHeader)) == "true"
		}
	})
}
