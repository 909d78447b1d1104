package idemclient

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seen is one request as a scripted server got it.
type seen struct {
	keys []string // every value of the key header
	body string
}

// step answers one request of a scripted server.
type step func(w http.ResponseWriter, r *http.Request)

// server is an httptest server that answers its n-th request with its
// n-th step (the last one again when they run out), and records what each
// request carried.
type server struct {
	*httptest.Server
	header string

	mu    sync.Mutex
	steps []step
	seen  []seen
	// cutAccepts is how many of the next accepted connections are closed
	// before a byte is read: the request never reaches the server.
	cutAccepts atomic.Int32
	accepts    atomic.Int32 // connections accepted and served
}

func newServer(t *testing.T, steps ...step) *server {
	s := &server{steps: steps, header: DefaultHeader}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Listener = &cuttingListener{Listener: s.Listener, s: s}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.seen)
	s.seen = append(s.seen, seen{keys: r.Header.Values(s.header), body: string(b)})
	st := s.steps[min(n, len(s.steps)-1)]
	s.mu.Unlock()
	st(w, r)
}

func (s *server) Seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.seen...)
}

func (s *server) keys() [][]string {
	var out [][]string
	for _, r := range s.Seen() {
		out = append(out, r.keys)
	}
	return out
}

type cuttingListener struct {
	net.Listener
	s *server
}

func (l *cuttingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.s.cutAccepts.Add(-1) >= 0 {
			_ = c.Close()
			continue
		}
		l.s.cutAccepts.Store(0)
		l.s.accepts.Add(1)
		return c, nil
	}
}

// Steps.

func status(code int, kv ...string) step {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.WriteHeader(code)
	}
}

func jsonStep(code int, body string, kv ...string) step {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		status(code, kv...)(w, r)
		_, _ = io.WriteString(w, body)
	}
}

func problemStep(code int, anchor string, kv ...string) step {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		status(code, kv...)(w, r)
		_, _ = fmt.Fprintf(w, `{"type":%q,"title":"t","status":%d}`, problemBase+anchor, code)
	}
}

// hangUp reads the request (the server has it) and closes the connection
// without answering: the client cannot tell whether it was processed.
func hangUp(w http.ResponseWriter, r *http.Request) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = c.Close()
	}
}

// cutBody sends a 201's head and half its body, then closes the
// connection: the answer was committed, and the client loses it.
func cutBody(w http.ResponseWriter, r *http.Request) {
	c, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"id\":\"pay_1\"")
	_ = buf.Flush()
	_ = c.Close()
}

