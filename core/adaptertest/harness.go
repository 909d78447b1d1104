// Package adaptertest is the HTTP-level conformance suite every adapter must
// pass. An adapter's tests call Run with a Harness that mounts the suite's
// framework-neutral handler behind the adapter's middleware, on a real
// server on 127.0.0.1, in the places a Setup names (a route group, the
// whole router, the wrong side of authentication); the suite then drives
// it with real HTTP round trips. The suite covers what every adapter must
// do alike; each adapter's own tests keep the traps of its framework.
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
	Method string      // the request's method
	Path   string      // the request's path, without the query
	Header http.Header // the request's header
	Body   []byte      // the body as the handler reads it
	// WriteEarly writes p to the response and flushes it, in the
	// framework's idiom (gin's c.Writer.Flush, echo's c.Response().Flush,
	// http.Flusher). Behind the middleware nothing may reach the client
	// before the commit, whatever the handler flushes.
	WriteEarly func(p []byte)
}

// Reply is what the suite's handler wants the framework handler to do.
type Reply struct {
	Status int         // the status to answer with
	Header http.Header // headers to set on the response
	Body   []byte      // the body to write
	// Err, when set, is returned (or reported) as the framework's handler
	// error with Status (500 when zero): echo.NewHTTPError, fiber.NewError,
	// gin's c.AbortWithError, or for net/http an http.Error with Status.
	Err error
	// Panic, when non-nil, makes the framework handler panic with it:
	// after writing Header, Status and Body when Status is set, before
	// writing anything otherwise.
	Panic any
}

// Handler is the suite's framework-neutral handler. The harness calls it
// from a native handler with the request context the framework hands
// handlers (c.Request.Context(), c.UserContext(), r.Context()).
type Handler func(ctx context.Context, r Request) Reply

// Placement is where a Setup puts the adapter's middleware.
type Placement int

const (
	// OnGroup puts Authenticate, then the middleware, on a route group
	// that serves /payments and every path below it. /outside is served
	// outside the group, with neither.
	OnGroup Placement = iota
	// Global puts Authenticate, then the middleware, on the whole router
	// (r.Use, e.Use, app.Use; around the mux for net/http): /outside is
	// behind them too.
	Global
	// BeforeAuth is OnGroup in the wrong order: the middleware runs before
	// Authenticate, so it finds no principal.
	BeforeAuth
)

// Setup is one server the suite asks a Harness for.
type Setup struct {
	// Config configures the engine the adapter's middleware runs on: the
	// harness builds it with Engine.
	Config idem.Config
	// Handler answers every route.
	Handler Handler
	// Placement says where the middleware goes.
	Placement Placement
	// PrincipalErr, when set, is the error the adapter's principal
	// function returns, along with the principal Authenticate stored.
	PrincipalErr error
	// NoPrincipal leaves the adapter's Config without a principal
	// function: New must refuse it.
	NoPrincipal bool
	// NoEngine leaves the adapter's Config without an engine: New must
	// refuse it.
	NoEngine bool
	// Header, when set, is added to the response by a middleware on every
	// route that runs before Authenticate and the adapter's (CORS, request
	// ids).
	Header http.Header
}

// Harness adapts one framework to the suite.
type Harness struct {
	// Serve starts a server on 127.0.0.1 for s and returns its base URL.
	// The handler runs behind the adapter's middleware, on the engine
	// Engine builds from s.Config, placed as s.Placement says, with an authentication
	// middleware before it (Authenticate) that takes the principal from
	// "Authorization: Bearer <principal>" (see Principal) and stores it in
	// the framework's idiom (c.Set, c.Locals, a context value); the
	// adapter's principal function (see PrincipalFunc) reads it back.
	// Outermost, Serve recovers panics the way the framework's usual
	// recovery middleware does. It registers the server's shutdown with
	// t.Cleanup. When Engine or the adapter's New fails, Serve starts
	// nothing and returns its error.
	Serve func(t testing.TB, s Setup) (baseURL string, err error)
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

// Engine returns the engine a harness configures the adapter with for s:
// idem.New(s.Config), or nil when s.NoEngine. Its error is New's, which
// Serve returns.
func Engine(s Setup) (*idem.Engine, error) {
	if s.NoEngine {
		return nil, nil
	}
	return idem.New(s.Config)
}

// PrincipalFunc returns the principal function a harness configures the
// adapter with for s: principal itself, nil when s.NoPrincipal, or, when
// s.PrincipalErr is set, one that returns that error along with the
// principal.
func PrincipalFunc[C any](s Setup, principal func(C) (string, error)) func(C) (string, error) {
	switch {
	case s.NoPrincipal:
		return nil
	case s.PrincipalErr != nil:
		return func(c C) (string, error) {
			p, _ := principal(c)
			return p, s.PrincipalErr
		}
	}
	return principal
}

// Place returns, in order, the middleware a harness puts on the whole
// router (global) and on the route group that serves /payments (group),
// for s.Placement: authenticate and the adapter's middleware.
func Place[M any](s Setup, authenticate, middleware M) (global, group []M) {
	switch s.Placement {
	case Global:
		return []M{authenticate, middleware}, nil
	case BeforeAuth:
		return nil, []M{middleware, authenticate}
	}
	return nil, []M{authenticate, middleware}
}
