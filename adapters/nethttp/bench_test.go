package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	"github.com/idemgo/idem/adapters/nethttp/idemhttptest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

const benchBody = `{"amount":1000,"currency":"EUR","description":"coffee"}`

func jsonHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
}

func benchRequest(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	return r.WithContext(idemhttptest.WithPrincipal(r.Context(), "acct_1"))
}

func benchMiddleware(b *testing.B) http.Handler {
	mw, err := idemhttp.New(idemhttp.Config{
		Config:    idem.Config{Store: memstore.New(memstore.WithMaxRecords(10_000_000))},
		Principal: principal,
	})
	if err != nil {
		b.Fatal(err)
	}
	return mw(http.HandlerFunc(jsonHandler))
}

// BenchmarkBare is the handler alone, the baseline the middleware adds to.
func BenchmarkBare(b *testing.B) {
	h := http.HandlerFunc(jsonHandler)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.ServeHTTP(httptest.NewRecorder(), benchRequest(strconv.Itoa(i)))
	}
}

// BenchmarkFirstRequest claims a new key, runs the handler and settles.
func BenchmarkFirstRequest(b *testing.B) {
	h := benchMiddleware(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, benchRequest(strconv.Itoa(i)))
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// BenchmarkReplay answers a settled key from the store.
func BenchmarkReplay(b *testing.B) {
	h := benchMiddleware(b)
	h.ServeHTTP(httptest.NewRecorder(), benchRequest("k"))
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, benchRequest("k"))
		if w.Header().Get(idem.ReplayedHeader) != "true" {
			b.Fatal("not replayed")
		}
	}
}
