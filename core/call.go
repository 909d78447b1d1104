package idem

import (
	"context"
	"errors"
	"github.com/idemgo/idem/core/idemstore"
	"time"
)

// Call is one idempotent call through Engine.Do: a service method, a gRPC
// method, a queue message. The caller has authenticated it and encoded its
// input; Do does the rest of what the HTTP middleware does for a request.
type Call struct {
	// Principal is the authenticated caller; empty means not authenticated
	// (ProblemUnauthenticated, nothing claimed). Records are keyed by
	// (Principal, Key).
	Principal string
	// PrincipalErr is the error the application's principal function
	// returned, if any: the call is refused like one without a principal,
	// and the error goes into the Event and the log.
	PrincipalErr error
	// Key is the idempotency key as the caller received it, validated as
	// the HTTP header is (Config.MaxKeyLength). Empty means
	// missing: refused with ProblemKeyMissing unless Config.KeyOptional,
	// when fn runs without idempotency.
	Key string
	// Method is the protocol's verb if it has one (HTTP's); usually empty.
	// With Operation it names what is called.
	Method string
	// Operation names what is called: "CreatePayment", a gRPC full method
	// name, a subject. It enters the fingerprint, so one key used for two
	// operations is a mismatch (ProblemKeyReused).
	Operation string
	// Route labels the call in its Event for per-route metrics: the HTTP
	// route template, or the gRPC full method name. Empty means Operation,
	// which must then be a bounded set of names, never client input.
	Route string
	// Encoding names the encoding of Input, as a media type. JSON
	// ("application/json", "application/*+json") is canonicalised before it
	// is fingerprinted (RFC 8785, Config.IgnoreFields left out), so member
	// order and white space do not matter; any other encoding is
	// fingerprinted byte for byte and must be deterministic (protobuf with
	// proto.MarshalOptions{Deterministic: true}, "application/protobuf").
	Encoding string
	// Input is the call's request as the fingerprint covers it; only its
	// hash is stored. At most Config.MaxBodyBytes (ProblemBodyTooLarge).
	Input []byte
	// RequestID is stored with the record, to trace a replay to the
	// original call.
	RequestID string
	// DurableClaim makes this call's claim durable before fn runs, as
	// Config.DurableClaims does for every call.
	DurableClaim bool
	// WaitInFlight, when positive, is how long this call waits for the
	// attempt holding its key, as Config.WaitInFlight says, at most the
	// engine's Lease; negative means it does not wait; 0 uses the route's
	// (Config.RouteWaitInFlight) or Config.WaitInFlight. A call that waits
	// past it, or whose ctx ends meanwhile, gets a *CallError with
	// ProblemKeyInUse.
	WaitInFlight time.Duration
	// Classify decides from fn's Response.Status and error whether the
	// outcome is stored as completed, stored as failed, or released. Nil
	// uses Config.Classify, for which Status is an HTTP status and 0 means
	// 200 (and is stored as 200).
	Classify Classifier
}

// CallResult is the outcome of a call that was run and stored, replayed,
// or run and released.
type CallResult struct {
	// Response is fn's reply, or on a replay the stored one. Its Header is
	// stored as fn returned it: put in it only what a replay must carry.
	Response
	// Replayed is true when fn did not run and Response is the stored
	// outcome of an earlier attempt.
	Replayed bool
	// State is what the record holds now: StateCompleted or StateFailed
	// once the outcome is stored (by this attempt or an earlier one), ""
	// when it was released (the key is free: a retry runs fn again) or
	// when no key was given and Config.KeyOptional let fn run without one.
	State idemstore.
		// Outcome is the call's label, as in its Event.
		State

	Outcome OutcomeLabel
}

// CallError is the error Do returns when the library answers a call
// itself: it was refused before fn ran (not authenticated, a bad key, the
// key in use or reused with another input, the store unavailable), or fn's
// outcome could not be stored (the commit failed, the lease was lost, the
// deadline passed). Problem names the case; each protocol maps it to its
// own answer (HTTP problem details, a gRPC status, a queue's Nak).
type CallError struct {
	// Problem is the case, one of the ProblemType constants.
	Problem ProblemType
	// RetryAfter is how long to wait before retrying, when a retry can
	// succeed; 0 otherwise.
	RetryAfter time.Duration
	// Err is the cause, if any: a store error, the principal function's
	// error, a key parse error, the deadline.
	Err error
}

