package idemfiber_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/gofiber/fiber/v2/utils"
	idemfiber "github.com/idemgo/idem/adapters/fiber"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
)

// fixture is one server: a backend, the middleware and an app the test
// fills in.
type fixture struct {
	b   storetest.Backend
	mw  fiber.Handler
	app *fiber.App
}

func newFixture(t *testing.T, appCfg fiber.Config, mutate ...func(*idem.Config)) *fixture {
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
	mw, err := idemfiber.New(idemfiber.Config{Engine: eng, Principal: principal})
	if err != nil {
		t.Fatal(err)
	}
	appCfg.DisableStartupMessage = true
	app := fiber.New(appCfg)
	app.Use(recover.New())
	return &fixture{b: b, mw: mw, app: app}
}

func (f *fixture) start(t *testing.T) string { t.Helper(); return serve(t, f.app) }

func (f *fixture) records(t testing.TB) int { return storetest.Held(t, f.b.Store) }

// pay writes one business effect for the request in the transaction the
// handler's context carries, then answers 201 with the key and principal
// it saw.
func pay(f *fixture, runs *atomic.Int64) fiber.Handler {
	return func(c *fiber.Ctx) error {
		n := runs.Add(1)
		key := utils.CopyString(c.Get(idem.DefaultHeader)) // kept past the handler by the effect
		if err := f.b.WriteEffect(c.UserContext(), key); err != nil {
			return c.Status(599).SendString("no transaction: " + err.Error())
		}
		c.Set("Location", "/payments/"+key)
		return c.Status(http.StatusCreated).JSON(fiber.Map{"run": n, "key": key, "principal": c.Locals("principal")})
	}
}

// The Fiber trap: a returned error becomes a response only after the
// middleware returned. It is rendered with the app's ErrorHandler inside
// the middleware, in place of what the handler wrote before failing, so
// the client gets that rendering alone and the outcome is released.
func TestWroteThenFailed(t *testing.T) {
	f := newFixture(t, fiber.Config{})
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		if err := f.b.WriteEffect(c.UserContext(), "k-err"); err != nil {
			return c.Status(599).SendString(err.Error())
		}
		_ = c.Status(http.StatusCreated).SendString("half a payment")
		return fiber.NewError(http.StatusServiceUnavailable, "provider down")
	})
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k-err", `{}`)
	adaptertest.WantStatus(t, "wrote, then failed", r, http.StatusServiceUnavailable)
	if string(r.Body) != "provider down" {
		t.Fatalf("body %q, want the ErrorHandler's rendering only", r.Body)
	}
	if n := adaptertest.Effects(t, f.b, "k-err"); n != 0 || f.records(t) != 0 {
		t.Fatalf("a failed attempt left %d effects and %d records", n, f.records(t))
	}
}