// newTransport is a Transport over a fresh net/http Transport (so no test
// shares connections with another) with the fake clock.
func newTransport(t *testing.T, clock *fakeClock, config func(*Config)) *Transport {
	t.Helper()
	base := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(base.CloseIdleConnections)
	cfg := testConfig(clock, base)
	if config != nil {
		config(&cfg)
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func post(t *testing.T, c *http.Client, url, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return send(c, req)
}

func send(c *http.Client, req *http.Request) (*http.Response, string, error) {
	res, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

const payBody = `{"amount":1250,"currency":"EUR"}`

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestServerFailures runs the Transport against real HTTP servers scripted
// to fail in each way, then to succeed: each operation sends one key on
// every attempt and the same body, and the caller gets the success.
func TestServerFailures(t *testing.T) {
	const okBody = `{"id":"pay_1","amount":1250}`
	ok := jsonStep(201, okBody)
	okReplay := jsonStep(201, okBody, ReplayedHeader, "true")
	for _, tc := range []struct {
		name       string
		steps      []step
		cutAccepts int32 // connections closed before the request
		config     func(*Config)
		requests   int // requests the server got
		attempts   int
		replayed   bool
		sleeps     []time.Duration
	}{
		{name: "cut before the request", cutAccepts: 2, steps: []step{ok}, requests: 1, attempts: 3,
			sleeps: []time.Duration{250 * ms, 500 * ms}},
		{name: "cut after the request", steps: []step{hangUp, okReplay}, requests: 2, attempts: 2, replayed: true,
			sleeps: []time.Duration{250 * ms}},
		{name: "cut in the committed answer's body", steps: []step{cutBody, okReplay}, requests: 2, attempts: 2, replayed: true,
			sleeps: []time.Duration{250 * ms}},
		{name: "409 key-in-use with Retry-After, then the replay",
			steps:    []step{problemStep(409, "key-in-use", "Retry-After", "2"), problemStep(409, "key-in-use", "Retry-After", "1"), okReplay},
			requests: 3, attempts: 3, replayed: true, sleeps: []time.Duration{2 * time.Second, time.Second}},
		{name: "503 store-unavailable", steps: []step{problemStep(503, "store-unavailable", "Retry-After", "1"), ok},
			requests: 2, attempts: 2, sleeps: []time.Duration{time.Second}},
		{name: "429 with an unreadable Retry-After", steps: []step{status(429, "Retry-After", "in a while"), ok},
			requests: 2, attempts: 2, sleeps: []time.Duration{250 * ms}},
		{name: "502 and 504 from a proxy", steps: []step{status(502), status(504), ok},
			requests: 3, attempts: 3, sleeps: []time.Duration{250 * ms, 500 * ms}},
		{name: "500 transaction-ended", steps: []step{problemStep(500, "transaction-ended", "Retry-After", "3"), okReplay},
			requests: 2, attempts: 2, replayed: true, sleeps: []time.Duration{3 * time.Second}},
		{name: "every failure in turn",
			steps: []step{hangUp, cutBody, status(503), problemStep(409, "key-in-use", "Retry-After", "1"),
				status(502), status(429), problemStep(500, "commit-failed"), okReplay},
			config:   func(c *Config) { c.MaxAttempts = 10; c.MaxElapsed = time.Hour },
			requests: 8, attempts: 8, replayed: true,
			sleeps: []time.Duration{250 * ms, 500 * ms, 1000 * ms, time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			srv := newServer(t, tc.steps...)
			srv.cutAccepts.Store(tc.cutAccepts)
			c := &http.Client{Transport: newTransport(t, clock, tc.config)}
			res, body, err := post(t, c, srv.URL+"/payments", payBody)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != 201 || body != okBody {
				t.Fatalf("%d %q, want 201 %q", res.StatusCode, body, okBody)
			}
			key := oneKey(t, srv.keys())
			if !uuidV4.MatchString(key) {
				t.Errorf("key %q is not a UUIDv4", key)
			}
			for i, r := range srv.Seen() {
				if r.body != payBody {
					t.Errorf("request %d carried body %q", i+1, r.body)
				}
			}
			if n := len(srv.Seen()); n != tc.requests {
				t.Errorf("the server got %d requests, want %d", n, tc.requests)
			}
			info, _ := Info(res)
			if info != (Result{Key: key, Attempts: tc.attempts, Replayed: tc.replayed}) {
				t.Errorf("Info %+v, want key %s, %d attempts, replayed %v", info, key, tc.attempts, tc.replayed)
			}
			if got := clock.Sleeps(); fmt.Sprint(got) != fmt.Sprint(tc.sleeps) {
				t.Errorf("waits %v, want %v", got, tc.sleeps)
			}
		})
	}
}

// TestCallerKeyWins: the request's own key header, then the context's key,
// then a new one; each is sent on every attempt, and NewKey is not called
// when the caller gave a key.
func TestCallerKeyWins(t *testing.T) {
	for _, tc := range []struct {
		name    string
		header  func(http.Header)
		ctxKey  string
		want    string
		newKeys int32
	}{
		{name: "header", header: func(h http.Header) { h.Set("Idempotency-Key", "order-1") }, want: "order-1"},
		{name: "header as an RFC 9651 string", header: func(h http.Header) { h.Set("Idempotency-Key", `"order-1"`) }, want: `"order-1"`},
		{name: "header set without canonical case", header: func(h http.Header) { h["idempotency-key"] = []string{"order-2"} }, want: "order-2"},
		{name: "context", ctxKey: "order-3", want: "order-3"},
		{name: "header beats context", header: func(h http.Header) { h.Set("Idempotency-Key", "order-4") }, ctxKey: "order-5", want: "order-4"},
		{name: "empty header: context", header: func(h http.Header) { h.Set("Idempotency-Key", "") }, ctxKey: "order-6", want: "order-6"},
		{name: "empty context key: a new key", ctxKey: "", want: "generated-1", newKeys: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			srv := newServer(t, status(503), hangUp, jsonStep(201, `{}`))
			var calls atomic.Int32
			c := &http.Client{Transport: newTransport(t, clock, func(c *Config) {
				c.NewKey = func() string { return fmt.Sprintf("generated-%d", calls.Add(1)) }
			})}
			ctx := context.Background()
			if tc.ctxKey != "" || tc.newKeys > 0 {
				ctx = WithKey(ctx, tc.ctxKey)
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(payBody))
			if tc.header != nil {
				tc.header(req.Header)
			}
			before := req.Header.Clone()
			res, _, err := send(c, req)
			if err != nil || res.StatusCode != 201 {
				t.Fatalf("%v %v", res, err)
			}
			seen := srv.Seen()
			if len(seen) != 3 {
				t.Fatalf("%d requests, want 3", len(seen))
			}
			for i, r := range seen {
				if len(r.keys) != 1 || r.keys[0] != tc.want {
					t.Errorf("request %d sent %q, want [%s]", i+1, r.keys, tc.want)
				}
			}
			if n := calls.Load(); n != tc.newKeys {
				t.Errorf("NewKey called %d times, want %d", n, tc.newKeys)
			}
			if info, _ := Info(res); info.Key != tc.want {
				t.Errorf("Info key %q, want %q", info.Key, tc.want)
			}
			if fmt.Sprint(req.Header) != fmt.Sprint(before) {
				t.Errorf("the caller's request headers changed: %v, were %v", req.Header, before)
			}
		})
	}
}

// TestBodies: a body with GetBody is resent through it, one without is
// buffered up to MaxBufferedBody and resent from the buffer, and one that
// is larger is sent once and never again, whatever the answer.
func TestBodies(t *testing.T) {
	big := strings.Repeat("x", 64)
	type reader struct{ io.Reader } // hides WriteTo and the type NewRequest knows
	for _, tc := range []struct {
		name     string
		body     func() io.Reader
		steps    []step
		attempts int // and requests
		wantErr  bool
		status   int
	}{
		{name: "GetBody, cut after the request", body: func() io.Reader { return strings.NewReader(big) },
			steps: []step{hangUp, jsonStep(201, `{}`)}, attempts: 2, status: 201},
		{name: "no GetBody, buffered, cut", body: func() io.Reader { return reader{strings.NewReader(big[:32])} },
			steps: []step{hangUp, status(503), jsonStep(201, `{}`)}, attempts: 3, status: 201},
		{name: "no GetBody, empty", body: func() io.Reader { return reader{strings.NewReader("")} },
			steps: []step{status(503), jsonStep(201, `{}`)}, attempts: 2, status: 201},
		{name: "no GetBody, too large to buffer, 503", body: func() io.Reader { return reader{strings.NewReader(big)} },
			steps: []step{status(503), jsonStep(201, `{}`)}, attempts: 1, status: 503},
		{name: "no GetBody, too large to buffer, 409", body: func() io.Reader { return reader{strings.NewReader(big)} },
			steps: []step{problemStep(409, "key-in-use", "Retry-After", "1"), jsonStep(201, `{}`)}, attempts: 1, status: 409},
		{name: "no GetBody, too large to buffer, cut", body: func() io.Reader { return reader{strings.NewReader(big)} },
			steps: []step{hangUp, jsonStep(201, `{}`)}, attempts: 1, wantErr: true},
		{name: "no body", body: func() io.Reader { return nil },
			steps: []step{hangUp, jsonStep(201, `{}`)}, attempts: 2, status: 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.steps...)
			c := &http.Client{Transport: newTransport(t, newFakeClock(), func(c *Config) { c.MaxBufferedBody = 32 })}
			rd := tc.body()
			want := ""
			if rd != nil {
				b, _ := io.ReadAll(rd)
				want, rd = string(b), tc.body()
			}
			req, _ := http.NewRequest("POST", srv.URL, rd)
			res, _, err := send(c, req)
			var e *Error
			if tc.wantErr {
				if !errors.As(err, &e) || e.Attempts != tc.attempts {
					t.Fatalf("got %v, %v; want an *Error after %d attempts", res, err, tc.attempts)
				}
			} else if err != nil || res.StatusCode != tc.status {
				t.Fatalf("got %v, %v; want %d", res, err, tc.status)
			} else if info, _ := Info(res); info.Attempts != tc.attempts {
				t.Errorf("Info attempts %d, want %d", info.Attempts, tc.attempts)
			}
			seen := srv.Seen()
			if len(seen) != tc.attempts {
				t.Fatalf("the server got %d requests, want %d", len(seen), tc.attempts)
			}
			oneKey(t, srv.keys())
			for i, r := range seen {
				if r.body != want {
					t.Errorf("request %d carried %q, want %q", i+1, r.body, want)
				}
			}
		})
	}
}

