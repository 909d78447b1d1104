package idemgin_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	idemgin "github.com/idemgo/idem/adapters/gin"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// fixture is one server: a backend, the middleware and a Gin engine the
// test fills in.
type fixture struct {
	b  storetest.Backend
	mw gin.HandlerFunc
	r  *gin.Engine
}

func newFixture(t *testing.T, mutate ...func(*idemgin.Config)) *fixture {
	t.Helper()
	b := storetest.MemBackend(t)
	cfg := idemgin.Config{
		Config:    idem.Config{Store: b.Store, RequestTimeout: 5 * time.Second, StoreTimeout: 2 * time.Second, Lease: 10 * time.Second},
		Principal: principal,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	mw, err := idemgin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{b: b, mw: mw, r: gin.New()}
}

func (f *fixture) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(f.r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func (f *fixture) records() int { return f.b.Store.(*memstore.Store).Len() }

// pay writes one business effect for the request in the transaction the
// handler's context carries, then answers 201.
func pay(f *fixture, runs *atomic.Int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		n := runs.Add(1)
		if err := f.b.WriteEffect(c.Request.Context(), c.GetHeader(idem.DefaultHeader)); err != nil {
			c.String(599, "no transaction: %v", err)
			return
		}
		c.JSON(http.StatusCreated, gin.H{"run": n})
	}
}

func TestBeforeAuthFailsClosed(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	// Wrong order: the idempotency middleware runs before authentication.
	f.r.POST("/pay", f.mw, authenticate, pay(f, &runs))
	base := f.start(t)

	r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k1", `{}`)
	adaptertest.WantStatus(t, "middleware before auth", r, http.StatusUnauthorized)
	if r.ProblemType() != string(idem.ProblemUnauthenticated) {
		t.Fatalf("problem type %q", r.ProblemType())
	}
	if runs.Load() != 0 || f.records() != 0 {
		t.Fatalf("handler ran %d times, %d records claimed; want none", runs.Load(), f.records())
	}
}

func TestPrincipalErrorIs401(t *testing.T) {
	f := newFixture(t, func(c *idemgin.Config) {
		c.Principal = func(*gin.Context) (string, error) { return "alice", errors.New("token expired") }
	})
	var runs atomic.Int64
	f.r.POST("/pay", authenticate, f.mw, pay(f, &runs))
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k1", `{}`)
	adaptertest.WantStatus(t, "principal error", r, http.StatusUnauthorized)
	if runs.Load() != 0 || f.records() != 0 {
		t.Fatal("a request whose principal could not be read ran or claimed")
	}
}

func TestNewRequiresPrincipal(t *testing.T) {
	_, err := idemgin.New(idemgin.Config{Config: idem.Config{Store: memstore.New()}})
	if !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("New without Principal: %v", err)
	}
}

