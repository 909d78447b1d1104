package idemstore

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// State is the state of an idempotency record.
type State string

// The states a stored record can be in.
const (
	// StateInProgress means a request holds the key's lease and its handler is
	// running (or its holder crashed and the lease has not yet expired).
	StateInProgress State = "in_progress"
	// StateCompleted means the handler settled with a 2xx or 3xx response,
	// committed together with the handler's own writes.
	StateCompleted State = "completed"
	// StateFailed means the handler settled with a deterministic 4xx
	// response, which is replayed like a completed one.
	StateFailed State = "failed"
	// StateReleased means the attempt holding the key was released: it
	// stored nothing and the engine knows nothing of it committed (its
	// handler failed with a 5xx, its commit failed, or an operator or
	// Config.Reconcile released it), so the key counts as absent and the
	// next claim runs the handler afresh, with any body. The record stays
	// until its ExpiresAt only to keep its nonce: the next attempt with the
	// same fingerprint gets the same DownstreamKey, so a provider that the
	// released attempt reached deduplicates the retry; an attempt with
	// another fingerprint is another request and gets a new nonce.
	StateReleased State = "released"
)

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool {
	return s == StateInProgress || s == StateCompleted || s == StateFailed || s == StateReleased
}

// Sentinel errors that stores return and callers branch on.
var (
	// ErrLeaseLost is returned by Tx.Settle and Store.Release when the lease
	// token no longer matches an in-progress record: another request took
	// the key over after the lease expired, or the lease was released.
	// Nothing was stored.
	ErrLeaseLost = errors.New("idem: lease lost to a takeover")
	// ErrNotFound is returned by Store.Get when no record exists.
	ErrNotFound = errors.New("idem: record not found")
	// ErrTransient marks errors that are worth retrying: serialization
	// failures, deadlocks, lock timeouts, a busy database, a full memory
	// store. Stores wrap such errors so that errors.Is(err, ErrTransient)
	// holds; the engine releases the key instead of storing anything.
	ErrTransient = errors.New("idem: transient store error")
	// ErrMisconfigured marks store errors that retrying cannot fix: a
	// missing table or column, a permission the database user lacks.
	// Stores wrap such errors so that errors.Is(err, ErrMisconfigured)
	// holds; the engine answers a 500 store-misconfigured problem instead
	// of telling the client that retrying is safe, and logs the error even
	// when Config.Logger is nil.
	ErrMisconfigured = errors.New("idem: store misconfigured")
	// ErrTxOwned is returned by a store's transaction handle when the
	// handler tries to end the transaction (Commit, Rollback, or a
	// transaction-control statement such as COMMIT): the store owns it and
	// ends it after the handler returns, together with the stored outcome.
	// Stores return it, or an error wrapping it, and refuse before anything
	// reaches the database. When the handler called Commit or Rollback on
	// the handle, Tx.Settle stores nothing and returns an error wrapping
	// it, and the engine answers 500 transaction-owned: a bug in the
	// handler, which a retry repeats.
	ErrTxOwned = errors.New("idem: the transaction belongs to the idempotency store; return from the handler to commit, or return an error to roll back")
	// ErrTxEnded is wrapped by the error Tx.Settle returns when the
	// handler's transaction ended under the handler by a route the store
	// could not refuse (a raw connection, a server-side rollback the store
	// noticed only afterwards). Part of the handler's work may have
	// committed without the outcome, so the engine does not release the
	// key: it keeps it (Store.Keep), and the record stays in progress,
	// Uncertain, until Config.Reconcile or an operator resolves it.
	ErrTxEnded = errors.New("idem: the transaction ended outside the store's control")
	// ErrTxAborted is wrapped by the error a store returns when a statement
	// in the handler's transaction failed (or was refused) and left it
	// aborted: every later statement on the handle fails with it, and
	// Settle stores nothing, so the engine releases the key. A rollback to
	// a savepoint taken before the failure recovers, as in PostgreSQL.
	// ErrNotificationsOff is returned by a Notifier's Subscribe when the
	// store was built without notifications (they cost its commits
	// something, so a store may leave them to an option): waiters then
	// poll, and the engine says nothing of it.
	ErrNotificationsOff = errors.New("idem: the store's notifications are off")
	ErrTxAborted        = errors.New("idem: the transaction is aborted: a statement in it failed; nothing more runs in it and nothing is stored")
)

// Lease identifies one holder's claim on a key. Settle and Release are
// fenced by it: they only act while the record is in progress and still
// carries Token.
type Lease struct {
	Principal string
	Key       string
	Token     string
}

