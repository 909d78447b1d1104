package idemclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultHeader              = "Idempotency-Key"
	DefaultMaxAttempts         = 8
	DefaultMaxElapsed          = 60 * time.Second
	DefaultBaseDelay           = 250 * time.Millisecond
	DefaultMaxDelay            = 5 * time.Second
	DefaultMaxRetryAfter       = 10 * time.Second
	DefaultMaxBufferedBody     = 1 << 20
	DefaultMaxBufferedResponse = 1 << 20
)

// DefaultMethods are the methods a Transport gives a key and retries when
// Config.Methods is nil: POST and PATCH, the ones HTTP does not make
// idempotent by definition.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// Config configures a Transport. Zero fields take the documented defaults;
// New rejects inconsistent values. The functions in it are called by every
// request, concurrently when requests run at once.
type Config struct {
	// Base sends each attempt. Default http.DefaultTransport.
	Base http.RoundTripper
	// Header is the request header that carries the key. Default
	// "Idempotency-Key" (the IETF draft's name, and Stripe's).
	Header string
	// Methods are the request methods that get a key and are retried;
	// requests with other methods go to Base unchanged, once. Default
	// DefaultMethods (POST, PATCH). Methods are matched exactly, as HTTP
	// does ("post" is not "POST").
	Methods []string
	// NewKey returns a fresh key for a request that carries none. It is
	// called once per request, before the first attempt, never per attempt;
	// its result must be 1 to 255 visible ASCII characters. Default
	// NewKey (a random UUIDv4). A server that wants the key as an RFC 9651
	// string ("…") can be given strconv.Quote(NewKey()).
	NewKey func() string
	// MaxAttempts bounds the attempts per request, the first one included;
	// 1 turns retries off. Default 8: with the default MaxElapsed, enough
	// to outlast the default lease of an idem server (40 s), so that a
	// request whose server crashed mid-way reaches the takeover with its
	// key instead of giving up on 409 key-in-use.
	MaxAttempts int
	// MaxElapsed is the time budget of a request: no wait is started that
	// would end later than MaxElapsed after the request began. A running
	// attempt is not cut by it; bound that with the request's context or
	// http.Client.Timeout. Default 60s, longer than an idem server's
	// default lease (RequestTimeout 30 s + StoreTimeout 5 s + 5 s). Against
	// a server with a longer lease, raise it past that lease, or resume
	// later with the same key (Info reports it; WithKey sends it again).
	MaxElapsed time.Duration
	// BaseDelay is the backoff ceiling before the first retry; it doubles
	// with every retry up to MaxDelay, and the wait is drawn uniformly
	// between zero and the ceiling (full jitter). Default 250ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling. Default 5s.
	MaxDelay time.Duration
	// MaxRetryAfter caps a server's Retry-After: a longer one is waited for
	// MaxRetryAfter only. Default 10s.
	MaxRetryAfter time.Duration
	// MaxBufferedBody is the largest request body without GetBody that is
	// read into memory before the first attempt so that it can be sent
	// again. A request whose body has no GetBody and is larger is sent once
	// and never retried: a body that cannot be replayed is never resent
	// half-sent. A negative value buffers nothing. Default 1 MiB. (Bodies
	// made by http.NewRequest from a *bytes.Buffer, *bytes.Reader or
	// *strings.Reader have GetBody and are never buffered.)
	MaxBufferedBody int64
	// MaxBufferedResponse is the largest answer body, by its
	// Content-Length, that is read to the end before RoundTrip returns the
	// answer. A connection cut in the middle of such a body is then retried
	// like any other cut, and the retry gets the stored response, instead
	// of the caller's read failing after the server has committed. Answers
	// without a Content-Length (streams) or with a larger one are returned
	// unread. A negative value reads none. Default 1 MiB.
	MaxBufferedResponse int64
	// Now is the clock for Retry-After dates, MaxElapsed and the context's
	// deadline. Default time.Now.
	Now func() time.Time
	// Sleep waits d, or until ctx is done, when it returns ctx's error.
	// Default a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Jitter draws a backoff wait from [0, ceiling]. Default uniform (full
	// jitter); a result outside the range is clamped into it.
	Jitter func(ceiling time.Duration) time.Duration
}

// ErrInvalidConfig is wrapped by every error New returns.
var ErrInvalidConfig = errors.New("idemclient: invalid config")

func (c *Config) setDefaults() {
	if c.Base == nil {
		c.Base = http.DefaultTransport
	}
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.Methods == nil {
		c.Methods = DefaultMethods
	}
	c.Methods = append([]string(nil), c.Methods...) // the caller's slice may change later
	if c.NewKey == nil {
		c.NewKey = NewKey
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxElapsed == 0 {
		c.MaxElapsed = DefaultMaxElapsed
	}
	if c.BaseDelay == 0 {
		c.BaseDelay = DefaultBaseDelay
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = max(DefaultMaxDelay, c.BaseDelay)
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.MaxBufferedBody == 0 {
		c.MaxBufferedBody = DefaultMaxBufferedBody
	}
	if c.MaxBufferedResponse == 0 {
		c.MaxBufferedResponse = DefaultMaxBufferedResponse
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	if c.Jitter == nil {
		c.Jitter = fullJitter
	}
}

func (c *Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(isToken(c.Header), "Header must be a header name (an HTTP token), got %q", c.Header)
	check(len(c.Methods) > 0, "Methods must name at least one method")
	for _, m := range c.Methods {
		check(isToken(m), "Methods must be HTTP methods (tokens), got %q", m)
	}
	check(c.MaxAttempts > 0, "MaxAttempts must be positive, got %d", c.MaxAttempts)
	check(c.MaxElapsed > 0, "MaxElapsed must be positive, got %v", c.MaxElapsed)
	check(c.BaseDelay > 0, "BaseDelay must be positive, got %v", c.BaseDelay)
	check(c.MaxDelay >= c.BaseDelay, "MaxDelay (%v) must be at least BaseDelay (%v)", c.MaxDelay, c.BaseDelay)
	check(c.MaxRetryAfter > 0, "MaxRetryAfter must be positive, got %v", c.MaxRetryAfter)
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// isToken reports whether s is an RFC 9110 token: what header names and
// methods are made of.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c < 0x80 && c > ' ' && c != 0x7f && !isSeparator(c):
		default:
			return false
		}
	}
	return true
}

func isSeparator(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}

// sleep is the default Config.Sleep.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fullJitter is the default Config.Jitter: uniform in [0, max].
func fullJitter(ceiling time.Duration) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling + 1)
}