// TestGetBodyUsedForRetries: the first attempt sends req.Body, each later
// one a fresh body from GetBody.
func TestGetBodyUsedForRetries(t *testing.T) {
	srv := newServer(t, status(503), status(503), jsonStep(201, `{}`))
	c := &http.Client{Transport: newTransport(t, newFakeClock(), nil)}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(payBody))
	get := req.GetBody
	var calls atomic.Int32
	req.GetBody = func() (io.ReadCloser, error) { calls.Add(1); return get() }
	if res, _, err := send(c, req); err != nil || res.StatusCode != 201 {
		t.Fatal(res, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("GetBody called %d times, want 2", n)
	}
	req2, _ := http.NewRequest("POST", srv.URL, strings.NewReader(payBody))
	req2.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
	srv2 := newServer(t, status(503))
	req2.URL, _ = url.Parse(srv2.URL)
	_, _, err := send(c, req2)
	var e *Error
	if !errors.As(err, &e) || e.Attempts != 1 || !strings.Contains(err.Error(), "gone") {
		t.Errorf("GetBody failing: %v, want an *Error after 1 attempt", err)
	}
}

// TestOtherMethodsPassThrough: a method not configured gets no key and one
// attempt; configuring it changes that.
func TestOtherMethodsPassThrough(t *testing.T) {
	for _, m := range []string{"GET", "PUT", "DELETE", "post"} {
		srv := newServer(t, status(503), status(201))
		c := &http.Client{Transport: newTransport(t, newFakeClock(), nil)}
		req, _ := http.NewRequest(m, srv.URL, nil)
		res, _, err := send(c, req)
		if err != nil || res.StatusCode != 503 {
			t.Fatalf("%s: %v %v", m, res, err)
		}
		if _, ok := Info(res); ok {
			t.Errorf("%s: Info ok for a request the Transport does not apply to", m)
		}
		if s := srv.Seen(); len(s) != 1 || len(s[0].keys) != 0 {
			t.Errorf("%s: %+v, want one request without a key", m, s)
		}
	}
	srv := newServer(t, status(503), status(204))
	srv.header = "X-Request-Key"
	c := &http.Client{Transport: newTransport(t, newFakeClock(), func(c *Config) {
		c.Methods = []string{"PUT", "DELETE"}
		c.Header = "x-request-key"
	})}
	req, _ := http.NewRequest("DELETE", srv.URL, nil)
	res, _, err := send(c, req)
	if err != nil || res.StatusCode != 204 {
		t.Fatal(res, err)
	}
	key := oneKey(t, srv.keys())
	if info, _ := Info(res); info.Key != key || info.Attempts != 2 || len(srv.Seen()) != 2 {
		t.Errorf("Info %+v, server %+v", info, srv.Seen())
	}
}

