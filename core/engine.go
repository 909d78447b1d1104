package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
	"github.com/idemgo/idem/core/internal/jsoncanon"
	"github.com/idemgo/idem/core/internal/wire"
)

// Engine runs the idempotency state machine for one configuration. An
// application builds one with New and hands it to its framework adapter's
// middleware, the Sweeper and Engine.Do. An Engine is safe for concurrent
// use.
type Engine struct {
	cfg         Config
	stored      map[string]bool   // canonical header names in the allow-list
	ignore      [][]string        // Config.IgnoreFields, split once
	fpKey       *fingerprintKey   // Config.FingerprintKey, prepared
	fpPrevious  []*fingerprintKey // Config.PreviousFingerprintKeys, prepared
	clockIsWall bool              // Config.Clock was left to default to time.Now
	holds       holdTimes         // per route, how long attempts held their key (retryAfter)
	// keyMissing and keyInvalid name the configured header and limit.
	keyMissing, keyInvalid Problem
	// inFlight is Config.MaxInFlightPerPrincipal's limiter, nil when off.
	inFlight *inFlightLimiter
	// sawAnonymous is set by the first request without a principal, which
	// is logged (see emit); sawStream by the first streamed response.
	sawAnonymous, sawStream atomic.Bool
	// waits are the requests waiting for their key's holder
	// (Config.WaitInFlight); subOnce subscribes the engine to the store's
	// notifications, and unsubscribe ends that (Close).
	waits       *waitRoom
	subOnce     sync.Once
	subMu       sync.Mutex
	unsubscribe func()
}

// New validates cfg, applies defaults, checks the store and returns an
// Engine. It returns an error wrapping ErrInvalidConfig when the
// configuration is inconsistent.
//
// When cfg.Store is a Checker and cfg.SkipStoreCheck is not set, New calls
// its Check with a context bounded by cfg.StoreTimeout. An error wrapping
// ErrMisconfigured (a missing table, column or permission) fails New with
// an error wrapping both ErrInvalidConfig and ErrMisconfigured, so a store
// that was never migrated is found at start-up rather than by the first
// request. Any other error, such as a database that does not answer yet,
// is logged once at Warn (through cfg.Logger, or slog.Default() when it is
// nil) and New returns the Engine: the store is asked again by every
// request.
//
// Build one Engine per configuration and share it: every adapter's
// middleware or interceptor, the Sweeper and Engine.Do take it, and the
// per-route hold times and the in-flight limit are the Engine's own.
func New(cfg Config) (*Engine, error) {
	wall := cfg.Clock == nil
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := cfg.checkStore(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, stored: make(map[string]bool, len(cfg.StoredHeaders)), ignore: jsoncanon.SplitPaths(cfg.IgnoreFields), clockIsWall: wall}
	for _, h := range cfg.StoredHeaders {
		e.stored[http.CanonicalHeaderKey(h)] = true
	}
	e.fpKey = newFingerprintKey(cfg.FingerprintKey)
	for _, k := range cfg.PreviousFingerprintKeys {
		e.fpPrevious = append(e.fpPrevious, newFingerprintKey(k))
	}
	e.inFlight = newInFlightLimiter(cfg.MaxInFlightPerPrincipal)
	e.waits = newWaitRoom(cfg.MaxWaiters, cfg.MaxWaitersPerPrincipal)
	if cfg.waits() {
		e.subscribe()
	}
	e.keyMissing = NewProblem(ProblemKeyMissing)
	e.keyMissing.Detail = fmt.Sprintf("This operation requires an %s header.", cfg.Header)
	e.keyInvalid = NewProblem(ProblemKeyInvalid)
	e.keyInvalid.Detail = fmt.Sprintf("The %s header must be one field line holding 1 to %d visible ASCII characters, bare or as a quoted string; a key with a comma or semicolon must be quoted.",
		cfg.Header, cfg.MaxKeyLength)
	return e, nil
}

// Config returns the engine's configuration with defaults applied, without
// its secrets: FingerprintKey and PreviousFingerprintKeys are nil in the
// copy, so that a Config read back for logging or display cannot leak the
// key that keeps stored fingerprints unreadable.
func (e *Engine) Config() Config {
	c := e.cfg
	c.FingerprintKey, c.PreviousFingerprintKeys = nil, nil
	return c
}

