// Package idemhttptest mounts the net/http adapter for core/adaptertest:
// Harness serves the suite's handler behind idemhttp's middleware, placed
// as the suite's Setup asks (on a ServeMux subtree or around the whole mux,
// after an auth middleware or, wrongly, before it) inside a panic
// recoverer, on a real server on 127.0.0.1. The adapter's own tests and
// the conformance module (which runs the suite against every store) share
// it. It imports only core and the standard library.
package idemhttptest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	"github.com/idemgo/idem/core/adaptertest"
)

type principalKey struct{}

// WithPrincipal returns ctx carrying principal p, where Authenticate puts
// it and Principal reads it.
func WithPrincipal(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// Authenticate is the auth middleware the adapter sits behind: it puts the
// bearer principal into the request context.
func Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := adaptertest.Principal(r.Header.Get("Authorization")); p != "" {
			r = r.WithContext(WithPrincipal(r.Context(), p))
		}
		next.ServeHTTP(w, r)
	})
}

// Principal is the adapter's principal function: it reads back what
// Authenticate stored.
func Principal(r *http.Request) (string, error) {
	p, _ := r.Context().Value(principalKey{}).(string)
	return p, nil
}

// Recoverer answers a panic with 500, as chi's Recoverer does.
func Recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				http.Error(w, "internal server error", http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// Handler runs the suite's handler as a native net/http handler.
func Handler(h adaptertest.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		reply := h(r.Context(), adaptertest.Request{
			Method: r.Method, Path: r.URL.Path, Header: r.Header, Body: body,
			WriteEarly: func(p []byte) {
				_, _ = w.Write(p)
				_ = http.NewResponseController(w).Flush()
			},
		})
		if reply.Err != nil {
			status := reply.Status
			if status == 0 {
				status = http.StatusInternalServerError
			}
			http.Error(w, reply.Err.Error(), status)
			return
		}
		if reply.Status != 0 || reply.Panic == nil {
			for k, v := range reply.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(reply.Status)
			_, _ = w.Write(reply.Body)
		}
		if reply.Panic != nil {
			panic(reply.Panic)
		}
	})
}

// Harness mounts idemhttp for core/adaptertest: Recoverer, then the
// Setup's early headers, then Authenticate and the middleware as the
// Setup places them, then Handler, on an httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, s adaptertest.Setup) (string, error) {
		engine, err := adaptertest.Engine(s)
		if err != nil {
			return "", err
		}
		mw, err := idemhttp.New(idemhttp.Config{Engine: engine, Principal: adaptertest.PrincipalFunc(s, Principal)})
		if err != nil {
			return "", err
		}
		global, group := adaptertest.Place(s, Authenticate, mw)
		h := Handler(s.Handler)
		mux := http.NewServeMux()
		mux.Handle("/outside", h)
		mux.Handle("/payments", chain(group, h))
		mux.Handle("/payments/{rest...}", chain(group, h))
		srv := httptest.NewServer(Recoverer(header(s.Header, chain(global, mux))))
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}

// chain wraps h in mws, the first outermost.
func chain(mws []func(http.Handler) http.Handler, h http.Handler) http.Handler {
	for _, mw := range slices.Backward(mws) {
		h = mw(h)
	}
	return h
}

// header sets h on every response before next runs.
func header(h http.Header, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range h {
			w.Header()[k] = v
		}
		next.ServeHTTP(w, r)
	})
}
