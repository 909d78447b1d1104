// Package idemstore is the contract between the idem engine and the stores
// that keep its records: what a store implements and what it may use. It is
// for store authors; an application picks a store (idempgx, idemgorm,
// idemredis, memstore) and hands it to idem.Config.Store, and needs nothing
// from this package.
//
// A store implements [Store] and its transaction [Tx]:
//
//   - [Store.Claim] claims (principal, key) with one atomic statement and
//     answers a [ClaimResult]: the caller's own record when it won, or the
//     record to dispatch on. Every branch (insert, replace an expired or a
//     released record, take over a stale lease) is decided by the
//     statement's own answer, on the store's clock.
//   - [Store.BeginTx] begins the handler's transaction; [Tx.Settle] stores
//     the [Outcome] in it, fenced by the [Lease] token, and commits.
//     [Store.Release] and [Store.Keep] end a claim that stored nothing, or
//     whose outcome is unknown. A missed fence is [ErrLeaseLost].
//   - [Store.Get], [Store.PurgeExpired], [Store.ListStale] and
//     [Store.Stats] serve the sweeper and operators.
//
// The handle a store gives the handler refuses to end the transaction
// ([ErrTxOwned]) and reports a transaction that ended anyway ([ErrTxEnded]).
// A store wraps its driver's errors once with [WrapStoreError], so that
// [ErrTransient] and [ErrMisconfigured] are recognised with errors.Is; a
// [Checker] verifies its schema at start-up; a [Syncer] makes an
// asynchronously committed claim durable. Headers are kept byte-exact with
// [EncodeHeader], and every store holds the same limits
// ([MaxPrincipalLength], [MaxKeyLengthLimit], [MaxRequestIDLength],
// [BoundRequestID]).
//
// Package storetest is the suite every store passes, hostile handlers
// included; docs/stores.md in the repository says what a store looks like
// (constructor, options, accessor, errors, schema) and where each store
// departs from it.
//
// This package imports no other package of the module, so a store depends
// on the engine only in its tests.
package idemstore
