package main

import (
	"io"
	"log/slog"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
)

func init() { frameworks["gin"] = newGin }

// newGin mounts the service on Gin: recovery → authentication →
// idempotency → handler.
func newGin(a *app) (server, error) {
	idempotent, err := idemgin.New(idemgin.Config{
		Engine:    a.engine,
		Principal: func(c *gin.Context) (string, error) { return c.GetString("account"), nil },
	})
	if err != nil {
		return nil, err
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, v any) {
		// idemgin has rolled back, released the key and put the real
		// writer back before the panic got here.
		a.log.ErrorContext(c.Request.Context(), "handler panicked", slog.Any("panic", v), slog.String("path", c.Request.URL.Path))
		ginReply(c, InternalError())
		c.Abort()
	}))
	auth := func(c *gin.Context) {
		account := Authenticate(c.GetHeader("Authorization"))
		if account == "" {
			ginReply(c, Unauthorized())
			c.Abort()
			return
		}
		c.Set("account", account)
	}

	api := r.Group("/payments", auth)
	api.POST("", idempotent, func(c *gin.Context) {
		body, _ := io.ReadAll(c.Request.Body)
		// The idempotency transaction travels in the request's context.
		ginReply(c, a.svc.Create(c.Request.Context(), c.GetString("account"), body, c.GetHeader(SimulateHeader)))
	})
	api.GET("", func(c *gin.Context) { ginReply(c, a.svc.List(c.Request.Context(), c.GetString("account"))) })
	api.GET("/:id", func(c *gin.Context) {
		ginReply(c, a.svc.Get(c.Request.Context(), c.GetString("account"), c.Param("id")))
	})
	r.GET("/healthz", func(c *gin.Context) { ginReply(c, a.svc.Health()) })
	r.GET("/metrics", gin.WrapH(a.metrics))
	return newHTTPServer(r, a.engine.Config()), nil
}

func ginReply(c *gin.Context, r Reply) {
	for k, v := range r.Header {
		c.Writer.Header()[k] = v
	}
	c.Data(r.Status, r.Header.Get("Content-Type"), r.Body)
}