// TestReturnedBodyIsWhole: an answer whose problem type was read to decide
// comes back to the caller with every byte, also past the peek limit.
func TestReturnedBodyIsWhole(t *testing.T) {
	for _, n := range []int{0, 10, peekLimit - 1, peekLimit, 3 * peekLimit} {
		for _, status := range []int{409, 422, 500} {
			pad := strings.Repeat(" ", n)
			doc := fmt.Sprintf(`{"type":%q,%s"status":%d}`, problemBase+"store-misconfigured", pad, status)
			if status == 409 {
				doc = fmt.Sprintf(`{"type":%q,%s"status":409}`, problemBase+"other", pad)
			}
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/problem+json; charset=utf-8")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, doc)
			})
			c := &http.Client{Transport: newTransport(t, newFakeClock(), nil)}
			res, body, err := post(t, c, srv.URL, payBody)
			if err != nil || res.StatusCode != status || body != doc {
				t.Fatalf("n=%d %d: %v %v, body of %d bytes, want %d", n, status, res, err, len(body), len(doc))
			}
			// A document longer than the peek limit has no type the client
			// can read, so its 409 or 500 counts as another server's and is
			// retried; a 422 never is.
			want := 1
			if len(doc) > peekLimit && status != 422 {
				want = DefaultMaxAttempts
			}
			if len(srv.Seen()) != want {
				t.Errorf("n=%d %d: %d requests, want %d", n, status, len(srv.Seen()), want)
			}
		}
	}
}

