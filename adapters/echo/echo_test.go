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

func newFixture(t *testing.T, mutate ...func(*idemecho.Config)) *fixture {
	t.Helper()
	b := storetest.MemBackend(t)
	cfg := idemecho.Config{
		Config:    idem.Config{Store: b.Store, RequestTimeout: 5 * time.Second, StoreTimeout: 2 * time.Second, Lease: 10 * time.Second},
		Principal: principal,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	mw, err := idemecho.New(cfg)
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

func (f *fixture) records() int { return f.b.Store.(*memstore.Store).Len() }

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

func TestBeforeAuthFailsClosed(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	// Wrong order: the idempotency middleware runs before authentication.
	f.e.POST("/pay", pay(f, &runs), f.mw, authenticate)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k1", `{}`)
	adaptertest.WantStatus(t, "middleware before auth", r, http.StatusUnauthorized)
	if r.ProblemType() != string(idem.ProblemUnauthenticated) {
		t.Fatalf("problem type %q", r.ProblemType())
	}
	if runs.Load() != 0 || f.records() != 0 {
		t.Fatalf("handler ran %d times, %d records claimed; want none", runs.Load(), f.records())
	}
}

func TestPrincipalErrorIs401(t *testing.T) {
	f := newFixture(t, func(c *idemecho.Config) {
		c.Principal = func(echo.Context) (string, error) { return "alice", errors.New("token expired") }
	})
	var runs atomic.Int64
	f.e.POST("/pay", pay(f, &runs), authenticate, f.mw)
	adaptertest.WantStatus(t, "principal error", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k1", `{}`), http.StatusUnauthorized)
	if runs.Load() != 0 || f.records() != 0 {
		t.Fatal("a request whose principal could not be read ran or claimed")
	}
}

func TestNewRequiresPrincipal(t *testing.T) {
	_, err := idemecho.New(idemecho.Config{Config: idem.Config{Store: memstore.New()}})
	if !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("New without Principal: %v", err)
	}
}

func TestOnRouteGroupAndGlobal(t *testing.T) {
	f := newFixture(t)
	var runs, health atomic.Int64
	f.e.GET("/health", func(c echo.Context) error { health.Add(1); return c.String(200, "ok") })
	api := f.e.Group("/api", authenticate, f.mw)
	api.POST("/pay", pay(f, &runs))
	base := f.start(t)

	if r := adaptertest.Send(t, "GET", base+"/health", "", "", ""); r.Status != 200 || health.Load() != 1 {
		t.Fatalf("route outside the group: %d %q", r.Status, r.Body)
	}
	first := adaptertest.Send(t, "POST", base+"/api/pay", "alice", "k-group", `{"a":1}`)
	adaptertest.WantStatus(t, "first", first, http.StatusCreated)
	again := adaptertest.Send(t, "POST", base+"/api/pay", "alice", "k-group", `{"a":1}`)
	adaptertest.WantStatus(t, "replay", again, http.StatusCreated)
	if !again.Replayed() || string(again.Body) != string(first.Body) || runs.Load() != 1 {
		t.Fatalf("replay %q %v (runs %d), want %q", again.Body, again.Header, runs.Load(), first.Body)
	}

	// Global: every route of the Echo.
	g := newFixture(t)
	g.e.Use(authenticate, g.mw)
	g.e.POST("/pay", pay(g, &runs))
	if r := adaptertest.Send(t, "POST", g.start(t)+"/pay", "alice", "", `{}`); r.Status != http.StatusBadRequest {
		t.Fatalf("global middleware without key: %d", r.Status)
	}
}

// A returned error is rendered by the HTTPErrorHandler inside the
// middleware: the client gets that rendering, the outcome is released, and
// the retry runs again.
func TestHandlerErrorIsReleased(t *testing.T) {
	f := newFixture(t)
	var calls atomic.Int64
	f.e.POST("/pay", func(c echo.Context) error {
		if err := f.b.WriteEffect(c.Request().Context(), "k-err"); err != nil {
			return c.String(599, err.Error())
		}
		if calls.Add(1) == 1 {
			return echo.NewHTTPError(http.StatusServiceUnavailable, "provider down")
		}
		return c.JSON(http.StatusCreated, echo.Map{"ok": true})
	}, authenticate, f.mw)
	base := f.start(t)
	r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k-err", `{}`)
	adaptertest.WantStatus(t, "failing handler", r, http.StatusServiceUnavailable)
	if !strings.Contains(string(r.Body), "provider down") {
		t.Fatalf("the HTTPErrorHandler's rendering was lost: %q", r.Body)
	}
	if n := adaptertest.Effects(t, f.b, "k-err"); n != 0 || f.records() != 0 {
		t.Fatalf("a failed attempt left %d effects and %d records", n, f.records())
	}
	r = adaptertest.Send(t, "POST", base+"/pay", "alice", "k-err", `{}`)
	adaptertest.WantStatus(t, "retry", r, http.StatusCreated)
	if r.Header.Get(idem.ReplayedHeader) != "" || adaptertest.Effects(t, f.b, "k-err") != 1 {
		t.Fatal("the retry did not run the handler once more")
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
	if f.records() != 0 {
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

func TestPanicWithEchoRecover(t *testing.T) {
	for _, wroteFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "before writing", true: "after writing"}[wroteFirst], func(t *testing.T) {
			f := newFixture(t)
			var calls atomic.Int64
			f.e.POST("/pay", func(c echo.Context) error {
				_ = f.b.WriteEffect(c.Request().Context(), "k-panic")
				if calls.Add(1) == 1 {
					if wroteFirst {
						c.Response().Header().Set("Location", "/payments/half")
						_ = c.String(http.StatusCreated, "half")
					}
					panic("boom")
				}
				return c.String(http.StatusCreated, "paid")
			}, authenticate, f.mw)
			base := f.start(t)
			r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k-panic", `{}`)
			adaptertest.WantStatus(t, "panicking handler", r, http.StatusInternalServerError)
			if strings.Contains(string(r.Body), "half") || r.Header.Get("Location") != "" {
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

// The transaction the handler reaches through c.Request().Context() is the
// one that commits with the record.
func TestTransactionCommitsWithRecord(t *testing.T) {
	f := newFixture(t)
	f.e.POST("/pay/:status", func(c echo.Context) error {
		if err := f.b.WriteEffect(c.Request().Context(), c.Param("status")); err != nil {
			return c.String(599, err.Error())
		}
		switch c.Param("status") {
		case "201":
			return c.String(http.StatusCreated, "ok")
		case "422":
			return c.String(http.StatusUnprocessableEntity, "no")
		default:
			return c.String(http.StatusBadGateway, "down")
		}
	}, authenticate, f.mw)
	base := f.start(t)
	for _, tc := range []struct {
		status  string
		effects int
	}{{"201", 1}, {"422", 1}, {"502", 0}} {
		r := adaptertest.Send(t, "POST", base+"/pay/"+tc.status, "alice", "k-"+tc.status, `{}`)
		if r.Status == 599 {
			t.Fatalf("%s: handler saw no transaction: %q", tc.status, r.Body)
		}
		if n := adaptertest.Effects(t, f.b, tc.status); n != tc.effects {
			t.Fatalf("%s: %d committed effects, want %d", tc.status, n, tc.effects)
		}
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
			_, hasTx := memstore.TxFrom(c.Request().Context())
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

// Headers set before the middleware survive on the first response, on a
// replay and on the engine's own problems.
func TestEarlierHeadersSurvive(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	f.e.POST("/pay", pay(f, &runs), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header().Set("Access-Control-Allow-Origin", "*")
			return next(c)
		}
	}, authenticate, f.mw)
	base := f.start(t)
	for _, key := range []string{"k", "k", ""} {
		r := adaptertest.Send(t, "POST", base+"/pay", "alice", key, `{}`)
		if r.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Fatalf("key %q: status %d lost the CORS header: %v", key, r.Status, r.Header)
		}
	}
}

// With an optional key and none sent, the handler's error goes on to Echo
// unchanged.
func TestOptionalKeyPassesErrorOn(t *testing.T) {
	f := newFixture(t, func(c *idemecho.Config) { c.KeyOptional = true })
	f.e.POST("/pay", func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusConflict, "plain conflict")
	}, authenticate, f.mw)
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "", `{}`)
	if r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "plain conflict") {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}
