package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// Defaults applied by New to zero Config fields, and the limits New checks.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultRequestIDHeader  = "X-Request-Id"
	DefaultRequestTimeout   = 30 * time.Second
	DefaultRetention        = 24 * time.Hour
	DefaultMaxResponseBytes = 1 << 20
	DefaultStoreTimeout     = 5 * time.Second
	// DefaultMaxBodyBytes is the largest request body fingerprinted
	// unless Config says otherwise.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxKeyLength is the longest key accepted unless Config says
	// otherwise.
	DefaultMaxKeyLength = 255
	// DefaultMaxWaiters and DefaultMaxWaitersPerPrincipal cap the
	// requests that wait for their key's holder (Config.WaitInFlight).
	DefaultMaxWaiters             = 1000
	DefaultMaxWaitersPerPrincipal = 100
	// MinFingerprintKeyBytes is the shortest Config.FingerprintKey New
	// accepts: 32 bytes, the strength of HMAC-SHA-256 itself.
	MinFingerprintKeyBytes = 32

	// ReplayedHeader is set to "true" on every replayed response.
	ReplayedHeader = "Idempotent-Replayed"
)

// The response headers New knows by name.
var (
	// DefaultStoredHeaders is the response header allow-list used when
	// Config.StoredHeaders is nil. Set-Cookie is deliberately absent: a
	// replay must not hand one client's session to another attempt.
	DefaultStoredHeaders = []string{"Content-Type", "Location", "Content-Language", "Cache-Control"}
	// SensitiveHeaders are the response headers StoredHeaders may name
	// only with Config.AllowSensitiveStoredHeaders: they carry a session
	// or a credential, which a replay would hand to another attempt.
	SensitiveHeaders = []string{"Set-Cookie", "Authorization", "Proxy-Authorization"}
)

func isSensitiveHeader(name string) bool {
	for _, s := range SensitiveHeaders {
		if strings.EqualFold(strings.TrimSpace(name), s) {
			return true
		}
	}
	return false
}

// Disposition is what happens to a handler's outcome.
type Disposition int

const (
	// Complete stores the response as StateCompleted and commits.
	Complete Disposition = iota + 1
	// Fail stores the response as StateFailed and commits: a deterministic
	// client error that a retry would only repeat.
	Fail
	// Release rolls back and releases the claim: the retry really retries.
	Release
)

// Classifier decides the disposition of a handler's outcome from its status
// and the error the handler returned (nil when it returned none).
type Classifier func(status int, err error) Disposition

// DefaultClassifier completes 2xx and 3xx, fails other 4xx, and releases
// 5xx, 408 Request Timeout, 425 Too Early, 429 Too Many Requests and every
// outcome with a handler error: those are transient, and a retry must run
// the handler again.
func DefaultClassifier(status int, err error) Disposition {
	switch {
	case err != nil:
		return Release
	case status >= 200 && status < 400:
		return Complete
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return Release
	case status >= 400 && status < 500:
		return Fail
	default:
		return Release
	}
}

// StatusClassifier decides by status: like DefaultClassifier, except that a
// handler error rendered as a deterministic 4xx is stored (Fail) instead of
// released. Use it when handlers report client errors as returned errors
// (echo.NewHTTPError(400, …), fiber.NewError(400, …),
// c.AbortWithError(400, …)) and those should be replayed like a written 400.
// A handler error with a 2xx or 3xx status is still released: an error is
// never stored as a success.
func StatusClassifier(status int, err error) Disposition {
	if err != nil && status < 400 {
		return Release
	}
	return DefaultClassifier(status, nil)
}

// ReplayAuthorizer re-checks, before a stored response is replayed, that
// the principal may still see it. A non-nil error answers 403 and replays
// nothing.
type ReplayAuthorizer func(ctx context.Context, principal string, rec Record) error