// TestContextDeadlineDuringAttempt: the context's deadline ends a running
// attempt and the request; the error says timeout through url.Error and
// carries the key.
func TestContextDeadlineDuringAttempt(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	c := &http.Client{Transport: newTransport(t, newFakeClock(), nil)}
	ctx, cancel := context.WithTimeout(context.Background(), 100*ms)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(payBody))
	_, _, err := send(c, req)
	var (
		e  *Error
		ue *url.Error
	)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &e) || !errors.As(err, &ue) || !ue.Timeout() {
		t.Fatalf("%v: want a timeout *url.Error around an *Error", err)
	}
	if e.Attempts != 1 || e.Key != oneKey(t, srv.keys()) {
		t.Errorf("%+v", e)
	}
}

// TestKeepAliveAfterRetries: answers that are retried are drained, so the
// attempts share one kept-alive connection.
func TestKeepAliveAfterRetries(t *testing.T) {
	srv := newServer(t, jsonStep(503, strings.Repeat("x", 1000)), problemStep(409, "key-in-use", "Retry-After", "0"), jsonStep(201, `{}`))
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	clock := newFakeClock()
	rt, err := New(testConfig(clock, base))
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := post(t, &http.Client{Transport: rt}, srv.URL, payBody)
	if err != nil || res.StatusCode != 201 {
		t.Fatal(res, err)
	}
	if n := srv.accepts.Load(); n != 1 {
		t.Errorf("%d connections for 3 attempts, want 1", n)
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if !uuidV4.MatchString(k) || seen[k] {
			t.Fatalf("NewKey() = %q (seen before: %v)", k, seen[k])
		}
		seen[k] = true
	}
}

// TestBadGeneratedKey: a NewKey that returns no usable key fails the
// request before anything is sent.
func TestBadGeneratedKey(t *testing.T) {
	for _, k := range []string{"", "two words", strings.Repeat("k", 256), "é"} {
		srv := newServer(t, status(201))
		c := &http.Client{Transport: newTransport(t, newFakeClock(), func(c *Config) { c.NewKey = func() string { return k } })}
		closed := false
		req, _ := http.NewRequest("POST", srv.URL, &closeRecorder{Reader: strings.NewReader("x"), closed: &closed})
		_, _, err := send(c, req)
		var e *Error
		if !errors.As(err, &e) || e.Attempts != 0 || len(srv.Seen()) != 0 || !closed {
			t.Errorf("key %q: %v, %d requests, body closed %v; want an *Error, nothing sent, the body closed", k, err, len(srv.Seen()), closed)
		}
	}
}

type closeRecorder struct {
	io.Reader
	closed *bool
}

func (c *closeRecorder) Close() error { *c.closed = true; return nil }