// Response is an HTTP response as the library stores and replays it, and as
// adapters write it to the client; for a call through Engine.Do, the
// call's reply: a status in the caller's protocol, its metadata and its
// encoded body.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Record is one stored idempotency record.
type Record struct {
	Principal   string
	Key         string
	Fingerprint []byte // the request's Fingerprint, FingerprintSize bytes
	State       State
	LeaseToken  string
	// Nonce is the random value of the attempt that created the record
	// (ClaimRequest.Nonce): written when the record is inserted or an
	// expired one replaced, kept when a stale claim is taken over and when
	// a released record is claimed again, so it tells two records of one
	// key apart. DownstreamKey is derived from it.
	Nonce     string
	RequestID string // the request id of the attempt that created the record
	CreatedAt time.Time
	LockedAt  time.Time // when the current lease was taken (store clock)
	// LeaseExpiresAt is when the current lease ends, on the store's clock:
	// the claim that took the lease sets it to its now plus
	// ClaimRequest.Lease, and Keep sets it to its now. Past it an
	// in-progress record is stale: its holder crashed, hung or gave up. It
	// is the record's own, so every instance, the sweeper and idemctl agree
	// on staleness whatever their configuration.
	LeaseExpiresAt time.Time
	ExpiresAt      time.Time // retention: past it the record counts as absent
	// Uncertain is set on an in-progress record whose outcome the engine
	// does not know: an attempt's work may have committed without it (the
	// transaction ended behind the store, a failure after a takeover that
	// Config.Reconcile had not answered yet). Store.Keep sets it; a claim
	// takes such a record over only with ClaimRequest.TakeOverUncertain,
	// and keeps it set; settling or releasing the record clears it.
	Uncertain bool
	// Response is the stored outcome; nil while the record is in progress.
	Response *Response
}

// ClaimRequest is what the engine asks a store to claim.
type ClaimRequest struct {
	Principal   string
	Key         string
	Fingerprint []byte
	Token       string        // the new lease token, unique per attempt
	RequestID   string        // stored for tracing a replay to its original
	Lease       time.Duration // the lease's length: LeaseExpiresAt = the store's now + Lease
	Retention   time.Duration // expires_at = now + Retention
	// Nonce is a new random value, unique per attempt (at most 64 bytes):
	// the store writes it when it inserts the record, replaces an expired
	// one, or claims a released record with another fingerprint, and keeps
	// the stored one when it takes over a stale claim or claims a released
	// record with the same fingerprint (see Record.Nonce).
	Nonce string
	// TakeOverUncertain lets the claim take over a stale record marked
	// Uncertain. The engine sets it when Config.Reconcile is set, which it
	// asks right after the takeover; without it such a record is returned
	// unchanged, so that no attempt runs a handler whose earlier work may
	// have committed.
	TakeOverUncertain bool
	// Durable asks the store to make the claim durable before Claim
	// returns, where it would otherwise commit it asynchronously (the
	// PostgreSQL stores): a database crash right after the claim then
	// cannot take it back. See Config.DurableClaims.
	Durable bool
}

// ClaimResult is a store's answer to a claim.
type ClaimResult struct {
	// Claimed is true when the caller now holds the key: a new record was
	// inserted, an expired record replaced, or a stale lease taken over.
	Claimed bool
	// Reclaimed is true when the claim took over an in-progress record
	// whose lease had expired (its holder crashed, hung or was kept by
	// Store.Keep). Implies Claimed; Record.Uncertain then says whether the
	// record was marked Uncertain. Claiming a released record is not a
	// takeover: its attempt was released because it stored nothing.
	Reclaimed bool
	// Record is the record as stored after the claim: the caller's own when
	// Claimed, otherwise the existing record to dispatch on.
	Record Record
	// Now is the store's clock at the claim. Lease ages and Retry-After are
	// computed from it, never from the application's clock.
	Now time.Time
}

// Outcome is what Tx.Settle stores: the terminal state and the response.
type Outcome struct {
	State    State // StateCompleted or StateFailed
	Response Response
}

