// Package idemfiber is the idem middleware for Fiber v2.
//
// Build the engine once with idem.New and hand it to the middleware, the
// idem.Sweeper and anything calling Engine.Do. Place the middleware after
// authentication, on the routes or groups that must be idempotent: it reads
// the principal through Config.Principal (typically what the auth
// middleware stored with c.Locals), and a request without one is refused
// with 401 before anything is claimed. A service's main, with PostgreSQL
// and Prometheus (Example runs the same on memstore):
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//
//		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer pool.Close()
//		store, err := idempgx.New(pool) // or idemgorm.New(db)
//		if err != nil {
//			log.Fatal(err)
//		}
//		// Migrate creates the table; when your migration tool applies the
//		// store's migration, call store.Check(ctx) instead.
//		if err := store.Migrate(ctx); err != nil {
//			log.Fatal(err)
//		}
//		// At least 32 random bytes (openssl rand -hex 32) from your secret
//		// store, the same on every instance.
//		key, err := hex.DecodeString(os.Getenv("IDEM_FINGERPRINT_KEY"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		metrics, err := idemprom.New(prometheus.DefaultRegisterer, idemprom.Options{})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// One engine for the process: every middleware and interceptor, the
//		// Sweeper and Engine.Do share it. New fails on an invalid Config or a
//		// store without its table.
//		eng, err := idem.New(idem.Config{Store: store, FingerprintKey: key, Observer: metrics})
//		if err != nil {
//			log.Fatal(err)
//		}
//		idempotent, err := idemfiber.New(idemfiber.Config{
//			Engine: eng,
//			Principal: func(c *fiber.Ctx) (string, error) {
//				account, _ := c.Locals("account").(string) // what requireAccount stored
//				return account, nil
//			},
//		})
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		// Only the sweeper deletes expired records and resolves the stale
//		// claims no client retries.
//		go (&idem.Sweeper{Engine: eng, Observer: metrics}).Run(ctx)
//
//		// StreamRequestBody: see the package documentation.
//		app := fiber.New(fiber.Config{StreamRequestBody: true, ReadTimeout: 10 * time.Second})
//		app.Use(recover.New()) // outermost: a panic releases the key, then reaches it
//		// After authentication: keys are claimed per principal, which
//		// requireAccount sets; before it, every request is answered 401.
//		api := app.Group("/", requireAccount, idempotent)
//		api.Post("/payments", createPayment)
//
//		go func() {
//			if err := app.Listen(":8080"); err != nil {
//				log.Fatal(err)
//			}
//		}()
//		<-ctx.Done()
//		// Running handlers get their RequestTimeout, then StoreTimeout to
//		// commit.
//		c := eng.Config()
//		if err := app.ShutdownWithTimeout(c.RequestTimeout + c.StoreTimeout); err != nil {
//			log.Print(err)
//		}
//	}
//
// Handlers reach the store's transaction through c.UserContext() with the
// store's accessor (idempgx.Tx, idemgorm.DB).
//
// fasthttp sends nothing until the handler chain returns, so there is no
// writer to swap: the middleware runs the rest of the chain, renders a
// returned error with the app's ErrorHandler (a mounted sub-app's, when the
// route belongs to one), and settles the outcome from c.Response(). When
// the engine keeps the handler's response, it goes out as the handler left
// it; otherwise the middleware puts back the response set further out and
// writes the engine's answer on it. Every string the engine may keep past
// the request (in the store, in an Event) is copied out of fasthttp's
// reused buffers, with or without Config.Immutable.
//
// Set fiber.Config.StreamRequestBody: without it fasthttp allocates each
// request's declared Content-Length (up to BodyLimit) before the body
// arrives, so slow clients that declare large bodies hold that memory until
// the read timeout (400 declaring 1 MiB: +407 MB in the example service,
// +28 MB streamed). Streamed, the middleware reads at most MaxBodyBytes of
// the body for the fingerprint and hands the handler what it read.
package idemfiber

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/valyala/fasthttp"
)