func TestOnRouteGroupAndGlobal(t *testing.T) {
	f := newFixture(t)
	var runs, health atomic.Int64
	f.r.GET("/health", func(c *gin.Context) { health.Add(1); c.String(200, "ok") })
	api := f.r.Group("/api", authenticate, f.mw)
	api.POST("/pay", pay(f, &runs))
	base := f.start(t)

	if r := adaptertest.Send(t, "GET", base+"/health", "", "", ""); r.Status != 200 || health.Load() != 1 {
		t.Fatalf("route outside the group: %d %q", r.Status, r.Body)
	}
	first := adaptertest.Send(t, "POST", base+"/api/pay", "alice", "k-group", `{"a":1}`)
	adaptertest.WantStatus(t, "first", first, http.StatusCreated)
	again := adaptertest.Send(t, "POST", base+"/api/pay", "alice", "k-group", `{"a":1}`)
	adaptertest.WantStatus(t, "replay", again, http.StatusCreated)
	if !again.Replayed() || string(again.Body) != string(first.Body) {
		t.Fatalf("replay %q %v, want %q", again.Body, again.Header, first.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times: the replay did not abort the chain", runs.Load())
	}
	if r := adaptertest.Send(t, "POST", base+"/api/pay", "alice", "", `{}`); r.Status != http.StatusBadRequest {
		t.Fatalf("group route without key: %d", r.Status)
	}

	// Global: every route of the engine.
	g := newFixture(t)
	g.r.Use(authenticate, g.mw)
	g.r.POST("/pay", pay(g, &runs))
	if r := adaptertest.Send(t, "POST", g.start(t)+"/pay", "alice", "", `{}`); r.Status != http.StatusBadRequest {
		t.Fatalf("global middleware without key: %d", r.Status)
	}
}

func TestHandlerErrorIsReleased(t *testing.T) {
	f := newFixture(t)
	var calls atomic.Int64
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		if err := f.b.WriteEffect(c.Request.Context(), "k-err"); err != nil {
			c.String(599, err.Error())
			return
		}
		if calls.Add(1) == 1 {
			_ = c.AbortWithError(http.StatusServiceUnavailable, errors.New("provider down"))
			return
		}
		c.JSON(http.StatusCreated, gin.H{"ok": true})
	})
	base := f.start(t)
	adaptertest.WantStatus(t, "failing handler", adaptertest.Send(t, "POST", base+"/pay", "alice", "k-err", `{}`), http.StatusServiceUnavailable)
	if n := adaptertest.Effects(t, f.b, "k-err"); n != 0 || f.records() != 0 {
		t.Fatalf("a failed attempt left %d effects and %d records", n, f.records())
	}
	r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k-err", `{}`)
	adaptertest.WantStatus(t, "retry", r, http.StatusCreated)
	if r.Header.Get(idem.ReplayedHeader) != "" || adaptertest.Effects(t, f.b, "k-err") != 1 {
		t.Fatal("the retry did not run the handler once more")
	}
}

// A handler that reports an error with c.Error but still answers 2xx did
// not succeed: the outcome is rolled back, and the client must not get the
// 2xx.
func TestErrorWithSuccessStatusIsNotStored(t *testing.T) {
	f := newFixture(t)
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		_ = f.b.WriteEffect(c.Request.Context(), "k")
		_ = c.Error(errors.New("audit log write failed"))
		c.JSON(http.StatusCreated, gin.H{"ok": true})
	})
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	if r.Status < 500 || r.ProblemType() != string(idem.ProblemCommitFailed) {
		t.Fatalf("2xx with c.Errors answered %d %q", r.Status, r.Body)
	}
	if adaptertest.Effects(t, f.b, "k") != 0 || f.records() != 0 {
		t.Fatal("an outcome with c.Errors was committed")
	}
}

// Errors attached by middleware before this one are not the handler's.
func TestEarlierErrorsAreNotTheHandlers(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	f.r.POST("/pay", func(c *gin.Context) { _ = c.Error(errors.New("earlier, unrelated")); c.Next() },
		authenticate, f.mw, pay(f, &runs))
	base := f.start(t)
	adaptertest.WantStatus(t, "first", adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`), http.StatusCreated)
	if r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`); !r.Replayed() {
		t.Fatalf("not stored: %d %q", r.Status, r.Body)
	}
}

