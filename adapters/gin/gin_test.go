package idemgin_test

import (
	"context"
	"errors"
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

func newFixture(t *testing.T, mutate ...func(*idem.Config)) *fixture {
	t.Helper()
	b := storetest.MemBackend(t)
	cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: b.Store, RequestTimeout: 5 * time.Second, StoreTimeout: 2 * time.Second, Lease: 10 * time.Second}
	for _, m := range mutate {
		m(&cfg)
	}
	eng, err := idem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemgin.New(idemgin.Config{Engine: eng, Principal: principal})
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

func (f *fixture) records(t testing.TB) int { return storetest.Held(t, f.b.Store) }

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
	if adaptertest.Effects(t, f.b, "k") != 0 || f.records(t) != 0 {
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

// Without ContextWithFallback (gin's default) *gin.Context passes no
// request value through: the middleware stores the attempt's context under
// idemadapter.ContextKey, so a handler that passes c itself to a store's accessor
// or to DownstreamKey still runs in the transaction, never around it.
func TestContextWithoutFallback(t *testing.T) {
	f := newFixture(t)
	f.r.POST("/pay", authenticate, f.mw, func(c *gin.Context) {
		if _, err := idem.DownstreamKey(c, "charge"); err != nil {
			c.String(599, "DownstreamKey(c): %v", err)
			return
		}
		if err := f.b.WriteEffect(c, "k"); err != nil {
			c.String(599, "WriteEffect(c): %v", err)
			return
		}
		c.Status(http.StatusCreated)
	})
	adaptertest.WantStatus(t, "*gin.Context as the context", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`), http.StatusCreated)
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
	if f.records(t) != 0 {
		t.Fatal("stored")
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
		_, hasTx := memstore.Tx(c.Request.Context())
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
	for f.records(t) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if f.records(t) != 0 {
		t.Fatal("an attempt whose client went away was stored")
	}
}
