package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

// TestDecisions runs every retry decision through RoundTrip with scripted
// answers, a fake clock and a jitter that draws the ceiling: how many
// attempts, which waits, and which answer or error the caller gets.
func TestDecisions(t *testing.T) {
	type row struct {
		name    string
		answers []answer
		config  func(*Config)
		// deadline, when set, is the context's deadline after the start.
		deadline time.Duration
		// cancelOnSleep cancels the context in the first wait.
		cancelOnSleep bool
		// cancelInAttempt cancels the context while attempt 1 runs, which
		// then fails.
		cancelInAttempt bool

		attempts int
		sleeps   []time.Duration
		status   int   // the answer returned; 0: an error
		errIs    error // with status 0, errors.Is(err, errIs) when set
		replayed bool
	}
	s := func(d ...time.Duration) []time.Duration { return d }
	inUse := func(ra string) answer { return problem(409, "key-in-use", "Retry-After", ra) }
	created := replayed(resp(201, "Content-Type", "application/json"))
	certErr := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	rows := []row{
		{name: "201 at once", answers: []answer{resp(201)}, attempts: 1, status: 201},
		{name: "503 then 201", answers: []answer{resp(503), resp(201)}, attempts: 2, sleeps: s(250 * ms), status: 201},
		{name: "backoff doubles", answers: []answer{resp(503), resp(503), resp(503), resp(503), resp(201)},
			attempts: 5, sleeps: s(250*ms, 500*ms, 1000*ms, 2000*ms), status: 201},
		{name: "backoff capped at MaxDelay", answers: []answer{resp(502), resp(504), resp(503), resp(429), resp(201)},
			config:   func(c *Config) { c.MaxDelay = 600 * ms },
			attempts: 5, sleeps: s(250*ms, 500*ms, 600*ms, 600*ms), status: 201},
		{name: "attempts used up: the last answer", answers: []answer{resp(503)},
			attempts: 8, sleeps: s(250*ms, 500*ms, 1000*ms, 2000*ms, 4000*ms, 5000*ms, 5000*ms), status: 503},
		{name: "MaxAttempts 1 retries nothing", answers: []answer{resp(503)}, config: func(c *Config) { c.MaxAttempts = 1 },
			attempts: 1, status: 503},
		{name: "jitter draws below the ceiling", answers: []answer{resp(503), resp(503), resp(201)},
			config:   func(c *Config) { c.Jitter = func(d time.Duration) time.Duration { return d / 4 } },
			attempts: 3, sleeps: s(62500*time.Microsecond, 125*ms), status: 201},
		{name: "jitter out of range is clamped", answers: []answer{resp(503), resp(503), resp(201)},
			config: func(c *Config) {
				n := 0
				c.Jitter = func(d time.Duration) time.Duration { n++; return map[int]time.Duration{1: 3 * d, 2: -d}[n] }
			},
			attempts: 3, sleeps: s(250*ms, 0), status: 201},

		// Retry-After.
		{name: "429 Retry-After seconds", answers: []answer{resp(429, "Retry-After", "3"), resp(201)},
			attempts: 2, sleeps: s(3 * time.Second), status: 201},
		{name: "503 Retry-After HTTP date", answers: []answer{resp(503, "Retry-After", "DATE+7s"), resp(201)},
			attempts: 2, sleeps: s(7 * time.Second), status: 201},
		{name: "Retry-After date in the past is no wait", answers: []answer{resp(503, "Retry-After", "DATE-30s"), resp(201)},
			attempts: 2, sleeps: s(0), status: 201},
		{name: "Retry-After 0 is no wait", answers: []answer{resp(503, "Retry-After", "0"), resp(201)},
			attempts: 2, sleeps: s(0), status: 201},
		{name: "Retry-After capped at MaxRetryAfter", answers: []answer{inUse("35"), created},
			attempts: 2, sleeps: s(10 * time.Second), status: 201, replayed: true},
		{name: "Retry-After huge is capped", answers: []answer{resp(503, "Retry-After", "99999999999999999999999"), resp(201)},
			attempts: 2, sleeps: s(10 * time.Second), status: 201},
		{name: "Retry-After not a number nor a date: backoff", answers: []answer{resp(503, "Retry-After", "soon"), resp(201)},
			attempts: 2, sleeps: s(250 * ms), status: 201},
		{name: "Retry-After negative: backoff", answers: []answer{resp(503, "Retry-After", "-5"), resp(201)},
			attempts: 2, sleeps: s(250 * ms), status: 201},

		// 409.
		{name: "409 key-in-use, then the replay", answers: []answer{inUse("1"), inUse("2"), created},
			attempts: 3, sleeps: s(time.Second, 2*time.Second), status: 201, replayed: true},
		{name: "409 lease-lost", answers: []answer{problem(409, "lease-lost", "Retry-After", "1"), created},
			attempts: 2, sleeps: s(time.Second), status: 201, replayed: true},
		{name: "409 Stripe-style plain JSON", answers: []answer{
			func() answer {
				a := resp(409, "Content-Type", "application/json")
				a.body = `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key"}}`
				return a
			}(), created},
			attempts: 2, sleeps: s(250 * ms), status: 201, replayed: true},
		{name: "409 another server's problem type (IETF draft)", answers: []answer{
			problem(409, "https://developer.example.com/idempotency"), resp(201)},
			attempts: 2, sleeps: s(250 * ms), status: 201},
		{name: "409 of another idem type is final", answers: []answer{problem(409, "not-in-progress")}, attempts: 1, status: 409},
		{name: "409 replayed is final", answers: []answer{replayed(resp(409))}, attempts: 1, status: 409, replayed: true},
		{name: "409 outcome-unknown is ErrOutcomeUnknown", answers: []answer{problem(409, "outcome-unknown"), resp(201)},
			attempts: 1, errIs: ErrOutcomeUnknown},
		{name: "409 outcome-unknown with Retry-After too", answers: []answer{problem(409, "outcome-unknown", "Retry-After", "1"), resp(201)},
			attempts: 1, errIs: ErrOutcomeUnknown},
		{name: "409 outcome-unknown of another server", answers: []answer{problem(409, "https://api.example.test/p#outcome-unknown"), resp(201)},
			attempts: 1, errIs: ErrOutcomeUnknown},
		{name: "500 outcome-unknown", answers: []answer{problem(500, "outcome-unknown"), resp(201)}, attempts: 1, errIs: ErrOutcomeUnknown},
		{name: "409 outcome-unknown replayed", answers: []answer{replayed(problem(409, "outcome-unknown"))}, attempts: 1, errIs: ErrOutcomeUnknown},
		{name: "409 key-in-use, then outcome-unknown", answers: []answer{inUse("1"), problem(409, "outcome-unknown"), resp(201)},
			attempts: 2, sleeps: s(time.Second), errIs: ErrOutcomeUnknown},

		// Final 4xx.
		{name: "422 key-reused", answers: []answer{problem(422, "key-reused"), resp(201)}, attempts: 1, status: 422},
		{name: "422 plain", answers: []answer{resp(422), resp(201)}, attempts: 1, status: 422},
		{name: "400 key-invalid", answers: []answer{problem(400, "key-invalid")}, attempts: 1, status: 400},
		{name: "400 plain", answers: []answer{resp(400)}, attempts: 1, status: 400},
		{name: "401", answers: []answer{problem(401, "unauthenticated")}, attempts: 1, status: 401},
		{name: "403", answers: []answer{resp(403)}, attempts: 1, status: 403},
		{name: "404", answers: []answer{resp(404)}, attempts: 1, status: 404},
		{name: "408", answers: []answer{resp(408)}, attempts: 1, status: 408},
		{name: "413 body-too-large", answers: []answer{problem(413, "body-too-large")}, attempts: 1, status: 413},
		{name: "400 body-unreadable is retried", answers: []answer{problem(400, "body-unreadable"), resp(201)},
			attempts: 2, sleeps: s(250 * ms), status: 201},

		// 5xx.
		{name: "500 plain", answers: []answer{resp(500), resp(201)}, attempts: 2, sleeps: s(250 * ms), status: 201},
		{name: "500 commit-failed", answers: []answer{problem(500, "commit-failed", "Retry-After", "1"), resp(201)},
			attempts: 2, sleeps: s(time.Second), status: 201},
		{name: "500 transaction-ended after its Retry-After", answers: []answer{problem(500, "transaction-ended", "Retry-After", "4"), created},
			attempts: 2, sleeps: s(4 * time.Second), status: 201, replayed: true},
		{name: "500 store-misconfigured is final", answers: []answer{problem(500, "store-misconfigured"), resp(201)}, attempts: 1, status: 500},
		{name: "500 response-too-large is final", answers: []answer{problem(500, "response-too-large"), resp(201)}, attempts: 1, status: 500},
		{name: "501 is final", answers: []answer{resp(501), resp(201)}, attempts: 1, status: 501},
		{name: "505 is final", answers: []answer{resp(505), resp(201)}, attempts: 1, status: 505},
		{name: "503 store-unavailable", answers: []answer{problem(503, "store-unavailable", "Retry-After", "1"), resp(201)},
			attempts: 2, sleeps: s(time.Second), status: 201},
		{name: "503 timeout", answers: []answer{problem(503, "timeout", "Retry-After", "1"), resp(201)},
			attempts: 2, sleeps: s(time.Second), status: 201},
		{name: "503 replayed is final", answers: []answer{replayed(resp(503))}, attempts: 1, status: 503, replayed: true},

		// Transport errors.
		{name: "cut, then 201", answers: []answer{cut(-1), resp(201)}, attempts: 2, sleeps: s(250 * ms), status: 201},
		{name: "cut before the body was read, then 201", answers: []answer{cut(0), cut(3), resp(201)},
			attempts: 3, sleeps: s(250*ms, 500*ms), status: 201},
		{name: "cuts use up the attempts", answers: []answer{cut(-1)},
			attempts: 8, sleeps: s(250*ms, 500*ms, 1000*ms, 2000*ms, 4000*ms, 5000*ms, 5000*ms)},
		{name: "certificate error is final", answers: []answer{{err: certErr, readBody: 0}, resp(201)}, attempts: 1, errIs: certErr},
		{name: "unknown host is final", answers: []answer{{err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}}, resp(201)},
			attempts: 1},
		{name: "DNS timeout is retried", answers: []answer{{err: &net.DNSError{Err: "i/o timeout", Name: "x", IsTimeout: true}}, resp(201)},
			attempts: 2, sleeps: s(250 * ms), status: 201},

		// Budgets.
		{name: "the default budget outlasts a server's default lease",
			answers:  []answer{inUse("10"), inUse("10"), inUse("10"), inUse("10"), created},
			attempts: 5, sleeps: s(10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second), status: 201, replayed: true},
		{name: "MaxElapsed: a wait past it is not started", answers: []answer{inUse("3"), resp(201)},
			config: func(c *Config) { c.MaxElapsed = 2 * time.Second }, attempts: 1, status: 409},
		{name: "MaxElapsed counts the waits", answers: []answer{resp(503), resp(503), resp(503), resp(201)},
			config: func(c *Config) { c.MaxElapsed = time.Second }, attempts: 3, sleeps: s(250*ms, 500*ms), status: 503},
		{name: "MaxElapsed after a cut: the error", answers: []answer{cut(-1)},
			config: func(c *Config) { c.MaxElapsed = 300 * ms }, attempts: 2, sleeps: s(250 * ms)},
		{name: "deadline: a wait past it is not started", answers: []answer{inUse("25"), resp(201)},
			config: func(c *Config) { c.MaxRetryAfter = time.Minute }, deadline: 20 * time.Second, attempts: 1, status: 409},
		{name: "deadline: a wait ending on it is not started", answers: []answer{inUse("20"), resp(201)},
			config: func(c *Config) { c.MaxRetryAfter = time.Minute }, deadline: 20 * time.Second, attempts: 1, status: 409},
		{name: "deadline: a wait before it is", answers: []answer{inUse("5"), created},
			deadline: 20 * time.Second, attempts: 2, sleeps: s(5 * time.Second), status: 201, replayed: true},
		{name: "context canceled during the wait", answers: []answer{resp(503), resp(201)}, cancelOnSleep: true,
			attempts: 1, sleeps: s(250 * ms), errIs: context.Canceled},
		{name: "context canceled during the attempt", answers: []answer{cut(-1), resp(201)}, cancelInAttempt: true,
			attempts: 1},
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			start := clock.Now()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.deadline > 0 {
				ctx, cancel = context.WithDeadline(ctx, start.Add(tc.deadline))
				defer cancel()
			}
			answers := slices.Clone(tc.answers)
			for i, a := range answers {
				if v := a.header.Get("Retry-After"); strings.HasPrefix(v, "DATE") {
					d, _ := time.ParseDuration(strings.TrimPrefix(v, "DATE"))
					a.header = a.header.Clone()
					a.header.Set("Retry-After", start.Add(d).UTC().Format(http.TimeFormat))
					answers[i] = a
				}
			}
			if tc.cancelInAttempt {
				answers[0].hook = cancel
			}
			if tc.cancelOnSleep {
				clock.onSleep = cancel
			}
			base := &scripted{t: t, answers: answers}
			cfg := testConfig(clock, base)
			if tc.config != nil {
				tc.config(&cfg)
			}
			rt, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://example.test/payments", strings.NewReader(`{"amount":1}`))
			res, err := rt.RoundTrip(req)

			key := oneKey(t, base.Keys())
			if n := len(base.Keys()); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			for i, b := range base.Bodies() {
				if a := answers[min(i, len(answers)-1)]; a.readBody < 0 && b != `{"amount":1}` {
					t.Errorf("attempt %d sent body %q", i+1, b)
				}
			}
			if got := clock.Sleeps(); !slices.Equal(got, tc.sleeps) {
				t.Errorf("waits %v, want %v", got, tc.sleeps)
			}
			if tc.status == 0 {
				var e *Error
				if err == nil || !errors.As(err, &e) {
					t.Fatalf("got %v, %v; want an *Error", res, err)
				}
				if e.Key != key || e.Attempts != tc.attempts {
					t.Errorf("Error key %q attempts %d, want %q %d", e.Key, e.Attempts, key, tc.attempts)
				}
				if tc.errIs != nil && !errors.Is(err, tc.errIs) {
					t.Errorf("error %v is not %v", err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v, want status %d", err, tc.status)
			}
			defer res.Body.Close()
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
			}
			// The answer returned keeps its whole body, also after its
			// problem type was read.
			body, _ := io.ReadAll(res.Body)
			if want := answers[min(tc.attempts-1, len(answers)-1)].body; string(body) != want {
				t.Errorf("body %q, want %q", body, want)
			}
			info, ok := Info(res)
			if !ok || info != (Result{Key: key, Attempts: tc.attempts, Replayed: tc.replayed}) {
				t.Errorf("Info = %+v, %v; want key %q, %d attempts, replayed %v", info, ok, key, tc.attempts, tc.replayed)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{" 7 ", 7 * time.Second, true},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sunday, 01-Mar-26 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Sun Mar  1 12:00:30 2026", 30 * time.Second, true},       // asctime
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true},
		{"1.5", 0, false},
		{"+3", 0, false},
		{"-3", 0, false},
		{"3s", 0, false},
		{"tomorrow", 0, false},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", 1<<63 - 1, true},
		{"99999999999999999999999", 1<<63 - 1, true},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestAnswerBodyRead: the answer returned is read into memory when its
// Content-Length allows, whole also when a Base's body runs past it; a
// body cut short of it is an attempt's error, retried.
func TestAnswerBodyRead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		length   int64
		limit    int64
		attempts int
		want     string
	}{
		{name: "as announced", body: "0123456789", length: 10, attempts: 1, want: "0123456789"},
		{name: "longer than announced", body: "0123456789abc", length: 10, attempts: 1, want: "0123456789abc"},
		{name: "empty", body: "", length: 0, attempts: 1, want: ""},
		{name: "no Content-Length: a stream, unread", body: "0123456789", length: -1, attempts: 1, want: "0123456789"},
		{name: "over MaxBufferedResponse: unread", body: "0123456789", length: 10, limit: 5, attempts: 1, want: "0123456789"},
		{name: "shorter than announced: retried", body: "01234", length: 10, attempts: DefaultMaxAttempts, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls int
			base := rtFunc(func(r *http.Request) (*http.Response, error) {
				calls++
				return &http.Response{StatusCode: 201, Header: http.Header{}, ContentLength: tc.length, Request: r,
					Body: io.NopCloser(strings.NewReader(tc.body))}, nil
			})
			cfg := testConfig(newFakeClock(), base)
			cfg.MaxBufferedResponse = tc.limit
			rt, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("POST", "http://example.test/", nil)
			res, err := rt.RoundTrip(req)
			if calls != tc.attempts {
				t.Errorf("%d attempts, want %d", calls, tc.attempts)
			}
			if tc.want == "" && tc.length > int64(len(tc.body)) {
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("%v, want io.ErrUnexpectedEOF", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, inMemory := res.Body.(*memBody)
			if b, _ := io.ReadAll(res.Body); string(b) != tc.want || inMemory != (tc.length >= 0 && tc.limit == 0) {
				t.Errorf("body %q (in memory %v), want %q", b, inMemory, tc.want)
			}
		})
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