// Store keeps idempotency records. Every method must be safe for concurrent
// use by many goroutines and, for shared databases, many processes.
//
// The conformance suite in package storetest states the contract as tests;
// every implementation must pass it.
type Store interface {
	// Claim atomically claims (principal, key). It inserts an in-progress
	// record carrying req.Token and req.Nonce, with LeaseExpiresAt its now
	// plus req.Lease, or, when a record exists:
	//   - past its ExpiresAt: replaces it, req.Nonce included (Claimed);
	//   - released: replaces it with req's fingerprint, token, request id,
	//     lease and retention, keeping its nonce when the fingerprint is
	//     the same and taking req.Nonce when it differs (Claimed);
	//   - in progress, past its LeaseExpiresAt, same fingerprint, and not
	//     Uncertain unless req.TakeOverUncertain: takes it over with
	//     req.Token and a new LeaseExpiresAt, keeping its nonce and its
	//     Uncertain mark (Claimed and Reclaimed);
	//   - otherwise: returns it unchanged and writes nothing.
	// Each branch is decided by one atomic statement's own answer, never by
	// a read followed by a write, and all times are the store's clock.
	// The returned Record, its Response and header map belong to the
	// caller, which may change them.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// BeginTx begins a transaction for the handler holding lease and
	// returns a context carrying it, for the store's own accessor (such as
	// idempgx.Tx) to hand to the handler. The transaction must outlive a
	// cancelled ctx long enough to commit or roll back.
	BeginTx(ctx context.Context, lease Lease) (context.Context, Tx, error)

	// Release marks the in-progress record held by lease StateReleased,
	// keeping its nonce and ExpiresAt and clearing Uncertain: the key
	// counts as absent, so the next attempt really retries, and with the
	// same request it gets the same DownstreamKey. It returns ErrLeaseLost
	// when the record is no longer in progress under lease (released
	// already included). PurgeExpired deletes a released record like a
	// settled one. The engine releases only what it knows stored nothing.
	Release(ctx context.Context, lease Lease) error

	// Keep ends the lease of the in-progress record held by lease without
	// releasing it: the record stays in progress, marked Uncertain, with
	// its LeaseExpiresAt set to the store's now, so that the next claim
	// finds it stale at once and takes it over only to ask
	// Config.Reconcile (ClaimRequest.TakeOverUncertain). It is for an
	// attempt whose work may have committed without its outcome. It is
	// fenced like Release and returns ErrLeaseLost the same way.
	Keep(ctx context.Context, lease Lease) error

	// Get returns the record for (principal, key), or ErrNotFound. An
	// expired record may still be returned; callers check ExpiresAt.
	Get(ctx context.Context, principal, key string) (Record, error)

	// PurgeExpired deletes at most limit records whose ExpiresAt has passed
	// and reports how many it deleted. Several purgers may run at once.
	PurgeExpired(ctx context.Context, limit int) (int, error)

	// ListStale returns at most limit in-progress records past their
	// LeaseExpiresAt on the store's clock, Uncertain ones included, the
	// longest expired first. Released records are never stale.
	ListStale(ctx context.Context, limit int) ([]Record, error)

	// Stats counts the records by state, the in-progress ones whose lease
	// was taken at least staleAfter ago, the oldest lease, and the expired
	// records awaiting PurgeExpired, all on the store's clock. It is for
	// operators and gauges, not for deciding a claim: it may read the
	// whole store. A figure the store cannot count is NotCounted.
	Stats(ctx context.Context, staleAfter time.Duration) (Stats, error)
}

// A Checker is a Store that can verify, without changing anything, that it
// can work: its table exists with every column, the database user may use
// it, the server is recent enough. Check returns an error wrapping
// ErrMisconfigured when retrying cannot fix what it found, and another
// error (usually wrapping ErrTransient) when it could not find out, such
// as a database that does not answer.
//
// New calls Check once, bounded by Config.StoreTimeout, unless
// Config.SkipStoreCheck is set: a misconfigured store fails New, and any
// other error is logged at Warn and New goes on, so that a database that
// is down at start-up does not keep the application from starting. Every
// store in this module set implements it; a store that has nothing to
// check (memstore) need not.
type Checker interface {
	Check(ctx context.Context) error
}

// A Syncer is a Tx whose store can commit a claim before it is durable (the
// PostgreSQL stores commit a claim asynchronously, to save a WAL flush per
// first request). Sync returns once the claim of the Tx's attempt is
// durable, and it uses the Tx's own connection: a handler that holds one
// connection never waits for a second one. DownstreamKey calls it once per
// attempt before it hands out a key (unless the claim was Durable), so a
// key never reaches a provider while the record's nonce it is derived from
// could still be lost in a crash.
type Syncer interface {
	Sync(ctx context.Context) error
}

// Tx is the transaction a store begins for one handler. The handler's own
// writes go into it, and Settle commits them together with the outcome.
type Tx interface {
	// Settle stores outcome for the tx's lease, fenced by the lease token,
	// and commits. If the fence misses it rolls back and returns
	// ErrLeaseLost. Any other error means the outcome is unknown to the
	// caller: usually nothing was stored, but a COMMIT whose answer was
	// lost may have committed. The engine therefore follows a failed
	// Settle with a fenced Release, which releases the claim only if it is
	// still in progress, so a retry either replays what committed or runs
	// afresh. The exception is an error wrapping ErrTxEnded: the handler's
	// transaction ended outside the store's control, so part of its work
	// may have committed, and the engine keeps the claim (Store.Keep) for
	// Config.Reconcile or an operator. After Settle the Tx is finished. Settle must not keep
	// outcome.Response's header map or body past its return: the adapter
	// reuses them for the next request.
	Settle(ctx context.Context, outcome Outcome) error
	// Rollback abandons the transaction. It is safe to call after Settle
	// and more than once. It returns an error wrapping ErrTxEnded when the
	// transaction had already ended outside the store's control (part of
	// the handler's work may have committed): the engine then keeps the
	// claim in progress instead of releasing it.
	Rollback(ctx context.Context) error
	// Used reports whether the handler ran anything through the
	// transaction's handle. A handler that answers 2xx without using it
	// wrote, if anything, outside the guarantee (through the pool); the
	// engine records it in Event.TxUsed.
	Used() bool
}
