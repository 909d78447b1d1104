package idemecho_test

import (
	"net/http"
	"testing"

	idemecho "github.com/idemgo/idem/adapters/echo"
	"github.com/idemgo/idem/adapters/echo/idemechotest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/labstack/echo/v4"
)

// BenchmarkMiddleware is the engine overhead on Echo (see
// adaptertest.Benchmarks):
//
//	go test -run '^$' -bench . -benchmem
func BenchmarkMiddleware(b *testing.B) {
	adaptertest.Benchmarks(b, func(eng *idem.Engine) http.Handler {
		e := echo.New()
		chain := []echo.MiddlewareFunc{idemechotest.Authenticate}
		if eng != nil {
			mw, err := idemecho.New(idemecho.Config{Engine: eng, Principal: idemechotest.Principal})
			if err != nil {
				b.Fatal(err)
			}
			chain = append(chain, mw)
		}
		e.POST("/payments", func(c echo.Context) error {
			c.Response().Header().Set("Location", adaptertest.BenchLocation)
			return c.JSONBlob(http.StatusCreated, adaptertest.BenchReply)
		}, chain...)
		return e
	})
}