// Request is the framework-neutral view of an incoming request, what an
// adapter hands Engine.Begin. It is part of the adapters' entry point (see
// package idemadapter, whose HTTPRequest builds it from an *http.Request);
// applications do not use it.
type Request struct {
	Method string
	// Path is the request target: the escaped path and, if any, "?" and the
	// raw query. It enters the fingerprint.
	Path string
	// Route is the framework's route template that matched ("/payments/:id",
	// "POST /payments/{id}"), or "" when unknown. It only labels the Event,
	// so its cardinality is the application's route count, never the
	// client's.
	Route string
	// Principal is the authenticated caller; empty means not authenticated.
	Principal string
	// PrincipalErr is the error the application's principal function
	// returned, if any. Begin answers it like an empty Principal, 401, and
	// records it in the Event's Err (see idemadapter.Adapter.Principal).
	PrincipalErr error
	// Key is the value of the idempotency key header, its field lines
	// combined as idemadapter.KeyField combines them: "" only when the header is
	// absent. A header present with an empty value must be passed as white
	// space (" "), which Begin answers 400 key-invalid rather than running
	// the handler without a key; several field lines become a list, which
	// is refused the same way.
	Key string
	// ContentType is the request's Content-Type header.
	ContentType string
	// RequestID is the request's id, stored with the record for tracing.
	RequestID string
	// Body is the request body; Begin reads it up to MaxBodyBytes.
	Body io.Reader
	// ContentLength is the declared body length, or -1 when unknown. It
	// only sizes the read buffer; the limit is enforced on what is read.
	ContentLength int64
}

// Result is what the handler produced, as the adapter captured it and hands
// Attempt.Finish (idemadapter.ResponseBuffer.Result builds it). Applications
// do not use it.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
	// Err is the error the handler returned, if its framework has such a
	// thing, even when the framework already rendered it into Status and
	// Body.
	Err error
	// Overflow is true when the handler wrote more than the buffer kept
	// (see idemadapter.ResponseBuffer); the response is then too large to store.
	Overflow bool
	// Streamed is true when the handler flushed or streamed its response
	// (idemadapter.ResponseBuffer.Flush, a body stream): it reached the client whole,
	// after the commit, which the engine logs once.
	Streamed bool
}

// Begin is the adapters' entry point: it authenticates, validates the key,
// fingerprints the body and claims the key. Adapters built on net/http call
// it through idemadapter.HandleHTTP; applications do not call it. It
// returns exactly one of:
//   - an Attempt: the caller holds the key and must run the handler with
//     Attempt.Context and Attempt.Body, then call Attempt.Finish (and
//     defer Attempt.Abort for panics);
//   - a Response to write as it is: a problem, a 409, a 422 or a replay;
//   - neither (nil, nil): the key is optional and absent, so the handler
//     runs without idempotency.
//
// Begin is the call API's entry (see Engine.Do) with an HTTP request as the
// call: method and path name the operation, the Content-Type the encoding,
// and the body, read after authentication and key validation, is the input.
func (e *Engine) Begin(ctx context.Context, req Request) (*Attempt, *Response) {
	c := Call{
		Method: req.Method, Operation: req.Path, Principal: req.Principal, PrincipalErr: req.PrincipalErr,
		Key: req.Key, Encoding: req.ContentType, RequestID: req.RequestID, Route: req.Route,
	}
	a, v, ev := e.start(ctx, &c, func() ([]byte, error) { return wire.ReadBodyHint(req.Body, e.cfg.MaxBodyBytes, req.ContentLength) })
	if a != nil {
		return a, nil
	}
	if v.pass {
		e.emit(ctx, ev)
		return nil, nil
	}
	resp := e.httpResponse(&v)
	if v.outcome == OutcomeReplayed {
		resp = replay(resp)
	}
	ev.Status = resp.Status
	e.emit(ctx, ev)
	return nil, resp
}

// verdict is how the engine answered one call, in no protocol's terms:
// the library's own answer (a problem), or a response that stands (a
// replay, a reconciled outcome, the handler's own). Callers render it in
// their protocol and emit the event with the status they sent.
type verdict struct {
	outcome    OutcomeLabel
	problem    ProblemType     // the library's answer, or "" when resp stands
	retryAfter int             // seconds, with problem
	resp       *Response       // when problem is ""
	stored     idemstore.State // what the record holds after this call, "" when nothing
	err        error
	pass       bool // the key is optional and absent: run without idempotency
}

// httpResponse renders v as an HTTP response.
func (e *Engine) httpResponse(v *verdict) *Response {
	switch v.problem {
	case "":
		if v.outcome == OutcomeReleased && v.resp.Status < 400 {
			// Rolled back: a 2xx here would claim an effect that did not
			// happen.
			p := NewProblem(ProblemCommitFailed)
			p.Title, p.Detail = "Request failed", "The request failed and was rolled back. Retrying is safe."
			return p.Response(0)
		}
		return v.resp
	case ProblemKeyMissing:
		return e.keyMissing.Response(0)
	case ProblemKeyInvalid:
		return e.keyInvalid.Response(0)
	}
	return NewProblem(v.problem).Response(v.retryAfter)
}