// The Gin trap: a panic that left the buffer installed would let
// gin.Recovery write its 500 into the buffer, and Gin would then send 200
// with an empty body.
func TestPanicWithGinRecovery(t *testing.T) {
	for _, wroteFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "before writing", true: "after writing"}[wroteFirst], func(t *testing.T) {
			f := newFixture(t)
			var calls atomic.Int64
			f.r.Use(gin.RecoveryWithWriter(io.Discard))
			f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
				_ = f.b.WriteEffect(c.Request.Context(), "k-panic")
				if calls.Add(1) == 1 {
					if wroteFirst {
						c.Header("Location", "/payments/half")
						c.String(http.StatusCreated, "half")
					}
					panic("boom")
				}
				c.String(http.StatusCreated, "paid")
			})
			base := f.start(t)
			r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k-panic", `{}`)
			adaptertest.WantStatus(t, "panicking handler", r, http.StatusInternalServerError)
			if string(r.Body) != "" || r.Header.Get("Location") != "" {
				t.Fatalf("the handler's partial response reached the client: %v %q", r.Header, r.Body)
			}
			if adaptertest.Effects(t, f.b, "k-panic") != 0 || f.records() != 0 {
				t.Fatal("a panic left effects or a record")
			}
			r = adaptertest.Send(t, "POST", base+"/pay", "alice", "k-panic", `{}`)
			if r.Status != http.StatusCreated || string(r.Body) != "paid" || r.Header.Get(idem.ReplayedHeader) != "" {
				t.Fatalf("retry after a panic: %d %q", r.Status, r.Body)
			}
			if calls.Load() != 2 || adaptertest.Effects(t, f.b, "k-panic") != 1 {
				t.Fatalf("calls %d effects %d", calls.Load(), adaptertest.Effects(t, f.b, "k-panic"))
			}
		})
	}
}

// The transaction the handler reaches through c.Request.Context() is the
// one that commits with the record: its write counts only when the record
// is stored, and never when the outcome is released.
func TestTransactionCommitsWithRecord(t *testing.T) {
	f := newFixture(t)
	var same atomic.Bool
	f.r.POST("/pay/:status", authenticate, f.mw, func(c *gin.Context) {
		tx, ok := memstore.TxFrom(c.Request.Context())
		tx2, _ := memstore.TxFrom(c.Request.Context())
		same.Store(ok && tx == tx2)
		if err := f.b.WriteEffect(c.Request.Context(), c.Param("status")); err != nil {
			c.String(599, err.Error())
			return
		}
		switch c.Param("status") {
		case "201":
			c.String(http.StatusCreated, "ok")
		case "422":
			c.String(http.StatusUnprocessableEntity, "no")
		default:
			c.String(http.StatusBadGateway, "down")
		}
	})
	base := f.start(t)
	for _, tc := range []struct {
		status  string
		effects int
	}{{"201", 1}, {"422", 1}, {"502", 0}} {
		r := adaptertest.Send(t, "POST", base+"/pay/"+tc.status, "alice", "k-"+tc.status, `{}`)
		if r.Status == 599 || !same.Load() {
			t.Fatalf("%s: handler saw no transaction: %q", tc.status, r.Body)
		}
		if n := adaptertest.Effects(t, f.b, tc.status); n != tc.effects {
			t.Fatalf("%s: %d committed effects, want %d", tc.status, n, tc.effects)
		}
	}
}

