package idemgin_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	"github.com/idemgo/idem/adapters/gin/idemgintest"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
)

// BenchmarkMiddleware is the engine overhead on Gin (see
// adaptertest.Benchmarks):
//
//	go test -run '^$' -bench . -benchmem
func BenchmarkMiddleware(b *testing.B) {
	adaptertest.Benchmarks(b, func(eng *idem.Engine) http.Handler {
		r := gin.New()
		chain := []gin.HandlerFunc{idemgintest.Authenticate}
		if eng != nil {
			mw, err := idemgin.New(idemgin.Config{Engine: eng, Principal: idemgintest.Principal})
			if err != nil {
				b.Fatal(err)
			}
			chain = append(chain, mw)
		}
		chain = append(chain, func(c *gin.Context) {
			c.Header("Location", adaptertest.BenchLocation)
			c.Data(http.StatusCreated, "application/json", adaptertest.BenchReply)
		})
		r.POST("/payments", chain...)
		return r
	})
}