func TestNewRejects(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Header: "Idempotency Key"}, "Header"},
		{Config{Header: "Key:"}, "Header"},
		{Config{Methods: []string{}}, "Methods must name"},
		{Config{Methods: []string{"POST", ""}}, "Methods must be"},
		{Config{MaxAttempts: -1}, "MaxAttempts"},
		{Config{MaxElapsed: -time.Second}, "MaxElapsed"},
		{Config{BaseDelay: -time.Second}, "BaseDelay"},
		{Config{BaseDelay: time.Second, MaxDelay: time.Millisecond}, "MaxDelay"},
		{Config{MaxRetryAfter: -1}, "MaxRetryAfter"},
	} {
		_, err := New(tc.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(Config{BaseDelay: time.Minute}); err != nil {
		t.Errorf("a BaseDelay above the default MaxDelay: %v (MaxDelay follows it)", err)
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("New(Config{}) = %v", err)
	}
}

// TestConfigNotShared: changing the Methods slice after New changes
// nothing.
func TestConfigNotShared(t *testing.T) {
	m := []string{"POST"}
	rt, err := New(Config{Methods: m})
	if err != nil {
		t.Fatal(err)
	}
	m[0] = "GET"
	if rt.cfg.Methods[0] != "POST" {
		t.Error("the Transport shares the caller's Methods slice")
	}
}

// TestRedirect: a redirect http.Client follows is the same operation at
// another URL: every hop sends the key the first one sent, minted once,
// and the body goes along. Info reports that key.
func TestRedirect(t *testing.T) {
	redirect := func(code int, to string) step {
		return func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, to, code) }
	}
	for _, tc := range []struct {
		name   string
		ctxKey string
		steps  []step
		hops   int
	}{
		{name: "307", steps: []step{redirect(307, "/v2/payments"), jsonStep(201, `{}`)}, hops: 2},
		{name: "308", steps: []step{redirect(308, "/v2/payments"), jsonStep(201, `{}`)}, hops: 2},
		{name: "307 then 308", steps: []step{redirect(307, "/v2/payments"), redirect(308, "/v3/payments"), jsonStep(201, `{}`)}, hops: 3},
		{name: "307, a retried 503, then 201", steps: []step{redirect(307, "/v2/payments"), status(503), jsonStep(201, `{}`)}, hops: 3},
		{name: "307 with WithKey", ctxKey: "order-7", steps: []step{redirect(307, "/v2/payments"), jsonStep(201, `{}`)}, hops: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.steps...)
			var minted atomic.Int32
			c := &http.Client{Transport: newTransport(t, newFakeClock(), func(c *Config) {
				c.NewKey = func() string { return fmt.Sprintf("minted-%d", minted.Add(1)) }
			})}
			ctx := context.Background()
			if tc.ctxKey != "" {
				ctx = WithKey(ctx, tc.ctxKey)
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader(payBody))
			res, _, err := send(c, req)
			if err != nil || res.StatusCode != 201 {
				t.Fatal(res, err)
			}
			s := srv.Seen()
			if len(s) != tc.hops {
				t.Fatalf("%d requests, want %d: %+v", len(s), tc.hops, s)
			}
			for i, r := range s {
				if r.body != payBody {
					t.Errorf("request %d sent body %q", i+1, r.body)
				}
			}
			key := oneKey(t, srv.keys())
			want, mints := tc.ctxKey, int32(0)
			if want == "" {
				want, mints = "minted-1", 1
			}
			if key != want || minted.Load() != mints {
				t.Errorf("key %q, NewKey called %d times; want %q, %d", key, minted.Load(), want, mints)
			}
			if info, _ := Info(res); info.Key != key {
				t.Errorf("Info key %q, sent %q", info.Key, key)
			}
		})
	}
}

// TestRedirectToAnotherServer: a 307 to another server sends it the key
// the first server got, as net/http sends a key header the caller set.
func TestRedirectToAnotherServer(t *testing.T) {
	second := newServer(t, jsonStep(201, `{}`))
	first := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, second.URL+"/payments", http.StatusTemporaryRedirect)
	})
	c := &http.Client{Transport: newTransport(t, newFakeClock(), nil)}
	res, _, err := post(t, c, first.URL+"/payments", payBody)
	if err != nil || res.StatusCode != 201 {
		t.Fatal(res, err)
	}
	k1, k2 := oneKey(t, first.keys()), oneKey(t, second.keys())
	if k1 != k2 || !uuidV4.MatchString(k1) {
		t.Errorf("keys %q and %q, want one UUIDv4", k1, k2)
	}
}

