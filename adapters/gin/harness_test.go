package idemgin_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/storetest"
)

func init() { gin.SetMode(gin.TestMode) }

// authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Set, the Gin idiom.
func authenticate(c *gin.Context) {
	if p := adaptertest.Principal(c.GetHeader("Authorization")); p != "" {
		c.Set("principal", p)
	}
	c.Next()
}

// principal reads back what authenticate stored.
func principal(c *gin.Context) (string, error) { return c.GetString("principal"), nil }

// recovery is gin's own Recovery, without the stack trace on stderr.
func recovery() gin.HandlerFunc { return gin.RecoveryWithWriter(io.Discard) }

// suiteHandler runs the suite's handler as a native Gin handler.
func suiteHandler(h adaptertest.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		body, _ := io.ReadAll(c.Request.Body)
		reply := h(c.Request.Context(), adaptertest.Request{
			Method: c.Request.Method, Path: c.Request.URL.Path, Header: c.Request.Header, Body: body,
			WriteEarly: func(p []byte) {
				_, _ = c.Writer.Write(p)
				c.Writer.Flush()
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
			_ = c.AbortWithError(status, reply.Err)
			return
		}
		for k, v := range reply.Header {
			c.Writer.Header()[k] = v
		}
		c.Status(status)
		_, _ = c.Writer.Write(reply.Body)
	}
}

var harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemgin.New(idemgin.Config{Config: cfg, Principal: principal})
		if err != nil {
			t.Fatal(err)
		}
		r := gin.New()
		r.Use(recovery())
		api := r.Group("/", authenticate, mw)
		api.Any("/*path", suiteHandler(h))
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}

func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, harness, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}