// start is the state machine's entry for every protocol: it authenticates,
// validates the key, fingerprints the call's input and claims the key, then
// dispatches on the claim's answer as the state table of docs/design.md
// does. read, when set, supplies the input after authentication and key
// validation (an HTTP body is read only for a request that may claim). It
// returns an Attempt, which holds the key and carries its own Event, or a
// verdict and the Event to emit once the caller has rendered it.
//
// Every branch calls helpers that answer and return; none calls back into
// start.
func (e *Engine) start(ctx context.Context, c *Call, read func() ([]byte, error)) (*Attempt, verdict, Event) {
	s := starting{e: e, start: e.cfg.Clock(),
		ev: Event{Method: c.Method, Path: c.Operation, Route: c.Route, Principal: c.Principal, RequestID: c.RequestID}}

	// Admission: optional key, principal, key (steps 1 to 3).
	key, keyErr := parseKey(c.Key, e.cfg.MaxKeyLength)
	if errors.Is(keyErr, ErrKeyMissing) && e.cfg.KeyOptional {
		s.ev.Outcome, s.ev.Duration = OutcomeNoKey, e.cfg.Clock().Sub(s.start)
		return nil, verdict{outcome: OutcomeNoKey, pass: true}, s.ev
	}
	if v, refused := s.admit(c, keyErr); refused {
		return nil, v, s.ev
	}
	s.ev.Key = key

	// Bounded resources per caller (step 4): the principal's in-flight slot
	// is held from here; an Attempt returned to the caller owns it.
	var slotOwner *Attempt
	if e.inFlight != nil {
		if !e.inFlight.enter(c.Principal) {
			return nil, s.refuse(OutcomeInFlightLimited, ProblemTooManyInFlight, 1, ErrTooManyInFlight), s.ev
		}
		defer func() {
			if slotOwner == nil {
				e.inFlight.leave(c.Principal)
			} else {
				slotOwner.inFlight = true
			}
		}()
	}

	// Fingerprint (step 5) and claim (step 6).
	a, v, refused := s.read(c, read)
	if refused {
		return nil, v, s.ev
	}
	ans := s.claim(ctx, a, c, key)
	if bound := e.waitBound(c); bound > 0 && ans.inFlight() {
		// The key's holder is in flight and the call may wait for it:
		// holding nothing, until woken, then claim again (step 6a). What
		// follows dispatches on that claim's answer.
		ans = s.wait(ctx, a, c, key, ans, bound)
	}
	lease, res, fp, err := ans.lease, ans.res, ans.fp, ans.err
	s.end = e.cfg.Clock()
	s.ev.ClaimLatency = s.end.Sub(s.claimStart)

	// Dispatch on the claim's answer (steps 7 and 8).
	switch {
	case err != nil:
		p, ra := storeProblem(err)
		return nil, s.refuse(OutcomeStoreError, p, ra, err), s.ev
	case !res.Claimed:
		return nil, s.existing(ctx, c, a, res, fp), s.ev
	}
	if err := s.begin(ctx, a, lease, res); err != nil {
		p, ra := storeProblem(err)
		return nil, s.refuse(OutcomeStoreError, p, ra, err), s.ev
	}
	if res.Reclaimed && e.cfg.Reconcile != nil {
		if v, ev, answered := s.reconcile(ctx, a, res.Record); answered {
			return nil, v, ev
		}
	}
	slotOwner = a
	return a, verdict{}, Event{}
}

// starting is one call's way through start: its Event and its clock
// readings, so that every answer is rendered the same way.
type starting struct {
	e     *Engine
	ev    Event
	start time.Time
	// claimStart and end are the clock readings around the claim: the
	// answers that follow it take no time worth another reading.
	claimStart, end time.Time
	// waitErr is why a wait for the key's holder ended early: the
	// request's context ended.
	waitErr error
}

// refuse fills in the Event of a call answered without running anything
// and returns the verdict.
func (s *starting) refuse(outcome OutcomeLabel, problem ProblemType, retryAfter int, err error) verdict {
	if s.end.IsZero() {
		s.end = s.e.cfg.Clock()
	}
	s.ev.Outcome, s.ev.Err, s.ev.Duration = outcome, err, s.end.Sub(s.start)
	return verdict{outcome: outcome, problem: problem, retryAfter: retryAfter, err: err}
}

// admit refuses a call without a valid principal or key (steps 2 and 3).
func (s *starting) admit(c *Call, keyErr error) (verdict, bool) {
	if c.Principal == "" || c.PrincipalErr != nil {
		return s.refuse(OutcomeUnauthenticated, ProblemUnauthenticated, 0, c.PrincipalErr), true
	}
	if err := checkPrincipal(c.Principal); err != nil {
		return s.refuse(OutcomePrincipalInvalid, ProblemPrincipalInvalid, 0, err), true
	}
	switch {
	case errors.Is(keyErr, ErrKeyMissing):
		return s.refuse(OutcomeKeyMissing, ProblemKeyMissing, 0, nil), true
	case keyErr != nil:
		return s.refuse(OutcomeKeyInvalid, ProblemKeyInvalid, 0, keyErr), true
	}
	return verdict{}, false
}

