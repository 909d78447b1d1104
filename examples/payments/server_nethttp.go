package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
)

func init() { frameworks["nethttp"] = newNetHTTP }

type accountKey struct{}

// newNetHTTP mounts the service on the standard library's ServeMux:
// recovery → authentication → idempotency → handler.
func newNetHTTP(a *app) (server, error) {
	idempotent, err := idemhttp.New(idemhttp.Config{
		Engine: a.engine,
		Principal: func(r *http.Request) (string, error) {
			account, _ := r.Context().Value(accountKey{}).(string)
			return account, nil
		},
	})
	if err != nil {
		return nil, err
	}
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			account := Authenticate(r.Header.Get("Authorization"))
			if account == "" {
				writeReply(w, Unauthorized())
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
		})
	}
	account := func(r *http.Request) string { return r.Context().Value(accountKey{}).(string) }

	mux := http.NewServeMux()
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		writeReply(w, a.svc.Create(r.Context(), account(r), body, r.Header.Get(SimulateHeader)))
	})
	mux.Handle("POST /payments", auth(idempotent(create)))
	mux.Handle("GET /payments", auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, a.svc.List(r.Context(), account(r)))
	})))
	mux.Handle("GET /payments/{id}", auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeReply(w, a.svc.Get(r.Context(), account(r), r.PathValue("id")))
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeReply(w, a.svc.Health()) })
	mux.Handle("GET /metrics", a.metrics)
	return newHTTPServer(recoverer(a.log, mux), a.engine.Config()), nil
}

// recoverer answers a panic with a 500 problem; net/http alone would drop
// the connection. The idempotency middleware has already rolled back and
// released the key by the time the panic gets here.
func recoverer(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.ErrorContext(r.Context(), "handler panicked", slog.Any("panic", v), slog.String("path", r.URL.Path))
				writeReply(w, InternalError())
			}
		}()
		next.ServeHTTP(w, r)
	})
}
