package adaptertest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// BenchBody is the JSON every benchmark request posts.
const BenchBody = `{"amount":1000,"currency":"EUR","description":"coffee"}`

// BenchReply is the body the benchmarks' trivial handler answers with,
// status 201 and Content-Type application/json.
var BenchReply = []byte(`{"id":"pay_1","status":"succeeded"}`)

// BenchServe builds the handler an adapter's benchmarks measure: the
// framework's router with the harness's auth middleware (bearer principal,
// as in Harness) and a trivial handler that answers 201 with BenchReply
// and Content-Type application/json. When cfg is not nil the adapter's
// middleware, configured with *cfg, runs between the two.
type BenchServe func(cfg *idem.Config) http.Handler

// Benchmarks measures what an adapter adds to a request, in process and
// without a socket: Bare is the handler alone, FirstRequest claims a new
// key behind the middleware with memstore, runs the handler and settles,
// Replay answers a settled key from the store. Run with -benchmem; the
// difference between FirstRequest and Bare is the middleware's cost.
func Benchmarks(b *testing.B, serve BenchServe) {
	request := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(BenchBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer acct_1")
		r.Header.Set("Idempotency-Key", key)
		return r
	}
	middleware := func() http.Handler {
		return serve(&idem.Config{Store: memstore.New(memstore.WithMaxRecords(10_000_000))})
	}
	run := func(b *testing.B, h http.Handler, key func(i int) string, check func(*httptest.ResponseRecorder) bool) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, request(key(i)))
			if !check(w) {
				b.Fatalf("status %d, replayed %q, body %q", w.Code, w.Header().Get(idem.ReplayedHeader), w.Body)
			}
		}
	}
	created := func(w *httptest.ResponseRecorder) bool { return w.Code == http.StatusCreated }
	b.Run("Bare", func(b *testing.B) {
		run(b, serve(nil), strconv.Itoa, created)
	})
	b.Run("FirstRequest", func(b *testing.B) {
		run(b, middleware(), strconv.Itoa, func(w *httptest.ResponseRecorder) bool {
			return created(w) && w.Header().Get(idem.ReplayedHeader) == ""
		})
	})
	b.Run("Replay", func(b *testing.B) {
		h := middleware()
		h.ServeHTTP(httptest.NewRecorder(), request("k"))
		run(b, h, func(int) string { return "k" }, func(w *httptest.ResponseRecorder) bool {
			return created(w) && w.Header().Get(idem.ReplayedHeader) == "true"
		})
	})
}
