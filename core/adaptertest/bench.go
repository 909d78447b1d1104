package adaptertest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// BenchBody is the JSON every benchmark request posts.
const BenchBody = `{"amount":1000,"currency":"EUR","description":"coffee"}`

// BenchReply is the body the benchmarks' trivial handler answers with,
// status 201, Content-Type application/json and Location BenchLocation.
var BenchReply = []byte(`{"id":"pay_1","status":"succeeded"}`)

// BenchLocation is the Location of the benchmarks' 201: a created resource
// is named in it, so a realistic response has two headers to store.
const BenchLocation = "/payments/pay_1"

// BenchServe builds the handler an adapter's benchmarks measure: the
// framework's router with the harness's auth middleware (bearer principal,
// as in Harness) and a trivial handler that answers 201 with BenchReply,
// Content-Type application/json and Location BenchLocation. When eng is
// not nil the adapter's middleware, running on eng, sits between the two.
type BenchServe func(eng *idem.Engine) http.Handler

// RoundTrip runs one benchmark request through a server in process: a POST
// of BenchBody to /payments as "Authorization: Bearer acct_1", with
// Content-Type application/json and Idempotency-Key key. It returns the
// response's status and whether it was marked as replayed.
type RoundTrip func(key string) (status int, replayed bool)

// RoundTripServe is BenchServe for a framework that is not built on
// net/http (Fiber): it returns a RoundTrip through the framework's own
// in-process entry point.
type RoundTripServe func(eng *idem.Engine) RoundTrip

// Benchmarks measures what an adapter adds to a request, in process and
// without a socket (see RoundTripBenchmarks), for a framework built on
// net/http.
func Benchmarks(b *testing.B, serve BenchServe) {
	RoundTripBenchmarks(b, func(eng *idem.Engine) RoundTrip {
		h := serve(eng)
		return func(key string) (int, bool) {
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(BenchBody))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer acct_1")
			r.Header.Set(idem.DefaultHeader, key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Code, w.Header().Get(idem.ReplayedHeader) == "true"
		}
	})
}

// BenchStore returns a memstore for benchmarks in which one principal
// makes every request with a new key: memstore's default bounds (a tenth
// of 256 MiB for a principal) would refuse it after about 50,000 requests,
// less than a second of them on a fast machine.
func BenchStore() *memstore.Store {
	return memstore.MustNew(memstore.WithMaxRecords(50_000_000), memstore.WithMaxBytes(32<<30), memstore.WithPrincipalShare(1))
}

// RoundTripBenchmarks measures what an adapter adds to a request: Bare is
// the handler alone, FirstRequest claims a new key behind the middleware
// with memstore, runs the handler and settles, Observed does the same with
// an Observer receiving the Events, Replay answers a settled key from the
// store. Run with -benchmem; the difference between FirstRequest and Bare
// is the middleware's cost.
func RoundTripBenchmarks(b *testing.B, serve RoundTripServe) {
	middleware := func(observed bool) RoundTrip {
		// The handler writes nothing, so the engine is told not to warn
		// about a transaction it did not use: a log line per request.
		cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: BenchStore(), AllowTxUnused: true}
		if observed {
			cfg.Observer = idem.ObserverFunc(func(context.Context, idem.Event) {})
		}
		eng, err := idem.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return serve(eng)
	}
	run := func(b *testing.B, rt RoundTrip, key func(i int) string, replay bool) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if status, replayed := rt(key(i)); status != http.StatusCreated || replayed != replay {
				b.Fatalf("status %d, replayed %v", status, replayed)
			}
		}
	}
	b.Run("Bare", func(b *testing.B) { run(b, serve(nil), strconv.Itoa, false) })
	b.Run("FirstRequest", func(b *testing.B) { run(b, middleware(false), strconv.Itoa, false) })
	b.Run("Observed", func(b *testing.B) { run(b, middleware(true), strconv.Itoa, false) })
	b.Run("Replay", func(b *testing.B) {
		rt := middleware(false)
		rt("k")
		run(b, rt, func(int) string { return "k" }, true)
	})
}
