// Package idemgintest mounts the Gin adapter for core/adaptertest: Harness
// serves the suite's handler behind idemgin's middleware, placed as the
// suite's Setup asks (on a route group or the whole engine, after an auth
// middleware or, wrongly, before it), under Gin's own Recovery, on a real
// server on 127.0.0.1. The adapter's own tests and the conformance module
// (which runs the suite against every store) share it. It imports only
// core and Gin, and changes none of Gin's global settings: a test package
// that wants Gin's test mode sets it in its TestMain.
package idemgintest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	"github.com/idemgo/idem/core/adaptertest"
)

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
		if reply.Err != nil {
			status := reply.Status
			if status == 0 {
				status = http.StatusInternalServerError
			}
			_ = c.AbortWithError(status, reply.Err)
			return
		}
		if reply.Status != 0 || reply.Panic == nil {
			for k, v := range reply.Header {
				c.Writer.Header()[k] = v
			}
			c.Status(reply.Status)
			_, _ = c.Writer.Write(reply.Body)
		}
		if reply.Panic != nil {
			panic(reply.Panic)
		}
	}
}

// Harness mounts idemgin for core/adaptertest: gin's Recovery on the
// engine, the Setup's early headers, Authenticate and the middleware as
// the Setup places them, then Handler, on an httptest server.
var Harness = adaptertest.Harness{
	Serve: func(t testing.TB, s adaptertest.Setup) (string, error) {
		engine, err := adaptertest.Engine(s)
		if err != nil {
			return "", err
		}
		mw, err := idemgin.New(idemgin.Config{Engine: engine, Principal: adaptertest.PrincipalFunc(s, Principal)})
		if err != nil {
			return "", err
		}
		global, group := adaptertest.Place(s, Authenticate, mw)
		r := gin.New()
		r.Use(recovery(), func(c *gin.Context) {
			for k, v := range s.Header {
				c.Writer.Header()[k] = v
			}
			c.Next()
		})
		r.Use(global...)
		h := Handler(s.Handler)
		r.Any("/outside", h)
		api := r.Group("/payments", group...)
		api.Any("", h)
		api.Any("/*rest", h)
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}
