// Package adaptertest is the HTTP-level conformance suite every adapter must
// pass. An adapter's tests call Run with a Harness that mounts the suite's
// framework-neutral handler behind the adapter's middleware, on a real
// server on 127.0.0.1; the suite then drives it with real HTTP round trips.
package adaptertest

import (
	"context"
	"net/http"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
)

// Request is what the suite's handler sees of a request.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	// WriteEarly writes p to the response and flushes it, in the
	// framework's idiom (gin's c.Writer.Flush, echo's c.Response().Flush,
	// http.Flusher). Behind the middleware nothing may reach the client
	// before the commit, whatever the handler flushes.
	WriteEarly func(p []byte)
}

// Reply is what the suite's handler wants the framework handler to do.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	// Err, when set, is returned (or reported) as the framework's handler
	// error with Status (500 when zero): echo.NewHTTPError, fiber.NewError,
	// gin's c.AbortWithError, or for net/http an http.Error with Status.
	Err error
	// Panic, when non-nil, makes the framework handler panic with it.
	Panic any
}

// Handler is the suite's framework-neutral handler. The harness calls it
// from a native handler with the request context the framework hands
// handlers (c.Request.Context(), c.UserContext(), r.Context()).
type Handler func(ctx context.Context, r Request) Reply

// Harness adapts one framework to the suite.
type Harness struct {
	// Serve starts a server on 127.0.0.1 whose every route runs h behind
	// the adapter's middleware configured with cfg, placed after an
	// authentication middleware that takes the principal from
	// "Authorization: Bearer <principal>" (see Principal) and stores it in
	// the framework's idiom (c.Set, c.Locals, a context value); the
	// adapter's principal function reads it back. Serve recovers panics
	// the way the framework's usual recovery middleware does, and returns
	// the base URL. It registers the server's shutdown with t.Cleanup.
	Serve func(t testing.TB, cfg idem.Config, h Handler) (baseURL string)
}

// Principal returns the principal of an "Authorization: Bearer <p>" header
// value, or "" when there is none. Harnesses use it in their auth
// middleware.
func Principal(authorization string) string {
	p, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(p)
}