// read reads the call's input and fingerprints it (step 5), into the
// Attempt that the claim uses and, if it wins, the run: it is allocated
// before the claim so the fingerprint can live in it, one allocation for
// both.
func (s *starting) read(c *Call, read func() ([]byte, error)) (*Attempt, verdict, bool) {
	e := s.e
	body := c.Input
	if read != nil {
		var err error
		if body, err = read(); err != nil {
			if errors.Is(err, wire.ErrBodyTooLarge) {
				return nil, s.refuse(OutcomeBodyTooLarge, ProblemBodyTooLarge, 0, err), true
			}
			// The client sent a body it could not finish: nothing to claim.
			return nil, s.refuse(OutcomeBodyUnreadable, ProblemBodyUnreadable, 0, err), true
		}
	} else if int64(len(body)) > e.cfg.MaxBodyBytes {
		return nil, s.refuse(OutcomeBodyTooLarge, ProblemBodyTooLarge, 0, wire.ErrBodyTooLarge), true
	}
	a := &Attempt{e: e, body: body, start: s.start, classifier: c.Classify, call: read == nil}
	a.fingerprint = e.fpKey.fingerprint(c.Method, c.Operation, c.Principal, c.Encoding, body, e.ignore)
	return a, verdict{}, false
}

// claim claims the key for a (step 6). A record fingerprinted under one of
// Config.PreviousFingerprintKeys is this call's: the store compares
// fingerprints byte for byte, so a stale claim of it is taken over with
// the stored fingerprint, which the record then keeps. fp is the
// fingerprint the record is matched against.
func (s *starting) claim(ctx context.Context, a *Attempt, c *Call, key string) claimAnswer {
	e := s.e
	fp := a.fingerprint[:]
	token, nonce := newTokenAndNonce()
	lease := idemstore.Lease{Principal: c.Principal, Key: key, Token: token}
	creq := idemstore.ClaimRequest{
		Principal: lease.Principal, Key: lease.Key, Fingerprint: fp, Token: lease.Token, Nonce: nonce,
		RequestID: idemstore.BoundRequestID(c.RequestID), Lease: e.cfg.Lease, Retention: e.cfg.Retention,
		TakeOverUncertain: e.cfg.Reconcile != nil, Durable: e.cfg.DurableClaims || c.DurableClaim,
	}
	a.durable = creq.Durable
	s.claimStart = e.cfg.Clock()
	res, err := e.claim(ctx, a, creq, lease)
	if err == nil && !res.Claimed && !bytes.Equal(res.Record.Fingerprint, fp) &&
		e.previousKeyMatches(res.Record.Fingerprint, c, a.body) {
		fp = res.Record.Fingerprint
		if res.Record.State == idemstore.StateInProgress && !res.Now.Before(res.Record.LeaseExpiresAt) {
			creq.Fingerprint = fp
			res, err = e.claim(ctx, a, creq, lease)
		}
	}
	return claimAnswer{lease: lease, res: res, fp: fp, err: err}
}

// existing answers a call whose claim found a record it did not win (step
// 7): another request's (422), one whose outcome is unknown (409), one in
// progress (409 with Retry-After), or a settled one, which is replayed.
func (s *starting) existing(ctx context.Context, c *Call, a *Attempt, res idemstore.ClaimResult, fp []byte) verdict {
	e, rec := s.e, res.Record
	switch {
	case !bytes.Equal(rec.Fingerprint, a.fingerprint[:]) && !bytes.Equal(rec.Fingerprint, fp):
		return s.refuse(OutcomeFingerprintMismatch, ProblemKeyReused, 0, nil)
	case rec.State == idemstore.StateInProgress && rec.Uncertain && !res.Now.Before(rec.LeaseExpiresAt):
		// An attempt's work may have committed without its outcome, and
		// no Reconcile is set to ask: never run it again.
		return s.refuse(OutcomeUnknown, ProblemOutcomeUnknown, 0, ErrOutcomeUnknown)
	case rec.State == idemstore.StateInProgress || rec.Response == nil:
		return s.refuse(OutcomeInProgressConflict, ProblemKeyInUse, e.retryAfter(c.Route, rec.LockedAt, res.Now), s.waitErr)
	}
	if e.cfg.AuthorizeReplay != nil {
		if err := e.cfg.AuthorizeReplay(ctx, c.Principal, rec); err != nil {
			return s.refuse(OutcomeReplayForbidden, ProblemForbidden, 0, err)
		}
	}
	s.ev.OriginalRequestID = rec.RequestID
	// Data at rest: a sealed body is opened, or nothing is replayed.
	if err := e.openStored(ctx, &rec); err != nil {
		return s.refuse(OutcomeReplayUnreadable, ProblemReplayUnreadable, 0, err)
	}
	s.ev.Outcome, s.ev.Duration = OutcomeReplayed, s.end.Sub(s.start)
	return verdict{outcome: OutcomeReplayed, resp: rec.Response, stored: rec.State}
}