// With gin's ContextWithFallback, *gin.Context itself is a context that
// carries the transaction.
func TestContextWithFallback(t *testing.T) {
	f := newFixture(t)
	f.r.ContextWithFallback = true
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		if err := f.b.WriteEffect(c, "k"); err != nil {
			c.String(599, err.Error())
			return
		}
		c.Status(http.StatusCreated)
	})
	adaptertest.WantStatus(t, "fallback", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`), http.StatusCreated)
	if adaptertest.Effects(t, f.b, "k") != 1 {
		t.Fatal("the write through *gin.Context did not commit")
	}
}

// Gin writes a status set without a body only at the end of the request;
// the buffer must get it too, or a 204 would be stored as 200.
func TestStatusWithoutBody(t *testing.T) {
	f := newFixture(t)
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) { c.Status(http.StatusAccepted) })
	base := f.start(t)
	adaptertest.WantStatus(t, "first", adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`), http.StatusAccepted)
	r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`)
	adaptertest.WantStatus(t, "replay", r, http.StatusAccepted)
	if !r.Replayed() {
		t.Fatal("not replayed")
	}
}

// The buffering writer honours gin.ResponseWriter the way gin's own does.
func TestWriterContract(t *testing.T) {
	f := newFixture(t)
	problems := make(chan string, 16)
	check := func(ok bool, what string) {
		if !ok {
			problems <- what
		}
	}
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		w := c.Writer
		check(w.Size() == -1 && !w.Written() && w.Status() == http.StatusOK, "fresh writer: Size -1, not Written, Status 200")
		c.Status(http.StatusCreated)
		c.Status(http.StatusAccepted)
		check(w.Status() == http.StatusAccepted && !w.Written(), "status settable until written")
		_, err := w.WriteString("ab")
		check(err == nil && w.Size() == 2 && w.Written(), "WriteString counts")
		w.WriteHeader(http.StatusInternalServerError)
		check(w.Status() == http.StatusAccepted, "status fixed once written")
		_, _ = w.Write([]byte("c"))
		w.Flush()
		check(w.Size() == 3, "Write counts")
		conn, _, err := w.Hijack()
		check(conn == nil && errors.Is(err, idemgin.ErrHijack), "Hijack refused")
		check(w.Pusher() == nil, "no Pusher")
		check(w.CloseNotify() != nil, "CloseNotify channel")
		select {
		case <-w.CloseNotify():
			check(false, "CloseNotify fired while the client waits")
		default:
		}
		_, _, err = http.NewResponseController(w).Hijack()
		check(err != nil, "ResponseController cannot reach the real connection")
	})
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	close(problems)
	for p := range problems {
		t.Error(p)
	}
	if r.Status != http.StatusAccepted || string(r.Body) != "abc" {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}

// A handler that flushed a 200 and then failed must not reach the client as
// 200 with a partial body.
func TestFlushThenFail(t *testing.T) {
	f := newFixture(t)
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		_, _ = c.Writer.WriteString("partial")
		c.Writer.Flush()
		_ = c.AbortWithError(http.StatusServiceUnavailable, errors.New("provider down"))
	})
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	if r.Status < 500 || strings.Contains(string(r.Body), "partial") {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
	if f.records() != 0 {
		t.Fatal("stored")
	}
}

// Headers set before the middleware (CORS, request ids) survive on the
// first response, on a replay and on the engine's own problems.
func TestEarlierHeadersSurvive(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	f.r.POST("/pay", func(c *gin.Context) { c.Header("Access-Control-Allow-Origin", "*"); c.Next() },
		authenticate, f.mw, pay(f, &runs))
	base := f.start(t)
	for _, key := range []string{"k", "k", ""} {
		r := adaptertest.Send(t, "POST", base+"/pay", "alice", key, `{}`)
		if r.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Fatalf("key %q: status %d lost the CORS header: %v", key, r.Status, r.Header)
		}
	}
}

// After the middleware, the middleware further out sees the original
// writer and request again.
func TestWriterAndRequestRestored(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	var restored atomic.Bool
	f.r.POST("/pay", func(c *gin.Context) {
		w, r := c.Writer, c.Request
		c.Next()
		_, hasTx := memstore.TxFrom(c.Request.Context())
		restored.Store(c.Writer == w && c.Request == r && !hasTx)
	}, authenticate, f.mw, pay(f, &runs))
	adaptertest.WantStatus(t, "request", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`), http.StatusCreated)
	if !restored.Load() {
		t.Fatal("c.Writer or c.Request was left pointing at the attempt")
	}
}

// CloseNotify fires when the client goes away, as gin's own writer does;
// the attempt is then released, not stored.
func TestCloseNotifyWhenClientLeaves(t *testing.T) {
	f := newFixture(t)
	fired := make(chan bool, 1)
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		select {
		case <-c.Writer.CloseNotify():
			fired <- true
		case <-time.After(3 * time.Second):
			fired <- false
		}
		c.Status(http.StatusCreated)
	})
	base := f.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/pay", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(idem.DefaultHeader, "k")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the request outlived its client-side deadline")
	}
	if !<-fired {
		t.Fatal("CloseNotify did not fire when the client went away")
	}
	deadline := time.Now().Add(2 * time.Second)
	for f.records() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if f.records() != 0 {
		t.Fatal("an attempt whose client went away was stored")
	}
}
