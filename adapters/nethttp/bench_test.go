package idemhttp_test

import (
	"net/http"
	"testing"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	"github.com/idemgo/idem/adapters/nethttp/idemhttptest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
)

// BenchmarkMiddleware is the engine overhead on net/http (see
// adaptertest.Benchmarks):
//
//	go test -run '^$' -bench . -benchmem
func BenchmarkMiddleware(b *testing.B) {
	adaptertest.Benchmarks(b, func(eng *idem.Engine) http.Handler {
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", adaptertest.BenchLocation)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(adaptertest.BenchReply)
		})
		if eng != nil {
			mw, err := idemhttp.New(idemhttp.Config{Engine: eng, Principal: idemhttptest.Principal})
			if err != nil {
				b.Fatal(err)
			}
			h = mw(h)
		}
		return idemhttptest.Authenticate(h)
	})
}