// Reconciler is asked, right after the engine has taken over a stale
// in-progress record (its holder crashed or hung past the lease, or its
// outcome is unknown: Record.Uncertain), what became of the previous
// attempt's effects. The caller holds the new lease, so no other attempt
// runs meanwhile. Returning a non-nil Response stores it as completed and
// replays it instead of running the handler again; returning nil says the
// previous attempt had no effect, and runs the handler. An error, or an
// answer that cannot be stored, or any failure before the answer is
// stored, keeps the claim (Store.Keep), never releases it: the effect is
// still unknown, and a released key would let the next retry run the
// handler without asking. The next retry takes it over at once and asks
// again. The Sweeper asks it too, for the stale claims no client retries
// (see Sweeper).
//
// Without a Reconciler, a record whose outcome is unknown is never run
// again: its retries are answered 409 outcome-unknown until an operator
// resolves it (idemctl), while a claim whose holder simply died (its
// transaction rolled back with it) is taken over and run.
type Reconciler func(ctx context.Context, stale Record) (*Response, error)

// Config configures an Engine. Zero fields take the documented defaults;
// New rejects inconsistent values.
type Config struct {
	// Store keeps the records. Required.
	Store idemstore.

		// FingerprintKey is the secret the request fingerprints are MACed with
		// (HMAC-SHA-256, see idemadapter.Fingerprint): at least MinFingerprintKeyBytes
		// random bytes, such as `openssl rand -hex 32` read from a secret
		// store. Required: there is no default and no unkeyed mode, because an
		// unkeyed fingerprint gives a stored request's small fields (an amount,
		// a CVV) back to anyone who can read the table, and a key generated at
		// start-up would differ between instances and restarts, so every retry
		// that reached another instance would get 422. Every instance sharing
		// a store needs the same key.
		Store

	FingerprintKey []byte
	// PreviousFingerprintKeys are keys FingerprintKey replaced. A record
	// fingerprinted under one of them still matches the same request (its
	// retry replays, or takes over its stale claim) and still refuses
	// another (422). New records use FingerprintKey only. To rotate, move
	// the old key here, deploy, and remove it once Retention has passed
	// since every instance runs with the new key: no record made under it
	// is left by then.
	PreviousFingerprintKeys [][]byte

	// Header is the request header carrying the key. Default
	// "Idempotency-Key".
	Header string
	// KeyOptional lets requests without a key through without idempotency.
	// By default a missing key is a 400.
	KeyOptional bool
	// MaxKeyLength bounds the key, 1 to MaxKeyLengthLimit. Default 255.
	MaxKeyLength int
	// MaxBodyBytes bounds the request body read for the fingerprint; a
	// larger body gets 413. Default 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes bounds the stored response body; a larger response
	// is rolled back and answered with a 500 problem. Default 1 MiB.
	MaxResponseBytes int
	// RequestTimeout is the handler's deadline. Default 30s.
	RequestTimeout time.Duration
	// Lease is how long a claim is honoured before another attempt may
	// take it over. It must exceed RequestTimeout plus StoreTimeout, so a
	// live handler is never taken over. Default RequestTimeout +
	// StoreTimeout + 5s.
	Lease time.Duration
	// StoreTimeout bounds each store call made on the request's behalf:
	// the claim and the start of the transaction (with their wait for a
	// pool connection: an exhausted pool answers 503 store-unavailable
	// with a Retry-After after StoreTimeout, instead of queueing), and
	// after the handler the settle, commit and release, which run even
	// when the client has gone away. Default 5s.
	StoreTimeout time.Duration
	// Retention is how long settled records are kept and replayed, and
	// released ones kept for their nonce (see DownstreamKey), counted from
	// the claim. It must be at least twice Lease: a claim whose holder
	// crashed must stay takeover-able (and Reconcile be asked) for at least
	// a lease after it went stale, not expire and let a retry run afresh.
	// Default 24h.
	Retention time.Duration
	// DurableClaims makes every claim durable before the handler runs.
	// The PostgreSQL stores otherwise commit a claim asynchronously, which
	// saves a WAL flush per first request: a database crash in the next
	// few hundred milliseconds can take the claim back, and the retry then
	// claims the key afresh instead of taking it over, so Reconcile is not
	// asked. Nothing stored is lost by that (the handler's transaction
	// rolls back with the crash), and DownstreamKey makes the claim durable
	// itself before it hands out a key. Set DurableClaims when a handler
	// has effects outside the database that do not go through
	// DownstreamKey, or use Call.DurableClaim for one call. Stores whose
	// claims are always durable ignore it.
	DurableClaims bool
	// StoredHeaders is the allow-list of response headers stored and
	// replayed. Default DefaultStoredHeaders. New refuses Set-Cookie,
	// Authorization and Proxy-Authorization (SensitiveHeaders) unless
	// AllowSensitiveStoredHeaders is set.
	StoredHeaders []string
	// AllowSensitiveStoredHeaders lets StoredHeaders name Set-Cookie,
	// Authorization or Proxy-Authorization. It is dangerous: a replay hands
	// the stored value to whoever retries with the key, so one attempt's
	// session cookie or credential becomes the next attempt's, and the
	// value sits in the store for Retention. Set it only when the value is
	// not a credential (a cookie the client may share across attempts) and
	// say why at the call site.
	AllowSensitiveStoredHeaders bool
	// IgnoreFields lists JSON members left out of the fingerprint, such as
	// a per-attempt timestamp ("sent_at", "meta.sent_at").
	IgnoreFields []string
	// RequestIDHeader names the header whose value is stored as the
	// original request id. Default "X-Request-Id".
	RequestIDHeader string
	// Classify decides which outcomes are stored. Default DefaultClassifier.
	Classify Classifier
	// AuthorizeReplay, when set, is asked before every replay.
	AuthorizeReplay ReplayAuthorizer
	// Reconcile, when set, is asked after a stale claim is taken over.
	Reconcile Reconciler
	// Observer receives one Event per request. Optional.
	Observer Observer
	// Logger, when set, logs one line per request with its outcome. When
	// it is nil, the outcomes an operator must see (a store error, a
	// misconfigured store, a transaction the handler ended, an
	// authentication error) still go to slog.Default().
	Logger *slog.Logger
	// LogKeys logs the raw idempotency key in the engine's log line. By
	// default the line carries only key_hash, the first 16 hex digits of
	// SHA-256 over the principal and the key, enough to correlate the lines
	// of one key: a key is a client's secret-ish handle on its request, and
	// logs are read by more people than the database. Event.Key always
	// carries the raw key.
	LogKeys bool
	// AllowTxUnused turns off the warning the engine logs when a handler
	// answers 2xx without having used the store's transaction: its writes,
	// if any, went around the guarantee (through the pool instead of the
	// transaction), and a retry after a failure writes them again. Set it
	// for an engine whose handlers write nothing in the store's
	// transaction on purpose. Event.TxUsed says the same for every
	// request either way.
	AllowTxUnused bool
	// OmitStoredBody stores the status and the allow-listed headers of a
	// response, not its body, for endpoints whose clients re-read the
	// resource (at its Location) instead of relying on the replayed body.
	// A replay then sends the stored status and headers with an empty
	// body (Content-Length: 0) and Idempotent-Replayed: true; the first
	// response is sent whole. It keeps what the body echoes (amounts,
	// descriptions, card digits) out of the store altogether.
	OmitStoredBody bool
	// BodySealer, when set, seals every stored body at settle and opens it
	// at replay (see BodySealer). A body that does not open is never
	// replayed: the request is answered 500 replay-unreadable. Records
	// stored before a sealer was configured do not open either, unless the
	// sealer recognises them; they expire after Retention.
	BodySealer BodySealer
	// MaxInFlightPerPrincipal bounds the idempotent requests one principal
	// may have in flight at once, from the key check to the end of the
	// attempt; one more is answered 429 too-many-in-flight with a
	// Retry-After, before its body is read and before anything is claimed.
	// Default 0: no limit.
	//
	// It exists for the pool arithmetic. On a SQL store every claimed
	// request holds one pool connection for its handler's whole run, so
	// with a pool of P connections one principal sending P slow requests
	// holds them all, and every other principal's request waits for one
	// (StoreTimeout bounds that wait, then answers 503). With a limit L < P
	// one principal holds at most L connections and P-L stay for the
	// others; k principals at their limit hold k*L. Choose L so the
	// principals you expect to be busy at once leave connections for the
	// rest (a pool of 10 and L = 4: two busy principals still leave 2). The
	// count is per Engine, that is per process: with N instances a
	// principal may have N*L in flight against the database.
	MaxInFlightPerPrincipal int
	// WaitInFlight is how long a request whose key is held by another
	// attempt still in flight (in progress under a live lease) waits for
	// that attempt to end, instead of being answered 409 at once. Once the
	// holder settles, the waiting request gets what a later retry would:
	// the stored response replayed (Idempotent-Replayed: true), or the 422
	// of a key reused with another request; once the holder releases the
	// key (a 5xx, an error), one waiting request claims it and runs, and
	// the others wait for that one. At the bound the request is answered
	// 409 with Retry-After, as without a wait, and a client that goes away
	// ends its wait. A waiting request holds no database connection, no
	// transaction and no lock: it is woken by the engine's own attempt on
	// the key, by the store's notifications when the store is an
	// idemstore.Notifier (across instances), and by polling the store
	// (25 ms, doubling to 500 ms), so a lost notification costs latency,
	// never the answer. Default 0: no wait. It must be below Lease.
	WaitInFlight time.Duration
	// RouteWaitInFlight sets WaitInFlight per route, by the route label of
	// the request (Request.Route: the framework's route template) or of the
	// call (Call.Route); 0 turns the wait off on that route. Each value
	// must be below Lease. Call.WaitInFlight overrides both.
	RouteWaitInFlight map[string]time.Duration
	// MaxWaiters bounds the requests of this engine waiting at once (see
	// WaitInFlight); one more is answered 409 with Retry-After at once.
	// Default DefaultMaxWaiters.
	MaxWaiters int
	// MaxWaitersPerPrincipal bounds the waiting requests of one principal
	// in this engine, so that one client retrying in a loop cannot take
	// every place. Default DefaultMaxWaitersPerPrincipal.
	MaxWaitersPerPrincipal int
	// Clock measures latencies. Default time.Now. Expiry and leases always
	// use the store's clock.
	Clock func() time.Time
	// SkipStoreCheck keeps New from calling the store's Check (see
	// idemstore.Checker): New then never touches the store, and a store without its
	// table fails at the first request instead, with 500
	// store-misconfigured. Set it when the application checks the store
	// itself, or when New runs where the store must not be reached (a
	// tool that only reads the configuration).
	SkipStoreCheck bool
}