// TestErrorHidesKey: no error the Transport returns prints the key, in
// Error or through fmt's verbs, nor does http.Client's *url.Error around
// it; it names the key by its hash, and keeps it in Error.Key.
func TestErrorHidesKey(t *testing.T) {
	const key = "order-2f9c41d7-secret"
	hash := fmt.Sprintf("%x", sha256.Sum256([]byte(key)))[:8]
	unknown := problemStep(409, "outcome-unknown")
	for _, tc := range []struct {
		name  string
		steps []step
		cfg   func(*Config)
		ctx   func(context.Context) context.Context
	}{
		{name: "cuts", steps: []step{hangUp}},
		{name: "outcome unknown", steps: []step{unknown}},
		{name: "context ended in a wait", steps: []step{status(503)}, ctx: func(ctx context.Context) context.Context {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return ctx
		}},
		{name: "minted key", steps: []step{hangUp}, cfg: func(c *Config) { c.NewKey = func() string { return key } }},
		{name: "minted key not valid", steps: []step{status(201)}, cfg: func(c *Config) { c.NewKey = func() string { return key + " " + key } }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.steps...)
			c := &http.Client{Transport: newTransport(t, newFakeClock(), func(c *Config) {
				c.MaxAttempts = 2
				if tc.cfg != nil {
					tc.cfg(c)
				}
			})}
			ctx := context.Background()
			if tc.cfg == nil {
				ctx = WithKey(ctx, key)
			}
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader(payBody))
			_, _, err := send(c, req)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%v, want an *Error", err)
			}
			for _, msg := range []string{err.Error(), e.Error(), fmt.Sprint(err), fmt.Sprintf("%v %+v %s %q", err, err, err, err),
				fmt.Sprintf("%v %+v %s %q", e, e, e, e)} {
				if strings.Contains(msg, key) {
					t.Errorf("the error prints the key: %s", msg)
				}
			}
			if e.Key != "" && (e.Key != key || !strings.Contains(err.Error(), "sha256:"+hash)) {
				t.Errorf("Error.Key %q, message %q; want the key in the field, its hash %s in the message", e.Key, err, hash)
			}
		})
	}
}

// TestOutcomeUnknown: a problem of type outcome-unknown is final: one
// request reaches the server, with or without Retry-After, and the caller
// gets an *Error wrapping ErrOutcomeUnknown through http.Client's
// *url.Error, with the key and the attempts.
func TestOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   step
	}{
		{name: "409", st: problemStep(409, "outcome-unknown")},
		{name: "409 with Retry-After", st: problemStep(409, "outcome-unknown", "Retry-After", "1")},
		{name: "503", st: problemStep(503, "outcome-unknown")},
		{name: "another server's type", st: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			_, _ = io.WriteString(w, `{"type":"https://api.example.test/problems/outcome-unknown","status":409}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.st, jsonStep(201, `{}`))
			clock := newFakeClock()
			c := &http.Client{Transport: newTransport(t, clock, nil)}
			res, _, err := post(t, c, srv.URL+"/payments", payBody)
			var (
				e  *Error
				ue *url.Error
			)
			if !errors.Is(err, ErrOutcomeUnknown) || !errors.As(err, &e) || !errors.As(err, &ue) {
				t.Fatalf("%v, %v; want a *url.Error around an *Error wrapping ErrOutcomeUnknown", res, err)
			}
			if n := len(srv.Seen()); n != 1 || e.Attempts != 1 || e.Key != oneKey(t, srv.keys()) {
				t.Errorf("%d requests, Error attempts %d key %q; want 1 request, its key", n, e.Attempts, e.Key)
			}
			if s := clock.Sleeps(); len(s) != 0 {
				t.Errorf("waited %v", s)
			}
		})
	}
}
