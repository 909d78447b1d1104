package idem

import "github.com/idemgo/idem/core/idemstore"

// Response is an HTTP response as the library stores and replays it: what
// Config.Reconcile answers for a settled effect, what Engine.Do's function
// returns (a status in the caller's protocol, its metadata and its encoded
// body), and what a replay sends. It is the store's type, so a store keeps
// exactly what the engine answers.
type Response = idemstore.Response

// Record is one stored idempotency record, as Config.Reconcile and
// Config.AuthorizeReplay receive it: its Principal, Key and Nonce name the
// attempt (DownstreamKeyOf derives the attempt's downstream key from them),
// its Response is the stored outcome. Its fields are documented in package
// idemstore, where stores keep it.
type Record = idemstore.Record

// Errors of the store that applications branch on, the same values as
// package idemstore's.
var (
	// ErrMisconfigured is wrapped by New's error when the store reports
	// that retrying cannot fix what is wrong (a missing table, column or
	// permission), and by the Event's Err of a request answered 500
	// store-misconfigured.
	ErrMisconfigured = idemstore.ErrMisconfigured
	// ErrTxOwned is what a store's transaction handle returns when the
	// handler tries to end the transaction (Commit, Rollback, COMMIT): the
	// store commits it together with the stored outcome after the handler
	// returns. Return an error or a 5xx to abandon the work.
	ErrTxOwned = idemstore.ErrTxOwned
)
