// Package idemhttptest mounts the net/http adapter for core/adaptertest:
// Harness serves the suite's handler behind idemhttp's middleware, placed
// after an auth middleware and inside a panic recoverer, on a real server
// on 127.0.0.1. The adapter's own tests and the conformance module (which
// runs the suite against every store) share it. It imports only core and
// the standard library.
package idemhttptest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	idem "github.com/idemgo/idem/core"
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
		if reply.Panic != nil {
			panic(reply.Panic)
		}
		status := reply.Status
		if reply.Err != nil {
			if status == 0 {
				status = http.StatusInternalServerError
			}
			http.Error(w, reply.Err.Error(), status)
			return
		}
		for k, v := range reply.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write(reply.Body)
	})
}

// Harness mounts idemhttp for core/adaptertest: Recoverer, then
// Authenticate, then the middleware, then Handler, on an httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemhttp.New(idemhttp.Config{Config: cfg, Principal: Principal})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(Recoverer(Authenticate(mw(Handler(h)))))
		t.Cleanup(srv.Close)
		return srv.URL
	},
}
