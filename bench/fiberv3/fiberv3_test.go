// Package fiberv3 benchmarks Fiber v3's middleware/idempotency on the same
// handler, auth middleware and keys as ../fiber_test.go does for Fiber v2
// and idemfiber. It is a module of its own, outside go.work, because Fiber
// v3 needs a newer fasthttp than the one idemfiber is built and tested
// with; run it with GOWORK=off.
//
//	cd bench/fiberv3 && GOWORK=off go test -run '^$' -bench . -benchmem -count 6 .
package fiberv3

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/valyala/fasthttp"
)

const body = `{"amount":1000,"currency":"EUR","description":"coffee"}`

var resp = []byte(`{"id":"pay_1","amount":1000,"currency":"EUR","description":"coffee","status":"succeeded"}`)

func handler(c fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	c.Set(fiber.HeaderLocation, "/payments/pay_1")
	return c.Status(fiber.StatusCreated).Send(resp)
}

func auth(c fiber.Ctx) error {
	if v := c.Get(fiber.HeaderAuthorization); len(v) > 7 {
		c.Locals("account", v[7:])
	}
	return c.Next()
}

var variants = []string{"bare-v3", "fiber-v3-idempotency"}

func app(b *testing.B, variant string) *fiber.App {
	a := fiber.New()
	a.Use(auth)
	switch variant {
	case "bare-v3":
	case "fiber-v3-idempotency":
		a.Use(idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key"}))
	default:
		b.Fatalf("unknown variant %q", variant)
	}
	a.Post("/payments", handler)
	return a
}

func uuidKey(prefix uint32, i uint64) string {
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", prefix, i)
}

func setRequest(req *fasthttp.Request, key string) {
	req.Header.SetMethod(fiber.MethodPost)
	req.SetRequestURI("/payments")
	req.Header.SetContentType(fiber.MIMEApplicationJSON)
	req.Header.Set(fiber.HeaderAuthorization, "Bearer acct_1")
	req.Header.Set("Idempotency-Key", key)
	req.SetBodyString(body)
}

func serve(h fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, key string) int {
	ctx.Request.Reset()
	ctx.Response.Reset()
	setRequest(&ctx.Request, key)
	h(ctx)
	return ctx.Response.StatusCode()
}

func BenchmarkFiberFirst(b *testing.B) {
	for _, v := range variants {
		b.Run("variant="+v, func(b *testing.B) {
			h := app(b, v).Handler()
			var ctx fasthttp.RequestCtx
			prefix := uint32(time.Now().UnixNano())
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				i++
				if st := serve(h, &ctx, uuidKey(prefix, i)); st != fiber.StatusCreated {
					b.Fatalf("status %d: %s", st, ctx.Response.Body())
				}
			}
		})
	}
}

func BenchmarkFiberReplay(b *testing.B) {
	for _, v := range variants {
		b.Run("variant="+v, func(b *testing.B) {
			h := app(b, v).Handler()
			var ctx fasthttp.RequestCtx
			key := uuidKey(uint32(time.Now().UnixNano()), 1)
			serve(h, &ctx, key)
			b.ReportAllocs()
			for b.Loop() {
				if st := serve(h, &ctx, key); st != fiber.StatusCreated {
					b.Fatalf("status %d", st)
				}
			}
		})
	}
}

func BenchmarkFiberListener(b *testing.B) {
	for _, v := range variants {
		b.Run("variant="+v, func(b *testing.B) {
			a := app(b, v)
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = a.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
			defer func() { _ = a.ShutdownWithTimeout(5 * time.Second) }()
			hc := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 256, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
			prefix := uint32(time.Now().UnixNano())
			var n atomic.Uint64
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(res)
				for pb.Next() {
					req.Reset()
					setRequest(req, uuidKey(prefix, n.Add(1)))
					req.SetRequestURI("http://" + ln.Addr().String() + "/payments")
					if err := hc.DoTimeout(req, res, 10*time.Second); err != nil {
						b.Error(err)
						return
					}
					if res.StatusCode() != fiber.StatusCreated {
						b.Errorf("status %d", res.StatusCode())
						return
					}
				}
			})
		})
	}
}