// Config configures the middleware: the engine it runs on and how to read
// the authenticated principal.
type Config struct {
	// Engine runs the idempotency state machine. Required. Build it once
	// with idem.New and share it across every middleware and interceptor,
	// the idem.Sweeper and Engine.Do: the per-route hold times behind
	// Retry-After and the MaxInFlightPerPrincipal limit are the engine's
	// own, so a second engine over the same store keeps a second set.
	Engine *idem.Engine
	// Principal returns the authenticated caller of the request, as the auth
	// middleware before this one left it (c.Locals, a JWT claim). An empty
	// result or an error answers 401 and claims nothing; the error goes into
	// the Event and is logged at Warn. The result is copied, so it may alias
	// Fiber's buffers. Required.
	Principal func(c *fiber.Ctx) (string, error)
}

// New returns the middleware running on cfg.Engine. It fails with an error
// wrapping idem.ErrInvalidConfig, naming the field, when Engine or
// Principal is nil.
//
// The handlers after it run with c.UserContext() carrying the attempt's
// context (the store's transaction and the request deadline, derived from
// the user context set further out) and the request body the fingerprint
// read. The error they return is the handler's error: it is rendered with
// the app's ErrorHandler inside the middleware, and by default such an
// outcome is released, not stored; the middleware then returns nil. A
// panic releases the key and goes on to the recover middleware.
func New(cfg Config) (fiber.Handler, error) {
	a, err := idemadapter.NewAdapter("idemfiber", cfg.Engine, cfg.Principal)
	if err != nil {
		return nil, err
	}
	ecfg := a.Config()
	m := &middleware{
		Adapter:  a,
		cfg:      ecfg,
		stored:   storedNames(ecfg.StoredHeaders),
		observed: ecfg.Observer != nil || ecfg.Logger != nil,
	}
	return m.handle, nil
}

// notStored lists the response headers fasthttp sets itself for every
// response it sends: they describe this connection and this encoding of
// the body, not the response, and are never stored, even when listed.
var notStored = []string{"Content-Length", "Connection", "Transfer-Encoding", "Date", "Server"}

// storedNames returns the canonical spellings of the names in list that a
// store may keep.
func storedNames(list []string) []string {
	var names []string
	for _, name := range list {
		if name = http.CanonicalHeaderKey(name); !slices.Contains(notStored, name) {
			names = append(names, name)
		}
	}
	return names
}

// middleware is one New's handler and what it prepared once.
type middleware struct {
	*idemadapter.Adapter[*fiber.Ctx]
	cfg    idem.Config // with defaults
	stored []string    // the names a store keeps (Config.StoredHeaders), canonical
	// observed is true when an Observer or a Logger receives the engine's
	// Events, which may outlive the request.
	observed bool
	// routes is the app's route table, for Request.Route (see route).
	routes atomic.Pointer[routeTable]
}

