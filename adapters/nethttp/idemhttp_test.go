package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

type principalKey struct{}

// authenticate is the auth middleware the adapter sits behind: it puts the
// bearer principal into the request context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := adaptertest.Principal(r.Header.Get("Authorization")); p != "" {
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		}
		next.ServeHTTP(w, r)
	})
}

func principal(r *http.Request) (string, error) {
	p, _ := r.Context().Value(principalKey{}).(string)
	return p, nil
}

// recoverer answers a panic with 500, as chi's Recoverer does.
func recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				http.Error(w, "internal server error", http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func handler(h adaptertest.Handler) http.Handler {
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

var harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemhttp.New(idemhttp.Config{Config: cfg, Principal: principal})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(recoverer(authenticate(mw(handler(h)))))
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}

func TestNewRequiresPrincipal(t *testing.T) {
	_, err := idemhttp.New(idemhttp.Config{Config: idem.Config{Store: storetest.MemBackend(t).Store}})
	if err == nil {
		t.Fatal("New without Principal succeeded")
	}
}
