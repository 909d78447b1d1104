// Package storetest is the conformance suite every idemstore.Store must pass.
// A store's own tests call Run with a function that makes a fresh Backend
// on a real server; the suite states the Store contract as tests.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// Backend is a Store plus what the suite needs to observe a store's
// transactions from outside: a business write made inside the store's
// transaction, and a count of committed business writes.
type Backend struct {
	// Store is the store under test. Each Backend must start empty, or use
	// principals and keys no other Backend sees (a fresh table or schema).
	Store idemstore.Store
	// WriteEffect records one business write for id inside the transaction
	// that ctx carries (as BeginTx returned it). It must fail when ctx
	// carries no transaction.
	WriteEffect func(ctx context.Context, id string) error
	// CountEffects returns the number of committed business writes for id.
	CountEffects func(ctx context.Context, id string) (int, error)
	// PoisonTx makes the transaction that ctx carries fail at commit, the
	// way a failed statement aborts a PostgreSQL transaction. Nil only with
	// NoSharedTx.
	PoisonTx func(ctx context.Context) error
	// SingleWriter is set for databases with one writer at a time
	// (SQLite): an open write transaction blocks every other write, so the
	// suite never holds one open while it expects another write to go
	// through.
	SingleWriter bool
	// NoSharedTx is set for stores that hand the handler no database
	// transaction (Redis): the handler's own writes are not atomic with the
	// stored outcome, so a failed or lost settle cannot undo them. The
	// tests and checks that need a shared transaction are reported as
	// skipped ("not applicable: …"), every other one runs, and PoisonTx may
	// be nil.
	NoSharedTx bool
	// SelfExpiring is set for stores whose records disappear by themselves
	// at ExpiresAt (Redis key expiry), so PurgeExpired has nothing to
	// delete and reports 0. The purge tests then check that the expired
	// records are gone, the live ones kept and nothing reported purged,
	// instead of counting deletions.
	SelfExpiring bool
	// NoNonce is set for stores that keep no per-record nonce because they
	// can lose records (Redis without persistence, a failover to a replica
	// that missed a write): a downstream key derived from a lost nonce
	// would change under the retry that the lost record lets run again, so
	// such a store keeps Record.Nonce empty and DownstreamKey is per key.
	// The nonce checks then expect an empty nonce everywhere.
	NoNonce bool

	// The hostile-handler section (RunHostile, part of Run) plays a handler
	// that misbehaves with the handle the store gave it. The fields below
	// are that handle's levers; a store whose handle lacks one declares
	// the cases that need it not applicable by leaving it nil, and the
	// suite reports them as skipped with the reason.

	// Dialect is the SQL dialect of the handle: "postgres", "mysql" or
	// "sqlite"; "" for a store whose handle runs no SQL (memstore, Redis).
	// It selects the statements the section sends.
	Dialect string
	// Exec runs sql with args through the handle the store gave the
	// handler (idempgx.Handle.Exec, gorm's db.Exec), as a handler would, and
	// returns its error. Required when Dialect is set.
	Exec func(ctx context.Context, sql string, args ...any) error
	// EndHandle calls the handle's own Commit (commit true) or Rollback,
	// as a handler would, and returns its error. Nil when the handle has
	// no such methods.
	EndHandle func(ctx context.Context, commit bool) error
	// EndTxAround ends the transaction by a route the handle cannot refuse
	// beforehand (the raw connection, which only idempgx's own tests reach; a deadlock the
	// server resolves by rolling the transaction back), so the store can
	// only notice afterwards. Nil when the store has no such route.
	EndTxAround func(ctx context.Context) error
	// ReplaceTxAround ends the transaction by a route around the handle and
	// begins another on the same connection, which the handle cannot tell
	// from its own (idempgx: COMMIT; BEGIN through the raw connection), so
	// only the settle's own check can find out. Nil when the store has no
	// such route.
	ReplaceTxAround func(ctx context.Context) error

	// The capabilities below tell the suite what a store can be measured
	// or starved by. Each zero value means "the store cannot": the cases
	// that need it are reported as skipped with the reason, every other
	// case runs as before.

	// Rounds is how many rounds the race cases run (concurrent claims of
	// one key, a takeover racing the holder's settle); 0 means
	// IDEM_STORETEST_ROUNDS, or 200 when that is not set. The takeover
	// race runs a quarter of them.
	Rounds int
	// CountTrips returns a fresh Backend whose store reaches its server
	// over one connection, and a counter of the round trips it has made
	// so far. The RoundTrips case runs each Store call twice (the first
	// warms per-connection caches such as prepared statements) and
	// checks that the second costs what Trips says. Nil for a store with
	// no server (memstore).
	CountTrips func(t testing.TB) (Backend, func() int64)
	// Trips is what each Store call costs in round trips once warm; see
	// CountTrips. A request through the engine costs Claim+Begin+Settle
	// when its handler runs nothing, a replay Replay, and a Rollback after
	// Settle costs nothing.
	Trips Trips
	// CountWrites returns a fresh Backend and a count its server raises
	// with every write it makes, seen by that store alone (Redis:
	// rdb_changes_since_last_save on a server of the test's own;
	// PostgreSQL: the versions of its table's rows, which any write or
	// lock changes), or at least between two reads that saw one. The
	// ReplayWritesNothing case then checks that replays, claims of a held
	// key or with another fingerprint, Get and ListStale write nothing,
	// while claims and a settle do. Nil when the store's writes cannot be
	// told apart from other clients' (the store's own tests then prove it
	// their way).
	CountWrites func(t testing.TB) (Backend, func() int64)
	// Pool returns a store on the same server whose connection pool holds
	// exactly size connections. The pool cases then check that
	// DownstreamKey needs no connection beyond the handler's, and, with
	// HandlerHoldsConn, that one principal cannot pin the pool. Nil for a
	// store with no pool (memstore).
	Pool func(t testing.TB, size int) idemstore.Store
	// HandlerHoldsConn is set for stores whose transaction holds one pool
	// connection for the handler's whole run (the SQL stores), so that a
	// principal's slow handlers can empty the pool.
	HandlerHoldsConn bool
	// Syncer is set for stores whose Tx is an idemstore.Syncer (the claim
	// commits asynchronously and Sync makes it durable); the suite then
	// checks Sync and durable claims.
	Syncer bool
	// DropConn makes the server drop the connection of the transaction
	// ctx carries while the handler runs (PostgreSQL's
	// pg_terminate_backend). Nil when the store's transaction holds no
	// connection of its own.
	DropConn func(ctx context.Context) error

	// The capabilities below reach a store's server from outside, to hold
	// a record, weaken its durability or point a store at nothing. Nil
	// means the store's server has no such lever: the case that needs it
	// is reported as skipped with the reason.

	// HoldRecord locks principal's record of key in a transaction of its
	// own that does not commit, as a settle that has run its UPDATE and
	// not yet committed holds it, until release is called or the test
	// ends. Nil for a store without row locks (memstore, Redis) or with
	// one writer (SQLite).
	HoldRecord func(t testing.TB, principal, key string) (release func())
	// LockBounded returns a store on the Backend's table whose waits for a
	// held record (HoldRecord) are bounded by bound, its lock timeout.
	// With HoldRecord, the BoundedWaits case checks that every call that
	// meets a held record answers idemstore.ErrTransient within it.
	LockBounded func(t testing.TB, bound time.Duration) idemstore.Store
	// StatementBounded returns a store on the Backend's table whose
	// statements are bounded by bound, its statement timeout, while its
	// lock timeout is longer; BoundedWaits then checks the same calls
	// under it. Nil when the store has no such second bound.
	StatementBounded func(t testing.TB, bound time.Duration) idemstore.Store
	// Durability returns a fresh Backend whose sessions start with the
	// server's wait for durability turned off (PostgreSQL's
	// synchronous_commit), as a handler may leave a pooled session, and
	// mark, which notes the server's write position (the WAL insert
	// position) and returns a func that reports whether the server's
	// durable storage (the flushed WAL) has passed it. The Durable case
	// then checks that a Durable claim, a Keep, a settle and an attempt's
	// first DownstreamKey return only once what came before is durable.
	// Nil for a server without such a position (memstore, Redis, MySQL).
	Durability func(t testing.TB) (b Backend, mark func() (flushedPast func() bool))
	// DurabilitySetting returns a fresh Backend whose store reaches its
	// server over one connection, and show, which reads the server's wait
	// for durability (PostgreSQL's synchronous_commit) in the handler's
	// transaction when ctx carries one, else on that connection's session.
	// The SessionKeepsDurability case then checks that claims, Durable or
	// not, and a settle leave the session's setting as it was and that the
	// handler's transaction starts with it. Nil for a server without such
	// a setting.
	DurabilitySetting func(t testing.TB) (b Backend, show func(ctx context.Context) string)
	// Misconfigured returns a store on the Backend's server whose table
	// does not exist; Unreachable, one on a server that does not answer.
	// The Misconfigured and Unreachable cases check how their errors
	// classify, through the store and through the engine.
	Misconfigured, Unreachable func(t testing.TB) idemstore.Store
	// Session returns a fresh Backend on the Backend's table and business
	// table whose every connection runs session when it opens, as the
	// sessions a handler left in the pool would be. The SessionLeftBehind
	// case then runs claims, replays, the fence, the stale listing and
	// purges on it. Nil when the store cannot start its sessions so.
	Session func(t testing.TB, session []string) Backend

	// The capabilities below let the Notify cases prove an
	// idemstore.Notifier. Nil Peer means the store does not notify: the
	// cases are reported as skipped, and waiters poll.

	// Peer returns a Store on the Backend's storage (the same table or
	// key space) as another process opens it, with a pool or client of
	// its own, which must implement idemstore.Notifier, and its levers.
	Peer func(t testing.TB) Peer
	// Eavesdrop listens to the storage's notifications from outside any
	// store (a LISTEN or SUBSCRIBE of the test's own) and returns the
	// NotifyIDs heard so far, in the order heard. Nil when the channel
	// cannot be reached from outside.
	Eavesdrop func(t testing.TB) (heard func() []string)
}