// The handler's c.UserContext() is the attempt's, derived from the user
// context set further out, which is back in place after the middleware.
func TestUserContextFromFurtherOut(t *testing.T) {
	type traceKey struct{}
	f := newFixture(t, fiber.Config{})
	var restored atomic.Bool
	f.app.Post("/pay", func(c *fiber.Ctx) error {
		ctx := context.WithValue(c.UserContext(), traceKey{}, "trace-1")
		c.SetUserContext(ctx)
		err := c.Next()
		restored.Store(c.UserContext() == ctx)
		return err
	}, authenticate, f.mw, func(c *fiber.Ctx) error {
		if c.UserContext().Value(traceKey{}) != "trace-1" {
			return c.Status(598).SendString("user context from further out lost")
		}
		if err := f.b.WriteEffect(c.UserContext(), "k"); err != nil {
			return c.Status(599).SendString(err.Error())
		}
		return c.Status(http.StatusCreated).SendString("ok")
	})
	adaptertest.WantStatus(t, "request", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`), http.StatusCreated)
	if !restored.Load() {
		t.Fatal("the user context was left pointing at the attempt")
	}
}

// The ErrorHandler that renders an error is the one of the (sub-)app the
// route belongs to, as Fiber itself would pick it.
func TestMountedSubAppErrorHandler(t *testing.T) {
	f := newFixture(t, fiber.Config{})
	sub := fiber.New(fiber.Config{ErrorHandler: func(c *fiber.Ctx, err error) error {
		c.Status(http.StatusTeapot)
		_, werr := c.WriteString(`{"sub":"` + err.Error() + `"}`) // appends to the body
		return werr
	}})
	sub.Post("/pay", func(c *fiber.Ctx) error {
		_ = c.Status(http.StatusCreated).SendString("half")
		return errors.New("sub failed")
	})
	f.app.Use(authenticate, f.mw)
	f.app.Mount("/v2", sub)
	r := adaptertest.Send(t, "POST", f.start(t)+"/v2/pay", "alice", "k", `{}`)
	adaptertest.WantStatus(t, "sub-app error", r, http.StatusTeapot)
	if string(r.Body) != `{"sub":"sub failed"}` {
		t.Fatalf("body %q", r.Body)
	}
	if f.records(t) != 0 {
		t.Fatal("stored")
	}
}

// An ErrorHandler that writes nothing must not turn an error into a
// success.
func TestSilentErrorHandlerIsNotSuccess(t *testing.T) {
	f := newFixture(t, fiber.Config{ErrorHandler: func(*fiber.Ctx, error) error { return nil }})
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		_ = c.Status(http.StatusCreated).SendString("looks fine")
		return errors.New("was not")
	})
	r := adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`)
	if r.Status < 500 || strings.Contains(string(r.Body), "looks fine") {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
}

// Fiber reuses its request and response buffers (Immutable is false by
// default, and the harness's auth middleware keeps c.Get's result without
// copying). Keys, principals and bodies the engine keeps must survive the
// next requests on the same buffers, sequential and concurrent.
func TestReusedBuffers(t *testing.T) {
	f := newFixture(t, fiber.Config{})
	var runs atomic.Int64
	f.app.Post("/pay", authenticate, f.mw, pay(f, &runs))
	base := f.start(t)
	const n = 40
	key := func(i int) string { return fmt.Sprintf("key-%03d", i) }
	who := func(i int) string { return fmt.Sprintf("acct-%02d", i%7) }
	first := make([]adaptertest.Response, n)
	for i := range n { // sequential: one keep-alive connection, one buffer
		first[i] = adaptertest.Send(t, "POST", base+"/pay", who(i), key(i), fmt.Sprintf(`{"i":%d}`, i))
		adaptertest.WantStatus(t, key(i), first[i], http.StatusCreated)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4*n)
	for range 4 { // concurrent retries of every key
		for i := range n {
			wg.Go(func() {
				r, err := adaptertest.SendContext(context.Background(), "POST", base+"/pay", who(i), key(i), fmt.Sprintf(`{"i":%d}`, i))
				switch {
				case err != nil:
					errs <- err.Error()
				case r.Status != http.StatusCreated || string(r.Body) != string(first[i].Body) || !r.Replayed():
					errs <- fmt.Sprintf("%s: %d %q %v, want a replay of %q", key(i), r.Status, string(r.Body), r.Header, string(first[i].Body))
				case r.Header.Get("Location") != "/payments/"+key(i):
					errs <- fmt.Sprintf("%s: Location %q", key(i), r.Header.Get("Location"))
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if runs.Load() != n {
		t.Fatalf("handler ran %d times for %d keys", runs.Load(), n)
	}
	for i := range n {
		if !strings.Contains(string(first[i].Body), `"key":"`+key(i)+`"`) || !strings.Contains(string(first[i].Body), `"principal":"`+who(i)+`"`) {
			t.Fatalf("first response %d: %s", i, first[i].Body)
		}
		if c := adaptertest.Effects(t, f.b, key(i)); c != 1 {
			t.Fatalf("%s: %d effects", key(i), c)
		}
		rec, err := f.b.Store.Get(context.Background(), who(i), key(i))
		if err != nil || !strings.Contains(string(rec.Response.Body), key(i)) {
			t.Fatalf("stored record for %s/%s: %v %+v", who(i), key(i), err, rec.Response)
		}
	}
}

// Set-Cookie goes out with the first response only; headers fasthttp
// manages are never part of the stored result, even when listed.
func TestHeadersOfTheResult(t *testing.T) {
	f := newFixture(t, fiber.Config{ServerHeader: "fiber-test"}, func(c *idem.Config) {
		c.StoredHeaders = append([]string{"Content-Length", "Server", "Connection", "Date", "Transfer-Encoding"}, idem.DefaultStoredHeaders...)
	})
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		c.Cookie(&fiber.Cookie{Name: "session", Value: "s1"})
		c.Set("X-Not-Stored", "1")
		return c.Status(http.StatusCreated).SendString("paid")
	})
	base := f.start(t)
	first := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`)
	adaptertest.WantStatus(t, "first", first, http.StatusCreated)
	if !strings.HasPrefix(first.Header.Get("Set-Cookie"), "session=s1") || first.Header.Get("X-Not-Stored") != "1" {
		t.Fatalf("first response lost the handler's headers: %v", first.Header)
	}
	if len(first.Header.Values("Content-Length")) != 1 || first.Header.Get("Content-Length") != "4" {
		t.Fatalf("Content-Length %v", first.Header.Values("Content-Length"))
	}
	if first.Header.Get("Server") != "fiber-test" {
		t.Fatalf("the app's Server header was lost: %v", first.Header)
	}
	again := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`)
	if string(again.Body) != "paid" || again.Header.Get("Set-Cookie") != "" || again.Header.Get("X-Not-Stored") != "" {
		t.Fatalf("replay: %q %v", again.Body, again.Header)
	}
	rec, err := f.b.Store.Get(context.Background(), "alice", "k")
	if err != nil {
		t.Fatal(err)
	}
	for name := range rec.Response.Header {
		if name != "Content-Type" {
			t.Fatalf("stored header %s", name)
		}
	}
}

// With StreamRequestBody the body arrives as a stream: it is read up to
// MaxBodyBytes for the fingerprint and handed to the handler whole.
func TestStreamedRequestBody(t *testing.T) {
	f := newFixture(t, fiber.Config{StreamRequestBody: true, ReadBufferSize: 4096, BodyLimit: 1 << 20},
		func(c *idem.Config) { c.MaxBodyBytes = 64 << 10 })
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString(fmt.Sprint(len(c.Body())))
	})
	base := f.start(t)
	body := `{"d":"` + strings.Repeat("x", 50_000) + `"}`
	r := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", body)
	if r.Status != http.StatusCreated || string(r.Body) != fmt.Sprint(len(body)) {
		t.Fatalf("got %d %q, want the whole body of %d bytes", r.Status, r.Body, len(body))
	}
	if again := adaptertest.Send(t, "POST", base+"/pay", "alice", "k", body); !again.Replayed() {
		t.Fatalf("replay of a streamed body: %d %q", again.Status, again.Body)
	}
	// The rest of a body the engine did not read stays on the connection,
	// where fasthttp would parse it as the next request: the connection
	// must close. (The client may see that as a reset while it still
	// writes the body; that is a closed connection too.)
	for _, tc := range []struct{ principal, key, body, problem string }{
		{"alice", "k-big", `{"d":"` + strings.Repeat("x", 100_000) + `"}`, string(idem.ProblemBodyTooLarge)},
		{"", "k-anon", body, string(idem.ProblemUnauthenticated)},
	} {
		r, err := adaptertest.SendContext(context.Background(), "POST", base+"/pay", tc.principal, tc.key, tc.body)
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatal(err)
			}
			continue
		}
		if r.ProblemType() != tc.problem {
			t.Fatalf("%s: %d %q", tc.key, r.Status, r.Body)
		}
		if !r.Close {
			t.Fatalf("%d answered without reading the streamed body keeps the connection: %v", r.Status, r.Header)
		}
	}
}

