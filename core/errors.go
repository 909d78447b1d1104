package idem

import (
	"errors"

	"github.com/idemgo/idem/core/idemstore"
)

// The errors applications branch on with errors.Is. An Event's Err wraps
// the one that explains its outcome.
var (
	// ErrInvalidConfig is wrapped by every error New returns.
	ErrInvalidConfig = errors.New("idem: invalid config")

	// ErrKeyMissing means the request carried no idempotency key.
	ErrKeyMissing = errors.New("idem: idempotency key missing")
	// ErrKeyInvalid means the key header could not be parsed, is
	// ambiguous (several keys, parameters), or is not 1 to max visible
	// ASCII characters. The Event's Err wraps it with the reason.
	ErrKeyInvalid = errors.New("idem: idempotency key invalid")

	// ErrTooManyInFlight is the Event's Err when a principal already has
	// Config.MaxInFlightPerPrincipal idempotent requests in flight.
	ErrTooManyInFlight = errors.New("idem: too many requests in flight for this principal")
	// ErrStoreTimeout is wrapped by the Event's Err when Claim or BeginTx
	// (and the connection it waits for) did not answer within
	// Config.StoreTimeout: the pool is exhausted or the store is slow. The
	// request is answered 503 store-unavailable with a Retry-After,
	// instead of queueing behind the handlers that hold the connections.
	ErrStoreTimeout = errors.New("idem: store did not answer within StoreTimeout")
	// ErrOutcomeUnknown is the Event's Err when a retry finds a record
	// whose outcome is unknown (Record.Uncertain) and no Config.Reconcile
	// to ask: the request is answered 409 outcome-unknown and nothing
	// runs. An operator resolves the key with idemctl.
	ErrOutcomeUnknown = errors.New("idem: the outcome of an earlier attempt is unknown")

	// ErrResponseInvalid is wrapped by the Event's Err when a handler's
	// response carried a header to be stored whose name or value is not
	// valid HTTP.
	ErrResponseInvalid = errors.New("idem: response header invalid")
	// ErrSeal is wrapped by the Event's Err when Config.BodySealer failed:
	// Seal at settle (the request is rolled back and answered 500
	// commit-failed, nothing stored) or Open at replay (answered 500
	// replay-unreadable: the stored body is never sent undecrypted).
	ErrSeal = errors.New("idem: body sealer failed")
	// ErrNoAttempt is returned by DownstreamKey outside an idempotent
	// handler.
	ErrNoAttempt = errors.New("idem: no idempotent attempt in context")

	// ErrMisconfigured is wrapped by New's error when the store reports
	// that retrying cannot fix what is wrong (a missing table, column or
	// permission), and by the Event's Err of a request answered 500
	// store-misconfigured. It is idemstore.ErrMisconfigured.
	ErrMisconfigured = idemstore.ErrMisconfigured
	// ErrTxOwned is what a store's transaction handle returns when the
	// handler tries to end the transaction (Commit, Rollback, COMMIT): the
	// store commits it together with the stored outcome after the handler
	// returns. Return an error or a 5xx to abandon the work. It is
	// idemstore.ErrTxOwned.
	ErrTxOwned = idemstore.ErrTxOwned
)
