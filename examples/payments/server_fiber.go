package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
)

func init() { frameworks["fiber"] = newFiber }

// newFiber mounts the service on Fiber v2: recovery → authentication →
// idempotency → handler.
func newFiber(a *app) (server, error) {
	idempotent, err := idemfiber.New(idemfiber.Config{
		Engine: a.engine,
		Principal: func(c *fiber.Ctx) (string, error) {
			account, _ := c.Locals("account").(string)
			return account, nil
		},
	})
	if err != nil {
		return nil, err
	}
	f := fiber.New(fiber.Config{
		DisableStartupMessage: true,
		// fasthttp counts a connection as active from the moment it is
		// accepted until its first request has been read, and a graceful
		// shutdown waits for active connections: without a read timeout,
		// a client's spare keep-alive connection that never carries a
		// request (Go's and browsers' connection pools open them) holds
		// the shutdown until the client closes it.
		ReadTimeout:  readTimeout,
		WriteTimeout: writeTimeout(a.engine.Config()),
		// Without it fasthttp allocates the whole declared Content-Length
		// (up to BodyLimit) before the first body byte arrives: 400
		// connections declaring 1 MiB and sending one byte took the
		// process from 26 to 433 MB. Streamed, the body is read as it
		// arrives, and idemfiber reads at most MaxBodyBytes of it
		// (TestSlowBodyFlood).
		StreamRequestBody: true,
		IdleTimeout:       idleTimeout,
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			var fe *fiber.Error
			if errors.As(err, &fe) && fe.Code != http.StatusInternalServerError {
				return fiberReply(c, problem(fe.Code, "about:blank", http.StatusText(fe.Code), ""))
			}
			a.log.ErrorContext(c.UserContext(), "handler failed", slog.String("error", err.Error()), slog.String("path", c.Path()))
			return fiberReply(c, InternalError())
		},
	})
	// A panic becomes an error for the ErrorHandler above; idemfiber has
	// rolled back and released the key on the way out.
	f.Use(recover.New())
	auth := func(c *fiber.Ctx) error {
		account := Authenticate(c.Get("Authorization"))
		if account == "" {
			return fiberReply(c, Unauthorized())
		}
		// fasthttp reuses the request's memory: keep a copy.
		c.Locals("account", strings.Clone(account))
		return c.Next()
	}
	account := func(c *fiber.Ctx) string { return c.Locals("account").(string) }

	api := f.Group("/payments", auth)
	api.Post("", idempotent, func(c *fiber.Ctx) error {
		// The idempotency transaction travels in the user context.
		return fiberReply(c, a.svc.Create(c.UserContext(), account(c), c.Body(), c.Get(SimulateHeader)))
	})
	api.Get("", func(c *fiber.Ctx) error { return fiberReply(c, a.svc.List(c.UserContext(), account(c))) })
	api.Get("/:id", func(c *fiber.Ctx) error {
		return fiberReply(c, a.svc.Get(c.UserContext(), account(c), c.Params("id")))
	})
	f.Get("/healthz", func(c *fiber.Ctx) error { return fiberReply(c, a.svc.Health()) })
	f.Get("/metrics", adaptor.HTTPHandler(a.metrics))
	return fiberServer{f}, nil
}

func fiberReply(c *fiber.Ctx, r Reply) error {
	for k, vs := range r.Header {
		for _, v := range vs {
			c.Response().Header.Add(k, v)
		}
	}
	return c.Status(r.Status).Send(r.Body)
}

// fiberServer serves a Fiber app, which runs on fasthttp, not net/http.
type fiberServer struct{ app *fiber.App }

func (s fiberServer) Serve(ln net.Listener) error { return s.app.Listener(ln) }

func (s fiberServer) Shutdown(ctx context.Context) error { return s.app.ShutdownWithContext(ctx) }