// begin begins the handler's transaction for a claim a won (step 8) and
// starts the handler's deadline; on failure the claim is released.
func (s *starting) begin(ctx context.Context, a *Attempt, lease idemstore.Lease, res idemstore.ClaimResult) error {
	e := s.e
	a.lease, a.nonce, a.ev, a.reclaimed = lease, res.Record.Nonce, s.ev, res.Reclaimed
	txCtx, tx, err := e.beginTx(context.WithValue(ctx, attemptKey{}, a), a)
	if err != nil {
		a.release(ctx, nil)
		return err
	}
	a.tx = tx
	// The deadline counts from the claim's answer (or now, when the
	// configured clock is not the wall clock): the lease covers
	// RequestTimeout + StoreTimeout from the claim.
	a.hctx.init(txCtx, e.wallClock(s.end).Add(e.cfg.RequestTimeout))
	a.ctx = &a.hctx
	return nil
}

// reconcile asks Config.Reconcile about the stale record a took over
// (step 8). answered is false when Reconcile said the earlier attempt had
// no effect: the handler runs. Otherwise the attempt is finished, and the
// verdict and Event are Reconcile's answer, stored as the outcome, or a 503
// when Reconcile failed.
func (s *starting) reconcile(ctx context.Context, a *Attempt, stale idemstore.Record) (verdict, Event, bool) {
	resp, err := s.e.cfg.Reconcile(a.ctx, stale)
	if err != nil {
		a.finished = true
		// Kept, not released: the effect is still unknown, and a release
		// would let the next retry run the handler without asking.
		err = fmt.Errorf("reconcile: %w", a.keepClaim(ctx, err))
		return s.refuse(OutcomeStoreError, ProblemStoreUnavailable, 1, err), s.ev, true
	}
	a.resolved = resp == nil // no effect: the handler runs, and may release
	if resp == nil {
		return verdict{}, Event{}, false
	}
	if !a.finish() {
		panic("idem: Attempt finished twice")
	}
	a.reconciled = true
	v := a.settle(Result{Status: resp.Status, Header: resp.Header, Body: resp.Body})
	return v, a.ev, true
}

// claim asks the store to claim creq, within StoreTimeout (through a's
// deadline when a is set, see claimBounded). On an error the claim may
// have committed although its answer was lost (the client hung up and
// cancelled ctx, the connection broke after the statement ran), so it ends
// it, fenced by this attempt's own token, so the key is not blocked for a
// whole lease; a claim that did not commit matches nothing. The lost claim
// may have been a takeover that Reconcile must be asked about
// (creq.TakeOverUncertain), so then it is kept (Store.Keep), not released.
func (e *Engine) claim(ctx context.Context, a *Attempt, creq idemstore.ClaimRequest, lease idemstore.Lease) (idemstore.ClaimResult, error) {
	var res idemstore.ClaimResult
	var err error
	if a != nil {
		res, err = e.claimBounded(ctx, a, creq)
	} else {
		cctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
		res, err = e.cfg.Store.Claim(cctx, creq)
		cancel()
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StoreTimeout)
		end := e.cfg.Store.Release
		if creq.TakeOverUncertain {
			end = e.cfg.Store.Keep
		}
		if rerr := end(rctx, lease); rerr != nil && !errors.Is(rerr, idemstore.ErrLeaseLost) {
			err = errors.Join(err, rerr)
		}
		cancel()
	}
	return res, err
}

// previousKeyMatches reports whether stored is the fingerprint of the call
// under one of Config.PreviousFingerprintKeys. It recomputes the
// fingerprint per key, which only a mismatch under the current key pays.
func (e *Engine) previousKeyMatches(stored []byte, c *Call, body []byte) bool {
	if len(stored) != idemstore.FingerprintSize || stored[0] != hooks.FingerprintVersion {
		return false
	}
	for _, k := range e.fpPrevious {
		if old := k.fingerprint(c.Method, c.Operation, c.Principal, c.Encoding, body, e.ignore); bytes.Equal(stored, old[:]) {
			return true
		}
	}
	return false
}

// replay marks the stored response as replayed. The record is the caller's
// own copy (see Store.Claim), so its header map is changed in place.
func replay(stored *Response) *Response {
	if stored.Header == nil {
		stored.Header = make(http.Header, 1)
	}
	stored.Header[ReplayedHeader] = []string{"true"}
	return stored
}

// newTokenAndNonce returns a new lease token and a new record nonce, 128
// random bits each, from one read of crypto/rand.
func newTokenAndNonce() (token, nonce string) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	var h [64]byte
	hex.Encode(h[:], b[:])
	s := string(h[:])
	return s[:32], s[32:]
}