func (c *Config) setDefaults() {
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = DefaultMaxKeyLength
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.Lease == 0 {
		c.Lease = c.RequestTimeout + c.StoreTimeout + 5*time.Second
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = DefaultStoredHeaders
	}
	if c.RequestIDHeader == "" {
		c.RequestIDHeader = DefaultRequestIDHeader
	}
	if c.Classify == nil {
		c.Classify = DefaultClassifier
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	if c.MaxWaitersPerPrincipal == 0 {
		c.MaxWaitersPerPrincipal = DefaultMaxWaitersPerPrincipal
	}
}

// waits reports whether any request may wait for its key's holder by
// configuration (WaitInFlight, RouteWaitInFlight).
func (c *Config) waits() bool {
	if c.WaitInFlight > 0 {
		return true
	}
	for _, d := range c.RouteWaitInFlight {
		if d > 0 {
			return true
		}
	}
	return false
}

func (c *Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Store != nil, "Store is required")
	check(len(c.FingerprintKey) >= MinFingerprintKeyBytes,
		"FingerprintKey is required: at least %d secret random bytes, the same on every instance (got %d)", MinFingerprintKeyBytes, len(c.FingerprintKey))
	for i, k := range c.PreviousFingerprintKeys {
		check(len(k) >= MinFingerprintKeyBytes, "PreviousFingerprintKeys[%d] must be at least %d bytes, got %d", i, MinFingerprintKeyBytes, len(k))
	}
	check(c.MaxKeyLength > 0 && c.MaxKeyLength <= idemstore.MaxKeyLengthLimit,
		"MaxKeyLength must be 1 to %d (what every store's index holds), got %d", idemstore.MaxKeyLengthLimit, c.MaxKeyLength)
	check(c.MaxBodyBytes > 0, "MaxBodyBytes must be positive, got %d", c.MaxBodyBytes)
	check(c.MaxResponseBytes > 0, "MaxResponseBytes must be positive, got %d", c.MaxResponseBytes)
	check(c.RequestTimeout > 0, "RequestTimeout must be positive, got %v", c.RequestTimeout)
	check(c.StoreTimeout > 0, "StoreTimeout must be positive, got %v", c.StoreTimeout)
	check(c.MaxInFlightPerPrincipal >= 0, "MaxInFlightPerPrincipal must not be negative, got %d", c.MaxInFlightPerPrincipal)
	check(c.Lease > c.RequestTimeout+c.StoreTimeout,
		"Lease (%v) must exceed RequestTimeout + StoreTimeout (%v), or a live handler could be taken over",
		c.Lease, c.RequestTimeout+c.StoreTimeout)
	check(c.Retention >= 2*c.Lease,
		"Retention (%v) must be at least twice Lease (%v), so that a stale claim can still be taken over (and Reconcile asked) for a lease after it goes stale, instead of expiring and running afresh",
		c.Retention, c.Lease)
	check(c.WaitInFlight >= 0 && c.WaitInFlight < c.Lease,
		"WaitInFlight (%v) must be 0 (no wait) or positive and below Lease (%v)", c.WaitInFlight, c.Lease)
	for route, d := range c.RouteWaitInFlight {
		check(d >= 0 && d < c.Lease, "RouteWaitInFlight[%q] (%v) must be 0 (no wait) or positive and below Lease (%v)", route, d, c.Lease)
	}
	check(c.MaxWaiters > 0, "MaxWaiters must be positive, got %d", c.MaxWaiters)
	check(c.MaxWaitersPerPrincipal > 0, "MaxWaitersPerPrincipal must be positive, got %d", c.MaxWaitersPerPrincipal)
	check(http.CanonicalHeaderKey(c.Header) != "", "Header must be a header name")
	for _, h := range c.StoredHeaders {
		check(h != "", "StoredHeaders must not contain an empty name")
		check(c.AllowSensitiveStoredHeaders || !isSensitiveHeader(h),
			"StoredHeaders names %s: a replay would hand one attempt's session or credential to the next (set AllowSensitiveStoredHeaders to allow it)", h)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// checkStore asks the store to check itself (see idemstore.Checker), unless
// SkipStoreCheck is set. Only a misconfiguration is an error: anything
// else is logged at Warn.
func (c *Config) checkStore() error {
	ch, ok := c.Store.(idemstore.Checker)
	if c.SkipStoreCheck || !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.StoreTimeout)
	defer cancel()
	err := ch.Check(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrMisconfigured):
		return fmt.Errorf("%w: the store's check failed (run the store's Migrate, or apply its migration): %w", ErrInvalidConfig, err)
	}
	c.logger().LogAttrs(context.Background(), slog.LevelWarn,
		"idempotency: the store's start-up check could not finish; starting anyway, and requests are answered 503 store-unavailable until the store answers",
		slog.String("error", err.Error()))
	return nil
}

// logger is Logger, or slog.Default() when it is nil: for what an operator
// must see whether or not the application configured a Logger.
func (c *Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}