// Peer is a Store on a Backend's storage, as another process opens it,
// with what the Notify cases need to reach under it.
type Peer struct {
	// Store is the peer's store; it implements idemstore.Notifier.
	Store idemstore.Store
	// KillListener makes the server drop the peer's listening connection
	// (pg_terminate_backend, CLIENT KILL) and returns an error when it
	// found none.
	KillListener func() error
	// Acquired returns how many connections of the peer's pool are in
	// use. Nil when the pool cannot say.
	Acquired func() int
	// Listening returns how many listening connections of the peer the
	// server has (LISTENing or SUBSCRIBEd). Nil when the server cannot
	// say.
	Listening func() int
}

// Trips is what each Store call costs in round trips to the server, once
// the connection is warm: Claim of a new key, Begin (BeginTx), Settle
// (with its commit), Replay (a claim of a settled key), Conflict (a claim
// of a key another request holds), Takeover (of a stale claim), Release,
// Keep and Get; with Backend.Syncer, DurableClaim (a claim of a new key
// with ClaimRequest.Durable).
type Trips struct {
	Claim, Begin, Settle, Replay, Conflict, Takeover, Release, Keep, Get, DurableClaim int
}

// NewBackend makes a fresh Backend for one test; it registers its own
// cleanup with t.
type NewBackend func(t testing.TB) Backend