// Attempt is one claimed execution of a handler, as Engine.Begin hands it to
// an adapter. It owns the store's transaction until Finish or Abort.
// Applications do not use it: their handlers see only its context.
type Attempt struct {
	e           *Engine
	lease       idemstore.Lease
	nonce       string // the record's (Record.Nonce), for DownstreamKey
	syncMu      sync.Mutex
	synced      bool // the claim is durable (see syncNonce)
	body        []byte
	tx          idemstore.Tx
	ctx         context.Context // &hctx once the transaction has begun
	hctx        deadlineCtx     // the handler's: request, transaction, RequestTimeout
	sctx        deadlineCtx     // the store calls' after the handler (see storeContext)
	cctx        deadlineCtx     // the first claim's: StoreTimeout (see Engine.claimBounded)
	claims      int             // the claims made for this call (see Engine.claimBounded)
	endBegin    func(error)     // releases beginTx's context (see Attempt.leave)
	inFlight    bool            // holds its principal's in-flight slot
	resp        Response        // the handler's response, as Finish returns it
	ev          Event
	start       time.Time
	reclaimed   bool
	reconciled  bool // the result is Reconcile's answer, not a handler's (see mustKeep)
	resolved    bool // Reconcile said the taken-over attempt had no effect (see mustKeep)
	durable     bool // the claim was made durable (ClaimRequest.Durable): no sync needed
	fingerprint [idemstore.FingerprintSize]byte
	// classifier is the call's own (Call.Classify); nil uses
	// Config.Classify, with status 0 taken as 200.
	classifier Classifier
	// call is set for an attempt begun by Do: the reply's Header is stored
	// as the caller gave it, not filtered by Config.StoredHeaders.
	call bool

	mu       sync.Mutex
	finished bool
}

// Context returns the context the handler must run with: it carries the
// store's transaction, the lease (for DownstreamKey) and the request
// deadline.
func (a *Attempt) Context() context.Context { return a.ctx }

// Body returns the request body Begin read, for the adapter to hand back to
// the handler.
func (a *Attempt) Body() []byte { return a.body }

// Lease returns the lease this attempt holds.
func (a *Attempt) Lease() idemstore.Lease { return a.lease }

// Abort rolls the transaction back and releases the claim if Finish has not
// run. Adapters defer it so that a panicking handler releases its key; the
// panic then goes on to the framework's recovery. It is a no-op after
// Finish.
func (a *Attempt) Abort() {
	if !a.finish() {
		return
	}
	a.ev.Outcome = OutcomeReleased
	if a.release(a.ctx, errors.New("handler panicked or was abandoned")) != nil {
		a.ev.Outcome = OutcomeTxEnded
	}
	a.ev.Status = http.StatusInternalServerError
	a.ev.Duration = a.e.cfg.Clock().Sub(a.start)
	a.e.emit(a.ctx, a.ev)
}

func (a *Attempt) finish() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished {
		return false
	}
	a.finished = true
	return true
}

// Finish classifies the handler's result, then either stores it with the
// handler's writes in one commit or rolls everything back and releases the
// key. It returns the response to send: the handler's own on success or
// release, a problem when the commit fails or the lease was lost. Nothing
// of the handler's response may reach the client before Finish returns.
func (a *Attempt) Finish(res Result) *Response {
	if !a.finish() {
		panic("idem: Attempt finished twice")
	}
	if res.Streamed && a.e.sawStream.CompareAndSwap(false, true) {
		a.e.cfg.logger().WarnContext(a.ctx, "idempotency: a handler flushed or streamed its response; on an idempotent route "+
			"the response is held until the commit and reaches the client whole, after the handler (logged once)",
			slog.String("route", a.ev.Route))
	}
	v := a.settle(res)
	resp := a.e.httpResponse(&v)
	a.ev.Status = resp.Status
	a.e.emit(a.ctx, a.ev)
	return resp
}

// classify decides the disposition of the handler's result with the
// call's classifier, or Config.Classify.
func (a *Attempt) classify(status int, err error) Disposition {
	if a.classifier != nil {
		return a.classifier(status, err)
	}
	return a.e.cfg.Classify(status, err)
}

// settle is Finish in no protocol's terms: it classifies res and
// dispatches on the disposition, as the state table of docs/design.md
// does: a response too large to store, or one that is not to be stored,
// rolls back and releases (abandon); one to store is committed with the
// handler's writes (commit). It fills in the attempt's Event but for its
// Status. The caller has marked the attempt finished.
func (a *Attempt) settle(res Result) verdict {
	defer a.leave()
	defer a.hctx.cancel()
	e := a.e
	if res.Status == 0 && a.classifier == nil {
		res.Status = http.StatusOK
	}
	a.resp = Response{Status: res.Status, Header: res.Header, Body: res.Body}

	disp := a.classify(res.Status, res.Err)
	now := time.Now()
	deadlineErr := a.hctx.errAt(now)
	if deadlineErr != nil && !a.reconciled {
		disp = Release
	}
	switch {
	case res.Overflow || len(res.Body) > e.cfg.MaxResponseBytes:
		return a.abandon(nil, OutcomeResponseTooLarge, verdict{problem: ProblemResponseTooLarge})
	case disp == Complete:
		return a.commit(res, idemstore.StateCompleted, now)
	case disp == Fail:
		return a.commit(res, idemstore.StateFailed, now)
	case deadlineErr != nil:
		return a.abandon(res.Err, OutcomeReleased, verdict{problem: ProblemTimeout, retryAfter: 1, err: deadlineErr})
	}
	return a.abandon(res.Err, OutcomeReleased, verdict{resp: &a.resp, err: res.Err})
}

