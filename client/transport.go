package idemclient

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Transport is an http.RoundTripper that makes a request with one of the
// configured methods safe to retry: it gives the request an idempotency
// key, once, and retries it with that same key while the answer says that
// retrying can help and the budget allows. Requests with other methods go
// to Config.Base unchanged.
//
// For one request (one call of RoundTrip, so one http.Client.Do):
//
//   - The key is the request's own key header when it has one, else the
//     key of the request it is a redirect of (http.Client following a
//     3xx), else the key WithKey put in its context, else a fresh
//     Config.NewKey(), chosen before the first attempt. Every attempt
//     sends that key; no answer of the server, and no error, makes it send
//     another (FuzzNoSecondKey), and a redirect keeps it.
//   - An attempt is retried after a transport error, and after the answers
//     classifyResponse lists (409 in progress, 429, 500 unless the problem
//     type says retrying cannot help, 502, 503, 504), never after 422 or
//     another 4xx, and never after a replay (Idempotent-Replayed: true).
//   - A problem of a type ending in "outcome-unknown" is never retried: it
//     ends the request with an *Error wrapping ErrOutcomeUnknown, and its
//     body is closed.
//   - The wait before a retry is the answer's Retry-After (seconds or an
//     HTTP date), at most Config.MaxRetryAfter; without one it is drawn
//     from [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)] before the n-th retry (full
//     jitter).
//   - No retry is made after Config.MaxAttempts attempts, or when its wait
//     would end past Config.MaxElapsed from the start or at or past the
//     context's deadline: then the last answer is returned as it came (its
//     body unread), or the last error. A context that ends during a wait
//     ends the request with its error.
//   - A body that cannot be produced again (no GetBody, and larger than
//     Config.MaxBufferedBody) is sent once and never retried.
//   - The answer returned is read to its end first when its Content-Length
//     is at most Config.MaxBufferedResponse, so that a connection cut in
//     the middle of a committed answer is retried (and replayed) rather
//     than failing the caller's read.
//
// Info tells the caller the key, the attempts and whether the answer was a
// replay; an error is an *Error carrying the key and the attempts (its
// message names the key by a hash only). A Transport is safe for
// concurrent use.
type Transport struct {
	cfg    Config
	header string // cfg.Header, canonical
}

// New returns a Transport for cfg, or an error wrapping ErrInvalidConfig
// that names every field it refuses.
func New(cfg Config) (*Transport, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Transport{cfg: cfg, header: http.CanonicalHeaderKey(cfg.Header)}, nil
}

// RoundTrip sends req, retrying as the Transport's comment says. It does
// not modify req; every attempt is a shallow copy of it with the key header
// added and a fresh copy of the body.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !slices.Contains(t.cfg.Methods, req.Method) {
		return t.cfg.Base.RoundTrip(req)
	}
	ctx := &infoCtx{Context: req.Context()}
	key, header, err := t.key(req, ctx)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, &Error{Err: err}
	}
	b, err := prepareBody(req, t.cfg.MaxBufferedBody)
	if err != nil {
		return nil, &Error{Key: key, Err: err}
	}
	ctx.result.Key = key
	start := t.cfg.Now()
	for attempt := 1; ; attempt++ {
		r := req.WithContext(ctx)
		r.Header, r.ContentLength, r.GetBody = header, b.contentLength, b.getBody
		r.Body = b.first
		if attempt > 1 && b.getBody != nil {
			if r.Body, err = b.getBody(); err != nil {
				return nil, &Error{Key: key, Attempts: attempt - 1, Err: fmt.Errorf("idemclient: GetBody: %w", err)}
			}
		}
		resp, err := t.cfg.Base.RoundTrip(r)
		ctx.result.Attempts = attempt
		var retry bool
		if err == nil {
			var final error
			if retry, final = classifyResponse(resp); final != nil {
				discard(resp)
				return nil, &Error{Key: key, Attempts: attempt, Err: final}
			}
			if !retry {
				if err = t.readBody(resp, &ctx.body); err != nil {
					resp = nil
				}
			}
		}
		if err != nil {
			retry = ctx.Err() == nil && retryableError(err)
		}
		var wait time.Duration
		if retry {
			retry, wait = t.budget(ctx, resp, attempt, start, b.replayable)
		}
		if !retry {
			if err != nil {
				return nil, &Error{Key: key, Attempts: attempt, Err: err}
			}
			ctx.result.Replayed = isReplayed(resp)
			resp.Request = r // Info finds the result through its context
			return resp, nil
		}
		if resp != nil {
			discard(resp)
		}
		if err := t.cfg.Sleep(ctx, wait); err != nil {
			return nil, &Error{Key: key, Attempts: attempt, Err: err}
		}
	}
}