// handle is the middleware: it runs one request through the engine.
func (m *middleware) handle(c *fiber.Ctx) error {
	req, br := m.request(c)
	att, resp := m.Begin(c.UserContext(), req)
	streamed := br == nil
	if !streamed {
		// Begin has read the body into its own buffer and keeps no
		// reference to the reader.
		br.Reset(nil)
		bodyReaders.Put(br)
	}
	if att == nil {
		if resp == nil {
			return c.Next()
		}
		if streamed {
			// The streamed body may be left unread on the connection,
			// where fasthttp would parse it as the next request.
			c.Response().Header.SetConnectionClose()
		}
		write(c, resp)
		return nil
	}
	defer att.Abort()

	earlier := save(c.Response()) // set further out: CORS, request ids
	defer earlier.release()
	userCtx := c.UserContext()
	c.SetUserContext(att.Context())
	defer c.SetUserContext(userCtx)
	c.Request().SetBody(att.Body()) // a streamed body is spent by now
	// A panic skips everything below: drop what the handler wrote, so
	// the recover middleware's error response carries none of it (a
	// Location, a cookie), as with a discarded buffer on net/http.
	settled := false
	defer func() {
		if !settled {
			earlier.restore(c.Response())
		}
	}()

	herr := c.Next()
	if herr != nil {
		// Render the error now, as the app would after the chain, so
		// the response the client gets is the one classified.
		c.Response().ResetBody()
		c.Status(fiber.StatusOK)
		if catch := c.App().ErrorHandler(c, herr); catch != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	res, stored, inPlace := m.result(c, herr)
	final := att.Finish(res)
	settled = true
	stored.release()

	if final.Status == res.Status && sameBytes(final.Body, res.Body) {
		// The handler's own response: it is in c.Response() as the
		// handler left it, but for a streamed body, read in the result.
		if !inPlace {
			c.Response().SetBody(res.Body)
		}
		return nil
	}
	// A problem in its place, on top of the response set further out.
	earlier.restore(c.Response())
	write(c, final)
	return nil
}

// bodyReaders recycles the readers that hand Begin a body in memory: one
// allocation per request fewer (BenchmarkMiddleware, every path).
var bodyReaders = sync.Pool{New: func() any { return new(bytes.Reader) }}

// request is the engine's view of c, and the pooled reader over its body
// for the caller to put back after Begin (nil when the body is a stream).
//
// Strings the engine keeps past the request are copied out of Fiber's
// buffers, which fasthttp reuses for the next request on the connection:
// the principal, the key and the request id go to the store's Claim, which
// may keep them for the record's lifetime (copied together, in one
// allocation: they live as long as each other), principal and key into the
// attempt's Lease, and all of them, method and path too, into the Events
// an Observer or a Logger receives and may keep. The rest is read by Begin
// alone, while the middleware waits for it and nothing touches c, so it may
// point into Fiber's buffers: the content type, and the method and path
// when no one receives Events, only enter the fingerprint.
func (m *middleware) request(c *fiber.Ctx) (idem.Request, *bytes.Reader) {
	principal, perr := m.Principal(c)
	// Every field line of the key header, not the first alone that c.Get
	// reads: several are refused as ambiguous, and one present but empty
	// is refused as blank, never run without idempotency (idemadapter.KeyField).
	var one [1]string
	lines := one[:0]
	for _, v := range c.Request().Header.PeekAll(m.cfg.Header) {
		lines = append(lines, utils.UnsafeString(v)) // copied into kept below
	}
	key, id := idemadapter.KeyField(lines), c.Get(m.cfg.RequestIDHeader)
	var kept strings.Builder
	kept.Grow(len(principal) + len(key) + len(id))
	kept.WriteString(principal)
	kept.WriteString(key)
	kept.WriteString(id)
	s := kept.String()
	principal, key, id = s[:len(principal)], s[len(principal):len(principal)+len(key)], s[len(principal)+len(key):]

	method, path := c.Method(), c.OriginalURL()
	if m.observed {
		method, path = ownMethod(method), strings.Clone(path)
	}

	var (
		body   io.Reader
		length int64
		br     *bytes.Reader
	)
	if r := c.Request(); r.IsBodyStream() {
		body = r.BodyStream()                             // Begin reads it up to MaxBodyBytes
		length = max(int64(r.Header.ContentLength()), -1) // -1 chunked, -2 none: unknown
	} else {
		b := r.Body()
		br = bodyReaders.Get().(*bytes.Reader)
		br.Reset(b)
		body, length = br, int64(len(b))
	}
	return idem.Request{
		Method:        method,
		Path:          path,
		Route:         m.route(c),
		Principal:     principal,
		PrincipalErr:  perr,
		Key:           key,
		ContentType:   c.Get(fiber.HeaderContentType),
		RequestID:     id,
		Body:          body,
		ContentLength: length,
	}, br
}

// route returns the template of the route c is routed to ("/payments/:id"),
// or "" when none matches. c.Route() cannot say: in app.Use or a group's
// middleware it is the middleware's own mount ("/", "/payments"), because
// Fiber routes one step at a time, in c.Next(). So the route is the first
// one of c's method, middleware mounts left out, whose pattern matches c's
// path: the one c.Next() runs, unless a handler before it rewrites the path
// or passes the request on with c.Next(). Route paths belong to the app,
// never to fasthttp's buffers, so they need no copy.
func (m *middleware) route(c *fiber.Ctx) string {
	app := c.App()
	rt := m.routes.Load()
	if rt == nil || rt.app != app || rt.handlers != app.HandlersCount() {
		rt = newRouteTable(app)
		m.routes.Store(rt)
	}
	k := routeKey{c.Method(), c.Path()}
	rt.mu.RLock()
	pattern, ok := rt.seen[k]
	rt.mu.RUnlock()
	if ok {
		return pattern
	}
	for _, p := range rt.byMethod[k.method] {
		if fiber.RoutePatternMatch(k.path, p, rt.cfg) {
			pattern = p
			break
		}
	}
	// The keys point into fasthttp's buffers: copy them to keep them.
	k = routeKey{strings.Clone(k.method), strings.Clone(k.path)}
	rt.mu.Lock()
	if len(rt.seen) >= maxSeenPaths {
		clear(rt.seen)
	}
	rt.seen[k] = pattern
	rt.mu.Unlock()
	return pattern
}

// maxSeenPaths bounds the paths a routeTable remembers the route of. A
// matching costs a few allocations (fiber.RoutePatternMatch parses the
// pattern every time), a remembered path none; retries of one request, and
// routes without parameters, hit it. Full, it starts over.
const maxSeenPaths = 1024

type routeKey struct{ method, path string }

// routeTable is an app's routes by method, middleware mounts left out, in
// the order Fiber tries them, and the route of the paths seen lately. It is
// rebuilt when a route is added (the app's handler count changes) or the
// middleware serves another app.
type routeTable struct {
	app      *fiber.App
	handlers uint32
	cfg      fiber.Config
	byMethod map[string][]string

	mu   sync.RWMutex
	seen map[routeKey]string
}

func newRouteTable(app *fiber.App) *routeTable {
	rt := &routeTable{app: app, handlers: app.HandlersCount(), cfg: app.Config(),
		byMethod: make(map[string][]string), seen: make(map[routeKey]string)}
	for _, r := range app.GetRoutes(true) {
		rt.byMethod[r.Method] = append(rt.byMethod[r.Method], r.Path)
	}
	return rt
}

// ownMethod returns method in memory of its own: Fiber's constant for one
// of the standard methods, which needs no copy, a copy otherwise.
func ownMethod(method string) string {
	if i := slices.Index(fiber.DefaultMethods, method); i >= 0 {
		return fiber.DefaultMethods[i]
	}
	return strings.Clone(method)
}

// earlierSkip lists the headers not restored from before the handler ran:
// fasthttp sets them again for the final body.
var earlierSkip = []string{"Content-Length", "Connection", "Transfer-Encoding", "Date"}

// snapshot is a response as it was before the handler ran: the headers set
// further out (CORS, request ids, the app's Server header) and fasthttp's
// per-response settings that Response.Reset would lose (no default
// Content-Type or Date, header names left as written).
type snapshot struct {
	header                               fasthttp.ResponseHeader
	skipBody, streamBody, immediateFlush bool
}

// snapshots recycles snapshots: a fasthttp.ResponseHeader made anew costs
// three allocations per first request.
var snapshots = sync.Pool{New: func() any { return new(snapshot) }}

// save returns a snapshot of resp, from the pool; release puts it back.
func save(resp *fasthttp.Response) *snapshot {
	s := snapshots.Get().(*snapshot)
	resp.Header.CopyTo(&s.header)
	s.skipBody, s.streamBody, s.immediateFlush = resp.SkipBody, resp.StreamBody, resp.ImmediateHeaderFlush
	return s
}

// restore empties resp back to the snapshot, but for the headers in
// earlierSkip. They are dropped here rather than in save: most responses
// keep the handler's and are never restored.
func (s *snapshot) restore(resp *fasthttp.Response) {
	resp.ResetBody()
	s.header.CopyTo(&resp.Header)
	for _, k := range earlierSkip {
		resp.Header.Del(k)
	}
	resp.SkipBody, resp.StreamBody, resp.ImmediateHeaderFlush = s.skipBody, s.streamBody, s.immediateFlush
}

func (s *snapshot) release() { snapshots.Put(s) }

// result is the handler's response in c as the engine needs it, and the
// storage of its header for the caller to release after Finish.
//
// The header holds the allow-listed names only: they are all the engine
// stores, and the rest of the response stays in c.Response(), which goes
// out as it is when Finish keeps the handler's response. When inPlace is
// true the body is the response's own, not a copy: the engine hands it to
// the store's Settle, which must not keep it (see idemstore.Tx), and nothing
// writes to the response until Finish returns. A streamed body is read up
// to MaxResponseBytes+1 bytes: past that the response is too large to
// store.
func (m *middleware) result(c *fiber.Ctx, herr error) (res idem.Result, stored *storedHeader, inPlace bool) {
	resp := c.Response()
	res = idem.Result{Status: resp.StatusCode(), Err: herr}
	if resp.IsBodyStream() {
		limit := m.cfg.MaxResponseBytes
		b, err := io.ReadAll(io.LimitReader(resp.BodyStream(), int64(limit)+1))
		_ = resp.CloseBodyStream()
		if err != nil && herr == nil {
			res.Err = fmt.Errorf("idemfiber: read response body stream: %w", err)
		}
		res.Body, res.Overflow, res.Streamed = b, len(b) > limit, true
	} else {
		res.Body, inPlace = resp.Body(), true
	}
	stored = m.storedHeader(&resp.Header)
	res.Header = stored.h
	return res, stored, inPlace
}

// sameBytes reports whether a and b are the same bytes in memory.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// storedHeader is the part of a response header a store keeps: the values
// of the allow-listed names, copied out of fasthttp's buffers into one
// string (a store may keep them as long as the record), in a map whose
// value slices share one array. The map, the array and the scratch space
// the values are gathered in are reused from request to request: the
// engine hands the map to Settle, which must not keep it (see
// idemstore.Tx).
type storedHeader struct {
	h    http.Header
	vals []string
	// raw holds the values back to back while the header is read, and
	// fields their names and where each ends in raw.
	raw    []byte
	fields []storedField
}

type storedField struct {
	name string
	end  int
}

// storedHeaders recycles storedHeaders: a map and value slices made anew
// cost four allocations per first request with two stored headers.
var storedHeaders = sync.Pool{New: func() any { return &storedHeader{h: make(http.Header)} }}

// storedHeader copies the allow-listed values of src into a storedHeader
// from the pool, in one pass over src.
func (m *middleware) storedHeader(src *fasthttp.ResponseHeader) *storedHeader {
	sh := storedHeaders.Get().(*storedHeader)
	src.VisitAll(func(k, v []byte) {
		if name := m.storedName(k); name != "" {
			sh.raw = append(sh.raw, v...)
			sh.fields = append(sh.fields, storedField{name, len(sh.raw)})
		}
	})
	if n := len(sh.fields); cap(sh.vals) < n {
		sh.vals = make([]string, 0, n)
	}
	all, start := string(sh.raw), 0
	for _, f := range sh.fields {
		sh.add(f.name, all[start:f.end])
		start = f.end
	}
	return sh
}

// storedName returns the canonical spelling of the header name k when a
// store keeps it, "" otherwise. The comparison ignores case: with
// DisableHeaderNormalizing, names stay as the handler wrote them.
func (m *middleware) storedName(k []byte) string {
	for _, name := range m.stored {
		if len(name) == len(k) && strings.EqualFold(name, string(k)) {
			return name
		}
	}
	return ""
}

// add appends v to name's values: in place in the shared array when the
// name's values so far end right before it (one value, or a run), in a
// slice of its own otherwise. Every slice in the map is capped at its
// length, so appending to one never overwrites another's.
func (sh *storedHeader) add(name, v string) {
	i := len(sh.vals)
	sh.vals = append(sh.vals, v)
	vs := sh.h[name]
	switch j := i - len(vs); {
	case len(vs) == 0:
		sh.h[name] = sh.vals[i : i+1 : i+1]
	case j >= 0 && &sh.vals[j] == &vs[0]:
		sh.h[name] = sh.vals[j : i+1 : i+1]
	default:
		sh.h[name] = append(vs, v)
	}
}

// maxPooledValues and maxPooledRaw bound the values and bytes a pooled
// storedHeader is sized for: a response with unusually many must not leave
// a large array in the pool.
const (
	maxPooledValues = 64
	maxPooledRaw    = 16 << 10
)

// release empties sh and puts it back in the pool.
func (sh *storedHeader) release() {
	if cap(sh.vals) > maxPooledValues || cap(sh.raw) > maxPooledRaw {
		return
	}
	clear(sh.h)
	clear(sh.vals) // no reference to this request's values stays behind
	sh.vals = sh.vals[:0]
	sh.raw, sh.fields = sh.raw[:0], sh.fields[:0]
	storedHeaders.Put(sh)
}

// write puts resp into c's response: its headers (replacing those of the
// same name), status and body. fasthttp writes header values raw, so a
// field that is not valid HTTP (a stored value with a CR LF, from a record
// stored before Finish checked them) is left out: it would split the
// response.
func write(c *fiber.Ctx, resp *idem.Response) {
	h := &c.Response().Header
	for k, vs := range resp.Header {
		if !idemadapter.ValidHeaderField(k, vs) {
			continue
		}
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	c.Status(resp.Status)
	c.Response().SetBody(resp.Body)
}
