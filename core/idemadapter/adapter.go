package idemadapter

import (
	"fmt"
	"net/http"
	"strings"

	idem "github.com/idemgo/idem/core"
)

// Adapter is what a framework adapter builds its middleware on: the Engine,
// and the application's function that reads the authenticated principal
// from the framework's request C (*http.Request, *gin.Context,
// echo.Context, *fiber.Ctx, a gRPC call's context.Context).
//
// It is for adapter authors. Applications do not use it: they build one
// Engine with New and hand it to their framework adapter's New
// (idemhttp.New, idemgin.New, idemecho.New, idemfiber.New, idemgrpc.New),
// which makes an Adapter with NewAdapter.
type Adapter[C any] struct {
	*idem.Engine
	maxResponse             int    // Config.MaxResponseBytes
	header, requestIDHeader string // Config.Header and Config.RequestIDHeader
	principal               func(C) (string, error)
	// Route, when set, returns the route template that matched c
	// ("/payments/:id"), for Request.Route and so Event.Route: gin's
	// c.FullPath(), echo's c.Path(). An empty answer falls back to the
	// net/http request's Pattern (set when a ServeMux routed it). Adapters
	// set it once, right after NewAdapter.
	Route func(C) string
}

// NewAdapter returns the Adapter of eng and principal, which are both
// required: the application builds eng once with New and shares it with
// every adapter, the Sweeper and Engine.Do. name is the adapter's package
// name: it starts every error, and every error wraps idem.ErrInvalidConfig and
// names the missing field.
func NewAdapter[C any](name string, eng *idem.Engine, principal func(C) (string, error)) (*Adapter[C], error) {
	var missing []string
	if eng == nil {
		missing = append(missing, "Engine is required (build it once with idem.New and share it)")
	}
	if principal == nil {
		missing = append(missing, "Principal is required")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: %w: %s", name, idem.ErrInvalidConfig, strings.Join(missing, "; "))
	}
	cfg := eng.Config()
	return &Adapter[C]{Engine: eng, principal: principal, maxResponse: cfg.MaxResponseBytes,
		header: cfg.Header, requestIDHeader: cfg.RequestIDHeader}, nil
}

// Principal reads c's principal with the application's function, for
// Request.Principal and Request.PrincipalErr. When the function fails the
// principal is "" and the error is returned, so Begin answers 401 and the
// error reaches the Event and the log.
func (a *Adapter[C]) Principal(c C) (string, error) {
	p, err := a.principal(c)
	if err != nil {
		return "", err
	}
	return p, nil
}

// HandleHTTP is the package's HandleHTTP with the principal read from c: adapters
// for frameworks built on net/http call it from their middleware, with the
// framework's writer and request.
func (a *Adapter[C]) HandleHTTP(c C, w http.ResponseWriter, r *http.Request,
	next func(r2 *http.Request, buf *ResponseBuffer) error) {
	principal, err := a.Principal(c)
	cfg := idem.Config{Header: a.header, RequestIDHeader: a.requestIDHeader}
	req := httpRequest(&cfg, r, principal)
	if a.Route != nil {
		if route := a.Route(c); route != "" {
			req.Route = route
		}
	}
	if err == nil {
		handleHTTP(a.Engine, a.maxResponse, w, r, req, next)
		return
	}
	// Without a principal Begin claims nothing and reads no body: it
	// answers 401, or, when the key is optional and absent, lets the
	// handler run as it would without the middleware.
	req.PrincipalErr = err
	if _, resp := a.Begin(r.Context(), req); resp != nil {
		WriteResponse(w, resp)
		return
	}
	_ = next(r, nil)
}
