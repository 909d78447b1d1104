// Package idemfiber is the idem middleware for Fiber v2.
//
// Place it after authentication, on the routes or groups that must be
// idempotent: it reads the principal through Config.Principal (typically
// what the auth middleware stored with c.Locals), and a request without one
// is refused with 401 before anything is claimed.
//
//	mw, err := idemfiber.New(idemfiber.Config{
//		Config: idem.Config{Store: store},
//		Principal: func(c *fiber.Ctx) (string, error) {
//			account, _ := c.Locals("account").(string)
//			return account, nil
//		},
//	})
//	app.Post("/payments", authenticate, mw, createPayment)
//
// Handlers reach the store's transaction through c.UserContext() with the
// store's accessor (idempgx.Tx, idemgorm.DB).
//
// fasthttp sends nothing until the handler chain returns, so the middleware
// runs the rest of the chain, renders a returned error with the app's
// ErrorHandler (a mounted sub-app's, when the route belongs to one), settles
// the outcome from c.Response(), and then puts back the response set further
// out and writes on it exactly what the engine returned. Every string the
// engine may keep past the request (in the store, in an Event) is copied out
// of fasthttp's reused buffers, with or without Config.Immutable.
package idemfiber

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"
	idem "github.com/idemgo/idem/core"
	"github.com/valyala/fasthttp"
)

// Config configures the middleware: the engine's Config plus how to read the
// authenticated principal.
type Config struct {
	idem.Config
	// Principal returns the authenticated caller of the request, as the auth
	// middleware before this one left it (c.Locals, a JWT claim). An empty
	// result or an error answers 401 and claims nothing; the error goes into
	// the Event and is logged at Warn. The result is copied, so it may alias
	// Fiber's buffers. Required.
	Principal func(c *fiber.Ctx) (string, error)
}

// New validates cfg and returns the middleware.
//
// The handlers after it run with c.UserContext() carrying the attempt's
// context (the store's transaction and the request deadline, derived from
// the user context set further out) and the request body the fingerprint
// read. The error they return is the handler's error: it is rendered with
// the app's ErrorHandler inside the middleware, and by default such an
// outcome is released, not stored; the middleware then returns nil. A
// panic releases the key and goes on to the recover middleware.
func New(cfg Config) (fiber.Handler, error) {
	a, err := idem.NewAdapter("idemfiber", cfg.Config, cfg.Principal)
	if err != nil {
		return nil, err
	}
	ecfg := a.Config()
	m := &middleware{
		eng:      a,
		cfg:      ecfg,
		names:    headerNames(ecfg),
		observed: ecfg.Observer != nil || ecfg.Logger != nil,
	}
	return m.handle, nil
}

// middleware is one New's handler and what it prepared once.
type middleware struct {
	eng   *idem.Adapter[*fiber.Ctx]
	cfg   idem.Config           // with defaults
	names map[string]headerName // response header names, see headerNames
	// observed is true when an Observer or a Logger receives the engine's
	// Events, which may outlive the request.
	observed bool
}