// done records the attempt's outcome in its Event and returns v with it.
func (a *Attempt) done(outcome OutcomeLabel, v verdict) verdict {
	e := a.e
	v.outcome = outcome
	a.ev.Outcome, a.ev.Err = outcome, v.err
	a.ev.TxUsed = a.tx != nil && a.tx.Used()
	a.ev.Duration = e.cfg.Clock().Sub(a.start)
	e.holds.observe(a.ev.Route, a.ev.Duration)
	return v
}

// abandon rolls the attempt back and releases its claim, then answers v
// with outcome; cause is why, for the Event. When the transaction had
// already ended outside the store's control the claim is kept instead, and
// the answer is ProblemTxEnded.
func (a *Attempt) abandon(cause error, outcome OutcomeLabel, v verdict) verdict {
	if ended := a.release(a.ctx, cause); ended != nil {
		if cause != nil {
			ended = errors.Join(cause, ended)
		}
		return a.done(OutcomeTxEnded, a.txEnded(ended))
	}
	return a.done(outcome, v)
}

// commit stores res as state with the handler's writes, in one commit: its
// headers filtered and checked, its body sealed when Config.BodySealer is
// set. A Settle that fails is answered by settleFailed.
func (a *Attempt) commit(res Result, state idemstore.State, now time.Time) verdict {
	e := a.e
	header := res.Header
	if !a.call {
		header = e.storedHeader(header)
		// A stored value is replayed, perhaps by a server that writes
		// values raw: one with CR or LF would split the replay.
		if err := wire.CheckHeader(header); err != nil {
			err = fmt.Errorf("%w: %w", ErrResponseInvalid, err)
			return a.abandon(err, OutcomeResponseInvalid, verdict{problem: ProblemResponseInvalid, err: err})
		}
	}
	sctx := a.storeContext(a.ctx, now)
	defer a.sctx.cancel()
	// Data at rest: the body stored may be omitted or sealed.
	storedBody, err := a.bodyToStore(sctx, res.Body)
	if err != nil {
		return a.abandon(err, OutcomeStoreError, verdict{problem: ProblemCommitFailed, err: err})
	}
	out := idemstore.Outcome{State: state, Response: Response{Status: res.Status, Header: header, Body: storedBody}}
	if err := a.tx.Settle(sctx, out); err != nil {
		return a.settleFailed(sctx, err)
	}
	e.waits.signal(a.lease)
	outcome := OutcomeClaimed
	if a.reclaimed {
		outcome = OutcomeStaleReclaimed
	}
	return a.done(outcome, verdict{resp: &a.resp, stored: state})
}

// settleFailed answers a Settle that stored nothing, or may have stored
// part of the work: lease lost (503), the transaction ended behind the
// store (kept, transaction-ended), Commit or Rollback on the handle
// (released, transaction-owned), a Reconcile answer that must stay kept,
// or a failed commit (released unless it landed, commit-failed or
// store-misconfigured).
func (a *Attempt) settleFailed(sctx context.Context, err error) verdict {
	if rerr := a.tx.Rollback(sctx); errors.Is(rerr, idemstore.ErrTxEnded) && !errors.Is(err, idemstore.ErrTxEnded) {
		err = errors.Join(err, rerr)
	}
	switch {
	case errors.Is(err, idemstore.ErrLeaseLost):
		return a.done(OutcomeLeaseLost, verdict{problem: ProblemLeaseLost, retryAfter: 1, err: err})
	case errors.Is(err, idemstore.ErrTxEnded):
		// Part of the handler's work may have committed without the
		// outcome: releasing would let a retry run it again. The claim is
		// kept for Reconcile or an operator.
		return a.done(OutcomeTxEnded, a.txEnded(errors.Join(err, a.keepLease(sctx))))
	case errors.Is(err, idemstore.ErrTxOwned):
		// The handler called Commit or Rollback on the handle: the store
		// refused it and rolled everything back. A bug in the handler, not
		// a store failure, and retrying does not help.
		return a.done(OutcomeTxOwned, verdict{problem: ProblemTxOwned, err: a.releaseAfterSettle(err)})
	case a.mustKeep():
		// Reconcile said the effect happened, and storing it failed: kept,
		// not released, for the next takeover to ask again.
		return a.done(OutcomeStoreError, verdict{problem: ProblemStoreUnavailable, retryAfter: 1, err: errors.Join(err, a.keepLease(sctx))})
	}
	// The commit failed, or its answer was lost and it may have landed:
	// the release is fenced on the record being in progress, so it frees
	// the key only when nothing committed, and a retry otherwise replays
	// what did.
	err = a.releaseAfterSettle(err)
	v := verdict{problem: ProblemCommitFailed, retryAfter: 1, err: err}
	if errors.Is(err, idemstore.ErrMisconfigured) {
		v.problem, v.retryAfter = ProblemMisconfigured, 0
	}
	return a.done(OutcomeStoreError, v)
}