// A streamed response body is read into the result (bounded), stored and
// replayed.
func TestStreamedResponseBody(t *testing.T) {
	var logged syncBuffer
	f := newFixture(t, fiber.Config{}, func(c *idem.Config) {
		c.MaxResponseBytes, c.AllowTxUnused = 1024, true
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	})
	f.app.Post("/pay/:n", authenticate, f.mw, func(c *fiber.Ctx) error {
		n, _ := c.ParamsInt("n")
		c.Status(http.StatusCreated)
		return c.SendStream(bytes.NewReader(bytes.Repeat([]byte("s"), n)))
	})
	base := f.start(t)
	r := adaptertest.Send(t, "POST", base+"/pay/10", "alice", "k", `{}`)
	if r.Status != http.StatusCreated || string(r.Body) != "ssssssssss" {
		t.Fatalf("got %d %q", r.Status, r.Body)
	}
	if again := adaptertest.Send(t, "POST", base+"/pay/10", "alice", "k", `{}`); string(again.Body) != string(r.Body) || !again.Replayed() {
		t.Fatalf("replay %d %q", again.Status, again.Body)
	}
	big := adaptertest.Send(t, "POST", base+"/pay/5000", "alice", "k-big", `{}`)
	if big.ProblemType() != string(idem.ProblemResponseTooLarge) {
		t.Fatalf("oversized stream: %d %q", big.Status, big.Body)
	}
	// The handler meant to stream; it was sent whole, and the engine said
	// so, once.
	if n := strings.Count(logged.String(), "flushed or streamed"); n != 1 {
		t.Fatalf("two streamed responses logged the warning %d times, want once: %q", n, logged.String())
	}
}