// Error returns the problem's title and the cause.
func (e *CallError) Error() string {
	msg := "idem: " + problems[e.Problem].Title
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *CallError) Unwrap() error { return e.Err }

// Status returns the HTTP status of the problem, for protocols that speak
// HTTP and for logs.
func (e *CallError) Status() int { return problems[e.Problem].Status }

// Retryable reports whether retrying the same call later can succeed
// without a change by the caller: the key in use or taken over, the store
// unavailable, the commit failed, the deadline, a transaction the handler
// ended (after its lease). A misconfigured store and a result too large to
// store need a change on the server's side; the others, the caller's.
func (e *CallError) Retryable() bool {
	switch e.Problem {
	case ProblemKeyInUse, ProblemLeaseLost, ProblemStoreUnavailable, ProblemCommitFailed,
		ProblemTimeout, ProblemTxEnded, ProblemTooManyInFlight:
		return true
	}
	return false
}

// Do runs fn as one idempotent call: it claims (c.Principal, c.Key), runs
// fn with a context that carries the store's transaction (reach it with
// the store's accessor, idempgx.Tx(ctx), idemgorm.Tx(ctx)), the lease for
// DownstreamKey, and the Config.RequestTimeout deadline, then stores fn's
// Response together with fn's writes in one commit. A retry with the same
// key and input gets the stored Response back without running fn. It is
// the entry the HTTP middleware, the gRPC interceptor and queue consumers
// share: the same state machine, Reconcile, Observer and log.
//
// Do returns:
//   - (result, nil) when the outcome is stored (State completed or failed,
//     Replayed or not): a stored failure is not an error of Do, its
//     Response says what failed, the same on the first run and every
//     replay;
//   - (result, err) when fn ran and its outcome was released: err is fn's
//     own error, or nil when c.Classify released a Response fn returned
//     without one (State is "");
//   - (CallResult{}, *CallError) when the library answered: refused before
//     fn ran, or fn's outcome could not be stored;
//   - fn's (result, err) with State "" when Config.KeyOptional let a call
//     without a key through: fn ran without idempotency.
//
// A panic in fn rolls back, releases the key and goes on.
func (e *Engine) Do(ctx context.Context, c Call, fn func(ctx context.Context) (Response, error)) (CallResult, error) {
	if c.Route == "" {
		c.Route = c.Operation
	}
	a, v, ev := e.start(ctx, &c, nil)
	if a == nil && v.pass {
		e.emit(ctx, ev)
		resp, err := fn(ctx)
		return CallResult{Response: resp, Outcome: OutcomeNoKey}, err
	}
	if a == nil {
		return e.callResult(ctx, &v, &ev)
	}
	defer a.Abort()
	resp, err := fn(a.Context())
	if !a.finish() {
		panic("idem: Attempt finished twice")
	}
	v = a.settle(Result{Status: resp.Status, Header: resp.Header, Body: resp.Body, Err: err})
	return e.callResult(a.ctx, &v, &a.ev)
}

// callResult turns v into Do's answer and emits ev with the status the
// caller gets: the Response's, or the HTTP status of the problem.
func (e *Engine) callResult(ctx context.Context, v *verdict, ev *Event) (CallResult, error) {
	if v.problem != "" {
		ev.Status = problems[v.problem].Status
		e.emit(ctx, *ev)
		return CallResult{}, &CallError{Problem: v.problem, RetryAfter: time.Duration(v.retryAfter) * time.Second, Err: v.err}
	}
	ev.Status = v.resp.Status
	e.emit(ctx, *ev)
	res := CallResult{Response: *v.resp, Replayed: v.outcome == OutcomeReplayed, State: v.stored, Outcome: v.outcome}
	if v.stored == "" && v.err != nil {
		return res, v.err
	}
	return res, nil
}

// ProblemOf returns the case of an error Do returned, when the library
// answered the call itself.
func ProblemOf(err error) (ProblemType, bool) {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Problem, true
	}
	return "", false
}
