package idemecho_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idemecho "github.com/idemgo/idem/adapters/echo"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
	"github.com/labstack/echo/v4"
)

// fixture is one server: a backend, the middleware and an Echo the test
// fills in.
type fixture struct {
	b  storetest.Backend
	mw echo.MiddlewareFunc
	e  *echo.Echo
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
	mw, err := idemecho.New(idemecho.Config{Engine: eng, Principal: principal})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{b: b, mw: mw, e: newEcho()}
}

func (f *fixture) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(f.e)
	t.Cleanup(srv.Close)
	return srv.URL
}

func (f *fixture) records(t testing.TB) int { return storetest.Held(t, f.b.Store) }

// pay writes one business effect for the request in the transaction the
// handler's context carries, then answers 201.
func pay(f *fixture, runs *atomic.Int64) echo.HandlerFunc {
	return func(c echo.Context) error {
		n := runs.Add(1)
		if err := f.b.WriteEffect(c.Request().Context(), c.Request().Header.Get(idem.DefaultHeader)); err != nil {
			return c.String(599, "no transaction: "+err.Error())
		}
		return c.JSON(http.StatusCreated, echo.Map{"run": n})
	}
}

// The Echo trap: a handler that wrote before failing leaves the response
// committed, and the default error handler then writes nothing: 200 with an
// empty body, or here the core's 500, instead of the error's response.
func TestWroteThenFailed(t *testing.T) {
	f := newFixture(t)
	f.e.POST("/pay", func(c echo.Context) error {
		c.Response().Header().Set("Content-Type", "text/plain")
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte("half a payment"))
		c.Response().Flush()
		return echo.NewHTTPError(http.StatusBadGateway, "provider down")
	}, authenticate, f.mw)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	adaptertest.WantStatus(t, "wrote, then failed", r, http.StatusBadGateway)
	if strings.Contains(string(r.Body), "half") || !strings.Contains(string(r.Body), "provider down") {
		t.Fatalf("body %q, want only the error's rendering", r.Body)
	}
	if f.records(t) != 0 {
		t.Fatal("a failed outcome was stored")
	}
}

// A custom HTTPErrorHandler's response is what is buffered and sent.
func TestCustomErrorHandler(t *testing.T) {
	f := newFixture(t)
	f.e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		_ = c.JSON(http.StatusTeapot, echo.Map{"custom": err.Error()})
	}
	f.e.POST("/pay", func(c echo.Context) error { return errors.New("boom") }, authenticate, f.mw)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	adaptertest.WantStatus(t, "custom error handler", r, http.StatusTeapot)
	if !strings.Contains(string(r.Body), `"custom":"boom"`) {
		t.Fatalf("body %q", r.Body)
	}
}

// Flush through echo's Response panics when the writer cannot flush; the
// buffer can, and sends nothing early. Hijacking cannot reach past it.
func TestFlushDoesNotPanic(t *testing.T) {
	f := newFixture(t)
	f.e.POST("/pay", func(c echo.Context) error {
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte("a"))
		c.Response().Flush()
		_, _ = c.Response().Write([]byte("b"))
		if conn, _, err := c.Response().Hijack(); err == nil {
			conn.Close()
			return errors.New("hijacked the connection past the buffer")
		}
		return nil
	}, authenticate, f.mw)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	if r.Status != http.StatusCreated || string(r.Body) != "ab" {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}

// The middleware further out (a logger) sees the status and size of what
// was sent, and the original writer and request again.
func TestOuterMiddlewareSeesFinalResponse(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	type seen struct {
		status    int
		size      int64
		committed bool
		restored  bool
	}
	var last atomic.Value
	f.e.POST("/pay", pay(f, &runs), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			w, req := c.Response().Writer, c.Request()
			err := next(c)
			_, hasTx := memstore.Tx(c.Request().Context())
			last.Store(seen{c.Response().Status, c.Response().Size, c.Response().Committed,
				c.Response().Writer == w && c.Request() == req && !hasTx})
			return err
		}
	}, authenticate, f.mw)
	base := f.start(t)
	for _, tc := range []struct {
		key    string
		status int
	}{{"k", http.StatusCreated}, {"k", http.StatusCreated}, {"", http.StatusBadRequest}} {
		r := adaptertest.Send(t, "POST", base+"/pay", "alice", tc.key, `{}`)
		adaptertest.WantStatus(t, "request", r, tc.status)
		s := last.Load().(seen)
		if s.status != tc.status || s.size != int64(len(r.Body)) || !s.committed || !s.restored {
			t.Fatalf("outer middleware saw %+v for %d %q", s, r.Status, r.Body)
		}
	}
}

// With an optional key and none sent, the handler's error goes on to Echo
// unchanged.
func TestOptionalKeyPassesErrorOn(t *testing.T) {
	f := newFixture(t, func(c *idem.Config) { c.KeyOptional = true })
	f.e.POST("/pay", func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusConflict, "plain conflict")
	}, authenticate, f.mw)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "", `{}`)
	if r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "plain conflict") {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}