// syncBuffer is a log destination safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Concurrent first executions: each response body is copied out of a
// buffer that fasthttp pools and hands to the next request, so a body kept
// by reference would be overwritten by another request's.
func TestConcurrentFirstRequests(t *testing.T) {
	f := newFixture(t, fiber.Config{})
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		key := c.Get(idem.DefaultHeader)
		return c.Status(http.StatusCreated).SendString(strings.Repeat(key+";", 200))
	})
	base := f.start(t)
	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	errs := make(chan string, workers*perWorker*2)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Sprintf("w%d-k%03d", w, i)
				want := strings.Repeat(key+";", 200)
				for attempt := range 2 { // the first execution, then its replay
					r, err := adaptertest.SendContext(context.Background(), "POST", base+"/pay", fmt.Sprintf("acct-%d", w), key, `{}`)
					switch {
					case err != nil:
						errs <- err.Error()
					case r.Status != http.StatusCreated || string(r.Body) != want:
						errs <- fmt.Sprintf("%s attempt %d: %d, body %.40q…, want its own", key, attempt, r.Status, string(r.Body))
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// c.Context() is fasthttp's RequestCtx: a context.Context without the user
// context's values. The README says to use c.UserContext(); this pins why.
func TestRequestCtxCarriesNoTransaction(t *testing.T) {
	f := newFixture(t, fiber.Config{})
	f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
		if err := f.b.WriteEffect(c.Context(), "k"); err == nil {
			return c.Status(599).SendString("c.Context() carried the transaction")
		}
		return c.Status(http.StatusCreated).SendString("ok")
	})
	adaptertest.WantStatus(t, "c.Context()", adaptertest.Send(t, "POST", f.start(t)+"/pay", "alice", "k", `{}`), http.StatusCreated)
}

