// Package idemfiber is the idem middleware for Fiber v2.
//
// Place it after authentication, on the routes or groups that must be
// idempotent: it reads the principal through Config.Principal (typically
// what the auth middleware stored with c.Locals), and a request without one
// is refused with 401 before anything is claimed.
//
//	mw, err := idemfiber.New(idemfiber.Config{
//		Config: idem.Config{Store: store},
//		Principal: func(c *fiber.Ctx) (string, error) {
//			account, _ := c.Locals("account").(string)
//			return account, nil
//		},
//	})
//	app.Post("/payments", authenticate, mw, createPayment)
//
// Handlers reach the store's transaction through c.UserContext() with the
// store's accessor (idempgx.Tx, idemgorm.DB).
//
// fasthttp sends nothing until the handler chain returns, so the middleware
// runs the rest of the chain, renders a returned error with the app's
// ErrorHandler (a mounted sub-app's, when the route belongs to one), settles
// the outcome from c.Response(), and then replaces the response with exactly
// what the engine returned. Everything kept past the handler is copied out
// of fasthttp's reused buffers, with or without Config.Immutable.
package idemfiber

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	idem "github.com/idemgo/idem/core"
)

// Config configures the middleware: the engine's Config plus how to read the
// authenticated principal.
type Config struct {
	idem.Config
	// Principal returns the authenticated caller of the request, as the
	// auth middleware before this one left it (c.Locals, a JWT claim). An
	// empty result or an error answers 401 and claims nothing. The result
	// is copied, so it may alias Fiber's buffers. Required.
	Principal func(c *fiber.Ctx) (string, error)
}

// New validates cfg and returns the middleware.
//
// The handlers after it run with c.UserContext() carrying the attempt's
// context (the store's transaction and the request deadline, derived from
// the user context set further out) and the request body the fingerprint
// read. The error they return is the handler's error: it is rendered with
// the app's ErrorHandler inside the middleware, and by default such an
// outcome is released, not stored; the middleware then returns nil. A
// panic releases the key and goes on to the recover middleware.
func New(cfg Config) (fiber.Handler, error) {
	if cfg.Principal == nil {
		return nil, fmt.Errorf("idemfiber: %w: Principal is required", idem.ErrInvalidConfig)
	}
	eng, err := idem.New(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("idemfiber: %w", err)
	}
	ecfg := eng.Config()
	return func(c *fiber.Ctx) error {
		principal, err := cfg.Principal(c)
		if err != nil {
			principal = ""
		}
		att, resp := eng.Begin(c.UserContext(), request(c, ecfg, principal))
		if att == nil {
			if resp == nil {
				return c.Next()
			}
			if c.Request().IsBodyStream() {
				// The body may be left unread on the connection, where
				// fasthttp would parse it as the next request.
				c.Response().Header.SetConnectionClose()
			}
			write(c, resp)
			return nil
		}
		defer att.Abort()

		userCtx := c.UserContext()
		earlier := header(c, earlierSkip) // set further out: CORS, request ids
		c.SetUserContext(att.Context())
		defer c.SetUserContext(userCtx)
		c.Request().SetBody(att.Body())

		// A panic skips everything below: drop what the handler wrote, so
		// the recover middleware's error response carries none of it (a
		// Location, a cookie), as with a discarded buffer on net/http.
		settled := false
		defer func() {
			if !settled {
				reset(c, earlier)
			}
		}()
		herr := c.Next()
		if herr != nil {
			// Render the error now, as the app would after the chain, so
			// the response the client gets is the one classified.
			c.Response().ResetBody()
			c.Status(fiber.StatusOK)
			if catch := c.App().ErrorHandler(c, herr); catch != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
		final := att.Finish(result(c, ecfg.MaxResponseBytes, herr))
		settled = true

		// Send exactly what the engine decided: the handler's response, or
		// a problem in its place, on top of the headers set further out.
		reset(c, earlier)
		write(c, final)
		return nil
	}, nil
}

// reset empties c's response back to the headers set before the handler.
func reset(c *fiber.Ctx, earlier http.Header) {
	c.Response().Reset()
	for k, vs := range earlier {
		for _, v := range vs {
			c.Response().Header.Add(k, v)
		}
	}
}

// request is the engine's view of c. Every string is copied: the engine
// keeps them past the handler (as store keys, in events), and Fiber reuses
// the buffers they point into.
func request(c *fiber.Ctx, cfg idem.Config, principal string) idem.Request {
	var (
		body   io.Reader
		length int64
	)
	if req := c.Request(); req.IsBodyStream() {
		body = req.BodyStream()                             // Begin reads it up to MaxBodyBytes
		length = max(int64(req.Header.ContentLength()), -1) // -1 chunked, -2 none: unknown
	} else {
		b := req.Body()
		body, length = bytes.NewReader(b), int64(len(b))
	}
	return idem.Request{
		Method:        utils.CopyString(c.Method()),
		Path:          utils.CopyString(c.OriginalURL()),
		Principal:     utils.CopyString(principal),
		Key:           utils.CopyString(c.Get(cfg.Header)),
		ContentType:   utils.CopyString(c.Get(fiber.HeaderContentType)),
		RequestID:     utils.CopyString(c.Get(cfg.RequestIDHeader)),
		Body:          body,
		ContentLength: length,
	}
}

// resultSkip lists the response headers fasthttp manages itself: they
// describe this connection and this encoding of the body, not the
// response, and are never part of the handler's result.
var resultSkip = map[string]bool{
	"Content-Length": true, "Server": true, "Connection": true, "Transfer-Encoding": true, "Date": true,
}

// earlierSkip lists the headers not restored from before the handler ran:
// fasthttp sets them again for the final body.
var earlierSkip = map[string]bool{"Content-Length": true, "Connection": true, "Transfer-Encoding": true, "Date": true}

// header copies c's response header, leaving out the names in skip.
// Set-Cookie is kept: it is sent with the first response (and, unless the
// user lists it in StoredHeaders, never stored or replayed).
func header(c *fiber.Ctx, skip map[string]bool) http.Header {
	h := make(http.Header)
	c.Response().Header.VisitAll(func(k, v []byte) {
		name := http.CanonicalHeaderKey(string(k))
		if !skip[name] {
			h[name] = append(h[name], string(v))
		}
	})
	return h
}

// result copies the handler's response out of c. A streamed body is read up
// to limit+1 bytes: past the limit the response is too large to store.
func result(c *fiber.Ctx, limit int, herr error) idem.Result {
	resp := c.Response()
	var body []byte
	overflow := false
	if resp.IsBodyStream() {
		b, err := io.ReadAll(io.LimitReader(resp.BodyStream(), int64(limit)+1))
		_ = resp.CloseBodyStream()
		if err != nil && herr == nil {
			herr = fmt.Errorf("idemfiber: read response body stream: %w", err)
		}
		body, overflow = b, len(b) > limit
	} else {
		body = utils.CopyBytes(resp.Body())
	}
	return idem.Result{
		Status:   resp.StatusCode(),
		Header:   header(c, resultSkip),
		Body:     body,
		Err:      herr,
		Overflow: overflow,
	}
}

// write puts resp into c's response: its headers (replacing those of the
// same name), status and body.
func write(c *fiber.Ctx, resp *idem.Response) {
	h := &c.Response().Header
	for k, vs := range resp.Header {
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	c.Status(resp.Status)
	c.Response().SetBody(resp.Body)
}