// handle is the middleware: it runs one request through the engine.
func (m *middleware) handle(c *fiber.Ctx) error {
	principal, perr := m.eng.Principal(c)
	req, br := m.request(c, principal)
	req.PrincipalErr = perr
	streamed := br == nil
	att, resp := m.eng.Begin(c.UserContext(), req)
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
		write(c, resp, true)
		return nil
	}
	defer att.Abort()

	userCtx := c.UserContext()
	earlier := save(c.Response()) // set further out: CORS, request ids
	defer earlier.release()
	c.SetUserContext(att.Context())
	defer c.SetUserContext(userCtx)
	if streamed {
		// The stream is spent: hand the handler the bytes Begin read. A
		// body in memory is still there, unchanged, for the handler.
		c.Request().SetBody(att.Body())
	}

	// A panic skips everything below: drop what the handler wrote, so
	// the recover middleware's error response carries none of it (a
	// Location, a cookie), as with a discarded buffer on net/http.
	settled := false
	defer func() {
		if !settled {
			earlier.restore(c.Response(), false)
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
	res, header, inPlace := m.result(c, herr)
	final := att.Finish(res)
	settled = true

	// Send exactly what the engine decided: the handler's response, or
	// a problem in its place, on top of the response set further out.
	// When that is the handler's body, it is still in the response and
	// stays there.
	keepBody := inPlace && sameBytes(final.Body, res.Body)
	earlier.restore(c.Response(), keepBody)
	write(c, final, !keepBody)
	header.release()
	return nil
}

// bodyReaders recycles the readers that hand Begin a body in memory.
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
func (m *middleware) request(c *fiber.Ctx, principal string) (idem.Request, *bytes.Reader) {
	key, id := c.Get(m.cfg.Header), c.Get(m.cfg.RequestIDHeader)
	var kept strings.Builder
	kept.Grow(len(principal) + len(key) + len(id))
	kept.WriteString(principal)
	kept.WriteString(key)
	kept.WriteString(id)
	s := kept.String()
	principal, key, id = s[:len(principal)], s[len(principal):len(principal)+len(key)], s[len(principal)+len(key):]

	method, standard := standardMethod(c.Method())
	path := c.OriginalURL()
	if m.observed {
		if !standard {
			method = strings.Clone(method)
		}
		path = strings.Clone(path)
	}

	var (
		body   io.Reader
		length int64
		br     *bytes.Reader
	)
	if req := c.Request(); req.IsBodyStream() {
		body = req.BodyStream()                             // Begin reads it up to MaxBodyBytes
		length = max(int64(req.Header.ContentLength()), -1) // -1 chunked, -2 none: unknown
	} else {
		b := req.Body()
		br = bodyReaders.Get().(*bytes.Reader)
		br.Reset(b)
		body, length = br, int64(len(b))
	}
	return idem.Request{
		Method:        method,
		Path:          path,
		Principal:     principal,
		Key:           key,
		ContentType:   c.Get(fiber.HeaderContentType),
		RequestID:     id,
		Body:          body,
		ContentLength: length,
	}, br
}

// standardMethod returns the constant spelling of one of the methods of
// RFC 9110 and PATCH, which needs no copy, and whether method was one.
func standardMethod(method string) (string, bool) {
	switch method {
	case fiber.MethodGet:
		return fiber.MethodGet, true
	case fiber.MethodHead:
		return fiber.MethodHead, true
	case fiber.MethodPost:
		return fiber.MethodPost, true
	case fiber.MethodPut:
		return fiber.MethodPut, true
	case fiber.MethodPatch:
		return fiber.MethodPatch, true
	case fiber.MethodDelete:
		return fiber.MethodDelete, true
	case fiber.MethodConnect:
		return fiber.MethodConnect, true
	case fiber.MethodOptions:
		return fiber.MethodOptions, true
	case fiber.MethodTrace:
		return fiber.MethodTrace, true
	}
	return method, false
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

var snapshots = sync.Pool{New: func() any { return new(snapshot) }}

// save returns a snapshot of resp, from the pool; release puts it back.
func save(resp *fasthttp.Response) *snapshot {
	s := snapshots.Get().(*snapshot)
	resp.Header.CopyTo(&s.header)
	for _, k := range earlierSkip {
		s.header.Del(k)
	}
	s.skipBody, s.streamBody, s.immediateFlush = resp.SkipBody, resp.StreamBody, resp.ImmediateHeaderFlush
	return s
}

// restore empties resp back to the snapshot, keeping resp's body if
// keepBody is true.
func (s *snapshot) restore(resp *fasthttp.Response, keepBody bool) {
	if !keepBody {
		resp.ResetBody()
	}
	s.header.CopyTo(&resp.Header)
	resp.SkipBody, resp.StreamBody, resp.ImmediateHeaderFlush = s.skipBody, s.streamBody, s.immediateFlush
}

func (s *snapshot) release() { snapshots.Put(s) }

// result is the handler's response in c, and the storage of its header map
// for the caller to release once it has written the final response. When
// inPlace is true the result's body is the response's own, not a copy: the
// engine hands it to the store's Settle, which must not keep it (see
// idem.Tx), and nothing writes to the response until Finish returns. A
// streamed body is read up to limit+1 bytes: past the limit the response is
// too large to store.
func (m *middleware) result(c *fiber.Ctx, herr error) (res idem.Result, header *resultHeader, inPlace bool) {
	resp := c.Response()
	var body []byte
	overflow := false
	if resp.IsBodyStream() {
		limit := m.cfg.MaxResponseBytes
		b, err := io.ReadAll(io.LimitReader(resp.BodyStream(), int64(limit)+1))
		_ = resp.CloseBodyStream()
		if err != nil && herr == nil {
			herr = fmt.Errorf("idemfiber: read response body stream: %w", err)
		}
		body, overflow = b, len(b) > limit
	} else {
		body, inPlace = resp.Body(), true
	}
	header = m.header(&resp.Header)
	return idem.Result{
		Status:   resp.StatusCode(),
		Header:   header.h,
		Body:     body,
		Err:      herr,
		Overflow: overflow,
	}, header, inPlace
}

// sameBytes reports whether a and b are the same bytes in memory.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// headerName is a response header name the middleware knows: its
// canonical spelling, allocated once, and what the result does with it.
type headerName struct {
	name   string
	stored bool // in Config.StoredHeaders: the store keeps its values
	skip   bool // in resultSkip: never part of the result
}

// resultSkip lists the response headers fasthttp manages itself: they
// describe this connection and this encoding of the body, not the
// response, and are never part of the handler's result.
var resultSkip = []string{"Content-Length", "Server", "Connection", "Transfer-Encoding", "Date"}

// commonHeaders are response headers whose names are worth not allocating
// on every request.
var commonHeaders = []string{
	"Accept-Ranges", "Access-Control-Allow-Credentials", "Access-Control-Allow-Headers",
	"Access-Control-Allow-Methods", "Access-Control-Allow-Origin", "Access-Control-Expose-Headers",
	"Access-Control-Max-Age", "Age", "Allow", "Cache-Control", "Content-Disposition",
	"Content-Encoding", "Content-Language", "Content-Location", "Content-Range",
	"Content-Security-Policy", "Content-Type", "ETag", "Expires", "Last-Modified", "Link",
	"Location", "Pragma", "Referrer-Policy", "Retry-After", "Set-Cookie",
	"Strict-Transport-Security", "Trailer", "Vary", "WWW-Authenticate",
	"X-Content-Type-Options", "X-Frame-Options", idem.ReplayedHeader,
}

// headerNames returns the names the result recognises without allocating:
// the common ones, resultSkip, and cfg's stored headers and request id
// header, each by its canonical spelling, which is how fasthttp normalises
// names by default.
func headerNames(cfg idem.Config) map[string]headerName {
	names := make(map[string]headerName)
	get := func(name string) headerName {
		name = http.CanonicalHeaderKey(name)
		hn := names[name]
		hn.name = name
		return hn
	}
	for _, n := range append(slices.Clip(commonHeaders), cfg.RequestIDHeader) {
		hn := get(n)
		names[hn.name] = hn
	}
	for _, n := range resultSkip {
		hn := get(n)
		hn.skip = true
		names[hn.name] = hn
	}
	for _, n := range cfg.StoredHeaders {
		hn := get(n)
		hn.stored = true
		names[hn.name] = hn
	}
	return names
}

// resultHeader is the header of one result: an http.Header whose value
// slices share one backing array. The map and the array are reused from
// request to request: the engine gives the map to the store's Settle, which
// must not keep it (see idem.Tx), and the middleware is done with it once
// the final response is written. The values are new strings every time,
// since a store keeps those.
type resultHeader struct {
	h    http.Header
	vals []string
}

var resultHeaders = sync.Pool{New: func() any { return &resultHeader{h: make(http.Header)} }}

// header copies src into a resultHeader from the pool, leaving out
// resultSkip. Set-Cookie is kept: it is sent with the first response (and,
// unless the user lists it in StoredHeaders, never stored or replayed).
//
// A first pass sizes the copy, a second makes it: names the middleware
// knows are not copied, and the values are copied into two strings, one
// for the stored headers, which a store may keep as long as the record,
// and one for the rest (Set-Cookie, CORS), which only the final response
// needs.
func (m *middleware) header(src *fasthttp.ResponseHeader) *resultHeader {
	n, stored, other := 0, 0, 0
	src.VisitAll(func(k, v []byte) {
		hn, ok := m.names[string(k)]
		switch {
		case !ok:
			other += len(k) + len(v)
		case hn.skip:
			return
		case hn.stored:
			stored += len(v)
		default:
			other += len(v)
		}
		n++
	})
	rh := resultHeaders.Get().(*resultHeader)
	if cap(rh.vals) < n {
		rh.vals = make([]string, 0, n)
	}
	var keep, rest strings.Builder
	keep.Grow(stored)
	rest.Grow(other)
	src.VisitAll(func(k, v []byte) {
		hn, ok := m.names[string(k)]
		if !ok {
			// Unknown, or a spelling fasthttp did not normalise
			// (DisableHeaderNormalizing).
			name := http.CanonicalHeaderKey(appendString(&rest, k))
			if hn, ok = m.names[name]; !ok {
				hn = headerName{name: name}
			}
		}
		if hn.skip {
			return
		}
		b := &rest
		if hn.stored {
			b = &keep
		}
		rh.add(hn.name, appendString(b, v))
	})
	return rh
}

// appendString appends p to b and returns it as a string. Grown in
// advance, b does not move, so the strings of one header share its memory;
// should it grow, the strings returned before stay valid all the same (a
// Builder never changes bytes it has written).
func appendString(b *strings.Builder, p []byte) string {
	start := b.Len()
	b.Write(p)
	return b.String()[start:]
}

// add appends v to name's values: in place in the shared array when the
// name's values so far end right before it (one value, or a run such as
// fasthttp's cookies), in a slice of its own otherwise. Every slice in the
// map is capped at its length, so appending to one never overwrites
// another's.
func (rh *resultHeader) add(name, v string) {
	i := len(rh.vals)
	rh.vals = append(rh.vals, v)
	vs := rh.h[name]
	switch j := i - len(vs); {
	case len(vs) == 0:
		rh.h[name] = rh.vals[i : i+1 : i+1]
	case j >= 0 && &rh.vals[j] == &vs[0]:
		rh.h[name] = rh.vals[j : i+1 : i+1]
	default:
		rh.h[name] = append(vs, v)
	}
}

// maxPooledValues bounds the header values a pooled resultHeader is sized
// for: one response with unusually many headers must not leave every later
// request ranging over a map that large.
const maxPooledValues = 64

// release empties rh and puts it back in the pool.
func (rh *resultHeader) release() {
	if cap(rh.vals) > maxPooledValues {
		return
	}
	clear(rh.h)
	clear(rh.vals) // no reference to this request's values stays behind
	rh.vals = rh.vals[:0]
	resultHeaders.Put(rh)
}

// write puts resp into c's response: its headers (replacing those of the
// same name), status and, if setBody is true, body.
func write(c *fiber.Ctx, resp *idem.Response, setBody bool) {
	h := &c.Response().Header
	for k, vs := range resp.Header {
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	c.Status(resp.Status)
	if setBody {
		c.Response().SetBody(resp.Body)
	}
}
