// Package idemgintest mounts the Gin adapter for core/adaptertest: Harness
// serves the suite's handler behind idemgin's middleware, placed after an
// auth middleware on a route group, under Gin's own Recovery, on a real
// server on 127.0.0.1. The adapter's own tests and the conformance module
// (which runs the suite against every store) share it. It imports only
// core and Gin, and puts Gin in test mode when imported.
package idemgintest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
)

func init() { gin.SetMode(gin.TestMode) }

// Authenticate is the auth middleware the adapter sits behind: it stores
// the bearer principal with c.Set, the Gin idiom.
func Authenticate(c *gin.Context) {
	if p := adaptertest.Principal(c.GetHeader("Authorization")); p != "" {
		c.Set("principal", p)
	}
	c.Next()
}

// Principal is the adapter's principal function: it reads back what
// Authenticate stored.
func Principal(c *gin.Context) (string, error) { return c.GetString("principal"), nil }

// recovery is gin's own Recovery, without the stack trace on stderr.
func recovery() gin.HandlerFunc { return gin.RecoveryWithWriter(io.Discard) }

// Handler runs the suite's handler as a native Gin handler.
func Handler(h adaptertest.Handler) gin.HandlerFunc {
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

// Harness mounts idemgin for core/adaptertest: gin's Recovery on the
// engine, then a group with Authenticate and the middleware, then Handler
// on every path, on an httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, cfg idem.Config, h adaptertest.Handler) string {
		mw, err := idemgin.New(idemgin.Config{Config: cfg, Principal: Principal})
		if err != nil {
			t.Fatal(err)
		}
		r := gin.New()
		r.Use(recovery())
		api := r.Group("/", Authenticate, mw)
		api.Any("/*path", Handler(h))
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return srv.URL
	},
}