// The middleware puts back the response set further out before writing the
// final one, and with it fasthttp's per-response settings the app chose: a
// first response looks like its replay and like the app without the
// middleware.
func TestAppResponseSettingsKept(t *testing.T) {
	for _, tc := range []struct {
		name    string
		app     fiber.Config
		header  string // the header the app leaves out
		handler fiber.Handler
	}{
		{"DisableDefaultContentType", fiber.Config{DisableDefaultContentType: true}, "Content-Type",
			func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).Send([]byte("paid")) }},
		{"DisableDefaultDate", fiber.Config{DisableDefaultDate: true}, "Date",
			func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("paid") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.app)
			f.app.Post("/plain", tc.handler)
			f.app.Post("/pay", authenticate, f.mw, tc.handler)
			base := f.start(t)
			for _, r := range []struct {
				what string
				resp adaptertest.Response
			}{
				{"without the middleware", adaptertest.Send(t, "POST", base+"/plain", "alice", "", `{}`)},
				{"first", adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`)},
				{"replay", adaptertest.Send(t, "POST", base+"/pay", "alice", "k", `{}`)},
			} {
				adaptertest.WantStatus(t, r.what, r.resp, http.StatusCreated)
				if v, ok := r.resp.Header[tc.header]; ok || string(r.resp.Body) != "paid" {
					t.Errorf("%s: %s %q, body %q; want no %[2]s", r.what, tc.header, v, r.resp.Body)
				}
			}
		})
	}
}

// What a store is given must be the request's own: the principal (from
// c.Locals, pointing into the request's buffer), the key and the request id
// (c.Get), and the stored header values (the response's buffers), all of
// which fasthttp reuses for the next request on the connection. A store
// must not keep the header map or the body it settles, but it may keep the
// strings, as keepingStore does. Each case sends n requests in sequence on
// one connection, then checks what the store kept, the records and every
// replay against their own request.
func TestStoreGetsItsOwnStrings(t *testing.T) {
	const n = 30
	for _, tc := range []struct {
		name   string
		app    fiber.Config
		stored []string // Config.StoredHeaders; nil for the default
		set    func(c *fiber.Ctx, i string)
		// want is the header stored for request i, exactly; first is
		// what the first response carries besides.
		want, first func(i string) http.Header
	}{{
		name: "default stored headers",
		set: func(c *fiber.Ctx, i string) {
			c.Set("Content-Type", "application/vnd.pay+json; v="+i)
			c.Set("Location", "/payments/"+i)
			c.Set("Cache-Control", "private, max-age="+i)
			c.Set("X-Not-Stored", "x-"+i)
			c.Cookie(&fiber.Cookie{Name: "s", Value: "c" + i})
		},
		want: func(i string) http.Header {
			return http.Header{"Content-Type": {"application/vnd.pay+json; v=" + i}, "Location": {"/payments/" + i}, "Cache-Control": {"private, max-age=" + i}}
		},
		first: func(i string) http.Header {
			return http.Header{"X-Not-Stored": {"x-" + i}, "Set-Cookie": {"s=c" + i + "; path=/; SameSite=Lax"}}
		},
	}, {
		name:   "several values and names of the user's",
		stored: []string{"Content-Type", "X-Payment-Id", "Vary", "Link"},
		set: func(c *fiber.Ctx, i string) {
			h := &c.Response().Header
			h.Add("Vary", "Origin-"+i)
			h.Add("X-Trace", "t-"+i)
			h.Add("Vary", "Accept-"+i) // not next to the first Vary
			h.Add("Link", "</a/"+i+">")
			h.Add("Link", "</b/"+i+">")
			h.Add("X-Payment-Id", "pay_"+i)
			c.Cookie(&fiber.Cookie{Name: "a", Value: "1" + i})
			c.Cookie(&fiber.Cookie{Name: "b", Value: "2" + i})
		},
		want: func(i string) http.Header {
			return http.Header{"Content-Type": {fiber.MIMETextPlainCharsetUTF8}, "Vary": {"Origin-" + i, "Accept-" + i},
				"Link": {"</a/" + i + ">", "</b/" + i + ">"}, "X-Payment-Id": {"pay_" + i}}
		},
		first: func(i string) http.Header {
			return http.Header{"X-Trace": {"t-" + i}, "Set-Cookie": {"a=1" + i + "; path=/; SameSite=Lax", "b=2" + i + "; path=/; SameSite=Lax"}}
		},
	}, {
		name:   "header names not normalised",
		app:    fiber.Config{DisableHeaderNormalizing: true},
		stored: []string{"X-Payment-Id"},
		set: func(c *fiber.Ctx, i string) {
			c.Response().Header.Add("x-payment-id", "pay_"+i)
			c.Response().Header.Add("x-trace", "t-"+i)
		},
		want:  func(i string) http.Header { return http.Header{"X-Payment-Id": {"pay_" + i}} },
		first: func(i string) http.Header { return http.Header{"X-Trace": {"t-" + i}} },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var store *keepingStore
			f := newFixture(t, tc.app, func(c *idem.Config) {
				store = &keepingStore{Store: c.Store}
				c.Store, c.StoredHeaders = store, tc.stored
			})
			f.app.Post("/pay", authenticate, f.mw, func(c *fiber.Ctx) error {
				i := c.Query("i")
				tc.set(c, i)
				return c.Status(http.StatusCreated).SendString("paid " + i)
			})
			base := f.start(t)
			// Lengths vary with i, so a value read from a reused buffer
			// is seen cut short or running on.
			num := func(i int) string { return strings.Repeat("9", i%5) + fmt.Sprint(i) }
			who := func(i int) string { return "acct-" + num(i) }
			key := func(i int) string { return "key-" + num(i) }
			send := func(i int) adaptertest.Response {
				return adaptertest.Send(t, "POST", base+"/pay?i="+num(i), who(i), key(i), `{}`, "X-Request-Id", "req-"+num(i))
			}
			wantHeader := func(what string, got http.Header, want http.Header) {
				t.Helper()
				for k, v := range want {
					if !slices.Equal(got[k], v) {
						t.Errorf("%s: %s %q, want %q", what, k, got[k], v)
					}
				}
			}
			for i := range n {
				r := send(i)
				adaptertest.WantStatus(t, key(i), r, http.StatusCreated)
				wantHeader(key(i)+" first response", r.Header, tc.want(num(i)))
				wantHeader(key(i)+" first response", r.Header, tc.first(num(i)))
			}
			store.mu.Lock()
			if len(store.claims) != n || len(store.settled) != n {
				t.Fatalf("%d claims and %d settles for %d requests", len(store.claims), len(store.settled), n)
			}
			for i := range n {
				if c, want := store.claims[i], (keptClaim{who(i), key(i), "req-" + num(i)}); c != want {
					t.Errorf("claim %d: %q, want %q", i, c, want)
				}
				if s, want := store.settled[i], tc.want(num(i)); s.lease != (idemstore.Lease{Principal: who(i), Key: key(i), Token: s.lease.Token}) ||
					!maps.EqualFunc(s.header, want, slices.Equal) {
					t.Errorf("settle %d: %q %q, want %q", i, s.lease, s.header, want)
				}
			}
			store.mu.Unlock()
			for i := range n {
				rec, err := f.b.Store.Get(context.Background(), who(i), key(i))
				if err != nil {
					t.Fatalf("%s: %v", key(i), err)
				}
				if rec.Principal != who(i) || rec.Key != key(i) || rec.RequestID != "req-"+num(i) || string(rec.Response.Body) != "paid "+num(i) {
					t.Errorf("%s: record %q %q %q %q", key(i), rec.Principal, rec.Key, rec.RequestID, rec.Response.Body)
				}
				if want := tc.want(num(i)); !maps.EqualFunc(rec.Response.Header, want, slices.Equal) {
					t.Errorf("%s: stored header %q, want %q", key(i), rec.Response.Header, want)
				}
				r := send(i)
				if !r.Replayed() || string(r.Body) != "paid "+num(i) {
					t.Errorf("%s: replay %d %q %v", key(i), r.Status, r.Body, r.Header)
				}
				wantHeader(key(i)+" replay", r.Header, tc.want(num(i)))
				for k := range tc.first(num(i)) {
					if v, ok := r.Header[k]; ok {
						t.Errorf("%s: replay carries %s %q", key(i), k, v)
					}
				}
			}
		})
	}
}

// keepingStore is a store that keeps the strings it is given, as the Store
// contract allows: those of each claim, and the lease and the stored header
// values of each settle (in maps and slices of its own).
type keepingStore struct {
	idemstore.Store
	mu      sync.Mutex
	claims  []keptClaim
	settled []keptSettle
}

type keptClaim struct{ principal, key, requestID string }

type keptSettle struct {
	lease  idemstore.Lease
	header http.Header
}

func (s *keepingStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	s.claims = append(s.claims, keptClaim{req.Principal, req.Key, req.RequestID})
	s.mu.Unlock()
	return s.Store.Claim(ctx, req)
}

func (s *keepingStore) BeginTx(ctx context.Context, lease idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, lease)
	return ctx, &keepingTx{Tx: tx, s: s, lease: lease}, err
}

type keepingTx struct {
	idemstore.Tx
	s     *keepingStore
	lease idemstore.Lease
}

func (tx *keepingTx) Settle(ctx context.Context, out idemstore.Outcome) error {
	h := make(http.Header, len(out.Response.Header))
	for k, vs := range out.Response.Header {
		h[k] = slices.Clone(vs)
	}
	tx.s.mu.Lock()
	tx.s.settled = append(tx.s.settled, keptSettle{tx.lease, h})
	tx.s.mu.Unlock()
	return tx.Tx.Settle(ctx, out)
}

// An Observer or a Logger may keep what it is given. Method, path and the
// rest of an Event must then be the request's own, for standard methods
// and for one the app adds.
func TestObservedEventsOwnTheirStrings(t *testing.T) {
	const n = 30
	var (
		mu   sync.Mutex
		got  []seen
		keep = func(s seen) { mu.Lock(); got = append(got, s); mu.Unlock() }
	)
	observer := func(c *idem.Config) {
		c.Observer = idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
			keep(seen{ev.Method, ev.Path, ev.Principal, ev.Key, ev.RequestID})
		})
	}
	// The log line carries the raw key only with LogKeys, and the path
	// without its query string: LogKeys keeps the key's
	// ownership under test through the logger.
	logger := func(c *idem.Config) { c.Logger, c.LogKeys = slog.New(&keepingHandler{keep: keep}), true }
	custom := fiber.Config{RequestMethods: append(slices.Clone(fiber.DefaultMethods), "PAYOUT", "REFUND")}
	for _, tc := range []struct {
		name    string
		methods []string // request i uses methods[i%len(methods)]
		app     fiber.Config
		observe func(*idem.Config)
	}{
		{"observer", []string{http.MethodPost, http.MethodPut}, fiber.Config{}, observer},
		{"observer, custom methods", []string{"PAYOUT", "REFUND"}, custom, observer},
		{"logger", []string{http.MethodPatch, http.MethodPost}, fiber.Config{}, logger},
		{"logger, custom methods", []string{"REFUND", "PAYOUT"}, custom, logger},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			f := newFixture(t, tc.app, tc.observe)
			for _, m := range tc.methods {
				f.app.Add(m, "/pay/:i", authenticate, f.mw, func(c *fiber.Ctx) error {
					return c.Status(http.StatusCreated).SendString("paid")
				})
			}
			base := f.start(t)
			num := func(i int) string { return strings.Repeat("9", i%5) + fmt.Sprint(i) }
			for i := range n {
				r := adaptertest.Send(t, tc.methods[i%len(tc.methods)], base+"/pay/"+num(i)+"?q="+num(i), "acct-"+num(i), "key-"+num(i), `{}`, "X-Request-Id", "req-"+num(i))
				adaptertest.WantStatus(t, num(i), r, http.StatusCreated)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != n {
				t.Fatalf("%d events for %d requests", len(got), n)
			}
			for i, s := range got {
				want := seen{tc.methods[i%len(tc.methods)], "/pay/" + num(i) + "?q=" + num(i), "acct-" + num(i), "key-" + num(i), "req-" + num(i)}
				if s.principal == "" { // not logged
					want.principal = ""
					want.path = "/pay/" + num(i) // logged without the query string
				}
				if s != want {
					t.Errorf("event %d: %q, want %q", i, s, want)
				}
			}
		})
	}
}

// keepingHandler is a slog.Handler that keeps the strings of each record
// it is given, as a handler writing asynchronously would.
type keepingHandler struct {
	keep func(seen)
}

// seen is what an Event or a log record said about a request.
type seen struct{ method, path, principal, key, requestID string }

func (*keepingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *keepingHandler) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h *keepingHandler) WithGroup(string) slog.Handler          { return h }

func (h *keepingHandler) Handle(_ context.Context, r slog.Record) error {
	var s seen
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "method":
			s.method = a.Value.String()
		case "path":
			s.path = a.Value.String()
		case "key":
			s.key = a.Value.String()
		case "request_id":
			s.requestID = a.Value.String()
		}
		return true
	})
	h.keep(s)
	return nil
}
