package bench

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/valyala/fasthttp"

	idemfiber "github.com/idemgo/idem/adapters/fiber"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
)

// The Fiber side by side: the same handler and the same auth middleware
// (it puts the bearer account into c.Locals) bare, behind Fiber v2's own
// middleware/idempotency (its in-memory storage and lock), and behind
// idemfiber with memstore. Keys are UUID-shaped, so Fiber's default key
// validation accepts them, and sent in Idempotency-Key for all.
//
//	go test -run '^$' -bench 'Fiber' -benchmem -count 6 .

const fiberBody = `{"amount":1000,"currency":"EUR","description":"coffee"}`

var fiberResp = []byte(`{"id":"pay_1","amount":1000,"currency":"EUR","description":"coffee","status":"succeeded"}`)

func fiberHandler(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	c.Set(fiber.HeaderLocation, "/payments/pay_1")
	return c.Status(fiber.StatusCreated).Send(fiberResp)
}

func fiberAuth(c *fiber.Ctx) error {
	if v := c.Get(fiber.HeaderAuthorization); len(v) > 7 {
		c.Locals("account", v[7:])
	}
	return c.Next()
}

func fiberApp(b *testing.B, variant string) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(fiberAuth)
	switch variant {
	case "bare":
	case "fiber-idempotency":
		app.Use(idempotency.New(idempotency.Config{KeyHeader: "Idempotency-Key"}))
	case "idemfiber-memstore":
		// One principal makes every request (adaptertest.BenchStore). The
		// handler uses no transaction, which AllowTxUnused says is meant:
		// the engine would log a warning per request.
		eng, err := idem.New(idem.Config{Store: adaptertest.BenchStore(), FingerprintKey: FingerprintKey, AllowTxUnused: true})
		if err != nil {
			b.Fatal(err)
		}
		mw, err := idemfiber.New(idemfiber.Config{
			Engine: eng,
			Principal: func(c *fiber.Ctx) (string, error) {
				p, _ := c.Locals("account").(string)
				return p, nil
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		app.Use(mw)
	default:
		b.Fatalf("unknown variant %q", variant)
	}
	app.Post("/payments", fiberHandler)
	return app
}

var fiberVariants = []string{"bare", "fiber-idempotency", "idemfiber-memstore"}

func uuidKey(prefix uint32, i uint64) string {
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", prefix, i)
}

func setRequest(req *fasthttp.Request, key string) {
	req.Header.SetMethod(fiber.MethodPost)
	req.SetRequestURI("/payments")
	req.Header.SetContentType(fiber.MIMEApplicationJSON)
	req.Header.Set(fiber.HeaderAuthorization, "Bearer acct_1")
	req.Header.Set("Idempotency-Key", key)
	req.SetBodyString(fiberBody)
}

// serve runs one request through the app's fasthttp handler in process:
// the middleware's cost without a socket.
func serve(h fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, key string) int {
	ctx.Request.Reset()
	ctx.Response.Reset()
	setRequest(&ctx.Request, key)
	h(ctx)
	return ctx.Response.StatusCode()
}

// BenchmarkFiberFirst: a new key per request (the bare app just runs the
// handler).
func BenchmarkFiberFirst(b *testing.B) {
	for _, v := range fiberVariants {
		b.Run("variant="+v, func(b *testing.B) {
			h := fiberApp(b, v).Handler()
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

// BenchmarkFiberReplay: the same key again and again, answered from the
// store (the bare app runs the handler each time).
func BenchmarkFiberReplay(b *testing.B) {
	for _, v := range fiberVariants {
		b.Run("variant="+v, func(b *testing.B) {
			h := fiberApp(b, v).Handler()
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

// BenchmarkFiberListener: first requests over a real listener on
// 127.0.0.1, clients in parallel (b.RunParallel, 4 per CPU) through
// fasthttp's client. Client and server share the machine's CPUs.
func BenchmarkFiberListener(b *testing.B) {
	for _, v := range fiberVariants {
		b.Run("variant="+v, func(b *testing.B) {
			app := fiberApp(b, v)
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = app.Listener(ln) }()
			defer func() { _ = app.ShutdownWithTimeout(5 * time.Second) }()
			hc := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 256, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
			prefix := uint32(time.Now().UnixNano())
			var n atomic.Uint64
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for pb.Next() {
					req.Reset()
					setRequest(req, uuidKey(prefix, n.Add(1)))
					req.SetRequestURI("http://" + ln.Addr().String() + "/payments")
					if err := hc.DoTimeout(req, resp, 10*time.Second); err != nil {
						b.Error(err)
						return
					}
					if resp.StatusCode() != fiber.StatusCreated {
						b.Errorf("status %d", resp.StatusCode())
						return
					}
				}
			})
		})
	}
}