// budget decides whether a retry the answer asks for is made, and after
// which wait: not after MaxAttempts attempts, not with a body that cannot
// be sent again, not when the wait would end past MaxElapsed from start or
// at or past the context's deadline.
func (t *Transport) budget(ctx *infoCtx, resp *http.Response, attempt int, start time.Time, replayable bool) (bool, time.Duration) {
	if attempt >= t.cfg.MaxAttempts || !replayable {
		return false, 0
	}
	now := t.cfg.Now()
	var wait time.Duration
	if ra, ok := retryAfter(resp, now); ok {
		wait = min(ra, t.cfg.MaxRetryAfter)
	} else {
		wait = t.backoff(attempt)
	}
	end := now.Add(wait)
	if end.After(start.Add(t.cfg.MaxElapsed)) {
		return false, 0
	}
	if dl, ok := ctx.Deadline(); ok && !end.Before(dl) {
		return false, 0
	}
	return true, wait
}

func retryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	return parseRetryAfter(resp.Header.Get("Retry-After"), now)
}

// backoff returns the wait before retry number n (the n+1-th attempt):
// full jitter under min(MaxDelay, BaseDelay·2ⁿ⁻¹).
func (t *Transport) backoff(n int) time.Duration {
	ceiling := t.cfg.BaseDelay
	for i := 1; i < n && ceiling < t.cfg.MaxDelay; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, t.cfg.MaxDelay)
	return min(max(t.cfg.Jitter(ceiling), 0), ceiling)
}

// key returns the request's key and the header to send it in: the
// request's own when it carries the key header, else a copy with a key
// added (its value kept in st): the key of the request that a redirect
// which http.Client follows came from, else the key from the context, else
// a new one.
func (t *Transport) key(req *http.Request, st *infoCtx) (string, http.Header, error) {
	if k := t.headerKey(req.Header); k != "" {
		return k, req.Header, nil
	}
	k := t.redirectKey(req)
	if k == "" {
		k = keyFrom(req.Context())
	}
	if k == "" {
		if k = t.cfg.NewKey(); !validKey(k) {
			return "", nil, fmt.Errorf("idemclient: Config.NewKey returned %d bytes, not 1 to %d visible ASCII characters", len(k), MaxKeyLength)
		}
	}
	h := make(http.Header, len(req.Header)+1)
	for name, v := range req.Header {
		h[name] = v // values are not modified: sharing the slices is safe
	}
	st.keyValue[0] = k
	h[t.header] = st.keyValue[:]
	return k, h, nil
}

// headerKey returns the key h carries, or "".
func (t *Transport) headerKey(h http.Header) string {
	if k := h.Get(t.header); k != "" {
		return k
	}
	for name, v := range h { // a name set without canonicalising it
		if len(v) > 0 && v[0] != "" && strings.EqualFold(name, t.header) {
			return v[0]
		}
	}
	return ""
}

// redirectKey returns the key of the request that req is a redirect of,
// or "": when http.Client follows a 3xx, req.Response is that answer and
// its Request the hop before, as RoundTrip returned it, key header and
// all. A redirect is the same operation sent to another URL, but
// http.Client builds it from the caller's request, without the header
// RoundTrip added: without this the key would be minted again for every
// hop.
func (t *Transport) redirectKey(req *http.Request) string {
	if req.Response == nil || req.Response.Request == nil {
		return ""
	}
	return t.headerKey(req.Response.Request.Header)
}

// CloseIdleConnections closes the idle connections of Config.Base, when it
// has such a method (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.cfg.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// readBody reads the body of the answer about to be returned into memory
// when its Content-Length is at most MaxBufferedResponse, so that a cut in
// the middle of it is an attempt's error, which may be retried, rather than
// the caller's. The bytes go to mb. On error the body is closed.
func (t *Transport) readBody(resp *http.Response, mb *memBody) error {
	if resp.ContentLength < 0 || resp.ContentLength > t.cfg.MaxBufferedResponse ||
		resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	// One byte more than announced, to see the end without another
	// allocation: net/http's body ends at its Content-Length, another
	// Base's may go on.
	n := resp.ContentLength
	buf := make([]byte, n+1)
	_, err := io.ReadFull(resp.Body, buf[:n])
	if err == nil {
		m, rerr := resp.Body.Read(buf[n:])
		switch {
		case m == 0 && rerr == io.EOF:
			buf = buf[:n]
		case m == 0 && rerr != nil:
			err = rerr
		default:
			var rest []byte
			rest, err = io.ReadAll(resp.Body)
			buf = append(buf[:n+int64(m)], rest...)
		}
	}
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("idemclient: reading the answer's body: %w", err)
	}
	mb.Reset(buf)
	resp.Body = mb
	return nil
}

// memBody is an answer's body read into memory.
type memBody struct{ bytes.Reader }

func (*memBody) Close() error { return nil }

// discard reads a little of an answer that is not returned, so that its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	if resp.Body != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		_ = resp.Body.Close()
	}
}