// releaseAfterSettle releases the claim after a Settle that stored
// nothing, on a context of its own (the settle may have used up its
// time), and returns err joined with the release's error, if any.
func (a *Attempt) releaseAfterSettle(err error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), a.e.cfg.StoreTimeout)
	defer cancel()
	rerr := a.e.cfg.Store.Release(rctx, a.lease)
	a.e.waits.signal(a.lease)
	if rerr != nil && !errors.Is(rerr, idemstore.ErrLeaseLost) {
		return errors.Join(err, rerr)
	}
	return err
}

// storeProblem is the answer to a store error before the handler ran, and
// its Retry-After: retrying is safe unless the store is misconfigured.
func storeProblem(err error) (ProblemType, int) {
	if errors.Is(err, ErrMisconfigured) {
		return ProblemMisconfigured, 0
	}
	return ProblemStoreUnavailable, 1
}

// release rolls back and releases the claim, fenced by the lease.
//
// When the rollback reports that the transaction had already ended outside
// the store's control (ErrTxEnded), part of the handler's work may have
// committed: the claim is kept (Store.Keep) for Reconcile or an operator,
// and release returns that error. An attempt that must keep its claim
// (mustKeep) keeps it instead of releasing it.
func (a *Attempt) release(ctx context.Context, cause error) (ended error) {
	if a.mustKeep() {
		if err := a.keepClaim(ctx, cause); err != cause {
			a.ev.Err = err
		}
		return nil
	}
	sctx := a.storeContext(ctx, time.Now())
	defer a.leave()
	defer a.sctx.cancel()
	if a.ctx != nil {
		defer a.hctx.cancel()
	}
	if a.tx != nil {
		if err := a.tx.Rollback(sctx); errors.Is(err, idemstore.ErrTxEnded) {
			a.ev.Err = errors.Join(cause, err, a.keepLease(sctx))
			return err
		}
	}
	err := a.e.cfg.Store.Release(sctx, a.lease)
	a.e.waits.signal(a.lease)
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		a.ev.Err = errors.Join(cause, err)
	}
	return nil
}

// txEnded is the answer to an attempt whose transaction ended outside the
// store's control, and whose claim is kept: with Reconcile set, a retry
// takes it over at once and asks it what happened, so Retry-After is 1;
// without it no retry runs the handler again (ProblemOutcomeUnknown), so
// there is none.
func (a *Attempt) txEnded(err error) verdict {
	v := verdict{problem: ProblemTxEnded, err: err}
	if a.e.cfg.Reconcile != nil {
		v.retryAfter = 1
	}
	return v
}

// keepLease keeps the attempt's claim (Store.Keep) on ctx, which is a
// store context (storeContext). Its error is for the Event: a Keep that
// fails leaves the claim in progress under this lease, never released.
func (a *Attempt) keepLease(ctx context.Context) error {
	err := a.e.cfg.Store.Keep(ctx, a.lease)
	a.e.waits.signal(a.lease) // the key is stale now: its waiters take it over, or learn its outcome is unknown
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		return fmt.Errorf("keep: %w", err)
	}
	return nil
}

// storeContext returns the context for the store calls made after the
// handler (settle, rollback, release): ctx's values without its
// cancellation (a client hanging up must not strand a transaction), bounded
// by StoreTimeout from now. An attempt ends through exactly one of Finish's
// settle or release, so it needs one; the caller cancels a.sctx when done.
func (a *Attempt) storeContext(ctx context.Context, now time.Time) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	a.sctx.init(context.WithoutCancel(ctx), now.Add(a.e.cfg.StoreTimeout))
	return &a.sctx
}

// wallClock returns t when it was read from the configured clock and that
// clock is the wall clock, otherwise time.Now(): deadlines are always on the
// wall clock, and one reading fewer per request is worth the check.
func (e *Engine) wallClock(t time.Time) time.Time {
	if e.clockIsWall && !t.IsZero() {
		return t
	}
	return time.Now()
}

// storedHeader returns the part of h the store may keep: the allow-listed
// names, canonicalised. When that is all of h, it returns h itself: stores
// copy or serialise what they keep before Settle returns, so sharing the
// adapter's map for the call is safe and saves a map per request: 2 of 40
// allocations on a first request through net/http (BENCHMARKS.md, "Tricks
// kept, and why").
func (e *Engine) storedHeader(h http.Header) http.Header {
	all := true
	for k := range h {
		if !e.stored[k] { // a non-canonical spelling of an allowed name also lands here
			all = false
			break
		}
	}
	if all {
		return h
	}
	out := make(http.Header, len(e.stored))
	for k, v := range h {
		if ck := http.CanonicalHeaderKey(k); e.stored[ck] {
			out[ck] = v
		}
	}
	return out
}
