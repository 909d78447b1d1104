package idemclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
)

// Result is what a Transport did for one request.
type Result struct {
	// Key is the idempotency key every attempt sent.
	Key string
	// Attempts is how many attempts the Transport made, the first
	// included. (net/http's own Transport may resend a request once on a
	// kept-alive connection that broke before any answer; that resend is
	// inside one attempt, and carries the same key.)
	Attempts int
	// Replayed is true when the answer carried Idempotent-Replayed: true:
	// the server returned the stored outcome of an earlier attempt (one
	// whose answer was lost, or a concurrent one) instead of running the
	// operation again.
	Replayed bool
}

type infoKey struct{}

// infoCtx is one request's state, allocated once: each attempt's context
// (the request's, plus the Result that Info reads back from resp.Request),
// the key header's value, and the returned answer's body when it was read
// into memory. All of it lives as long as the answer.
type infoCtx struct {
	context.Context
	result   Result
	keyValue [1]string
	body     memBody
}

func (c *infoCtx) Value(key any) any {
	if key == (infoKey{}) {
		return &c.result
	}
	return c.Context.Value(key)
}

// Info returns the Result of the request that produced resp. ok is false
// when resp did not come from a Transport that applied to the request (its
// method is not one of Config.Methods, or another RoundTripper sent it).
func Info(resp *http.Response) (r Result, ok bool) {
	if resp == nil || resp.Request == nil {
		return Result{}, false
	}
	p, ok := resp.Request.Context().Value(infoKey{}).(*Result)
	if !ok {
		return Result{}, false
	}
	return *p, true
}

// Error is the error of a request that ended without an answer to return:
// the last attempt's transport error, the context's error when it ended
// during a wait, a body that could not be read, or ErrOutcomeUnknown. It
// carries the key and the attempts; http.Client returns it inside a
// *url.Error, so reach it with errors.As. Attempts is 0 when nothing was
// sent.
//
// Its message names the key only by a hash (sha256: and the first 8 hex
// digits of the key's SHA-256), never the key itself: a key lets whoever
// holds it, with the caller's credentials, read the stored answer, and
// error strings end up in logs. Whoever has the key finds its lines with
// printf %s "$KEY" | sha256sum.
type Error struct {
	// Key is the idempotency key the attempts sent ("" when NewKey gave
	// none that could be sent). Error does not print it.
	Key string
	// Attempts is how many attempts were sent.
	Attempts int
	// Err is what ended the request: the last attempt's error, the
	// context's, ErrOutcomeUnknown, or what kept the first attempt from
	// being sent.
	Err error
}

// Error says the key's hash, the attempts and the underlying error.
func (e *Error) Error() string {
	if e.Key == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("idemclient: key sha256:%s, %d attempt(s): %v", keyHash(e.Key), e.Attempts, e.Err)
}

// keyHash is key as an Error's message names it: the first 8 hex digits
// of its SHA-256.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:4])
}

// Unwrap returns the underlying error, so errors.Is(err,
// context.DeadlineExceeded) and the like see through an Error.
func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the underlying error is a timeout, so that
// url.Error's Timeout (and net.Error checks) keep working through an Error.
func (e *Error) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}
