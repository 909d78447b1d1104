// Package idem makes HTTP endpoints idempotent the way payment companies do:
// a client sends an Idempotency-Key header, the server claims the key
// atomically, runs the handler inside a database transaction that also
// stores the outcome, and answers every retry with the same response. Each
// request has exactly one effect, also when retries race each other, the
// process dies half way, or a dependency fails for a moment.
//
// # What an application writes
//
// Four things, and nothing else from this package is needed to start:
//
//  1. A store, which keeps the records and owns the transaction the handler
//     writes in: idempgx.New(pool) for PostgreSQL through pgx,
//     idemgorm.New(db) for GORM (PostgreSQL, MySQL/MariaDB, SQLite), or
//     memstore.MustNew() for tests. Create its table with the store's Migrate.
//  2. One [Engine], built once with [New] from a [Config]. New validates
//     the Config and asks the store to check itself, so a
//     misconfiguration or a store that was never migrated fails at
//     start-up, not on the first request.
//  3. The middleware of your framework's adapter (idemhttp, idemgin,
//     idemecho, idemfiber; idemgrpc for gRPC), given that Engine and a
//     Principal function, and placed after your authentication on the
//     routes that must be idempotent. Every middleware, the [Sweeper] and
//     [Engine.Do] share the one Engine: its per-route hold times and its
//     in-flight limit are its own.
//  4. Handlers that write through the store's transaction, which the
//     store's accessor takes from the request's context
//     (idempgx.Tx(ctx), idemgorm.Tx(ctx)). The store commits it together
//     with the stored response after the handler returns; the handler does
//     not commit, and cannot: Commit, Rollback and statements such as
//     COMMIT are refused with [ErrTxOwned]. To abandon the work, return an
//     error or a 5xx.
//
// For effects outside the database (a payment provider), send the provider
// the key [DownstreamKey] derives, and set [Config.Reconcile] to ask the
// provider what became of an attempt whose process died. Run a [Sweeper] to
// delete expired records and report stale claims, and an [Observer] to count
// outcomes.
//
// # What happens to one request
//
// The middleware authenticates (no principal: 401), parses the key (missing
// or invalid: 400), fingerprints the request (method, path, principal and
// the body, JSON canonicalised), and claims (principal, key) with one atomic
// statement on the database clock. Then:
//
//   - Claimed: the handler runs with a deadline ([Config.RequestTimeout])
//     and a buffered response. A 2xx/3xx is stored as completed and a
//     deterministic 4xx as failed, in the handler's transaction, fenced by
//     the lease token; then the buffered response is sent. Anything else (a
//     5xx, an error, a panic, the deadline, a failed commit) rolls back and
//     releases the key, so the retry really retries.
//   - Held by another attempt: 409 with Retry-After. Held past its lease
//     (the holder died): taken over, after asking Config.Reconcile.
//   - Completed or failed: the stored response, with Idempotent-Replayed:
//     true, and the handler does not run.
//   - Same key, different request: 422.
//
// Every response the library produces itself is an RFC 9457 problem whose
// type is one of the [ProblemType] constants; the [Event] of each request
// carries its [OutcomeLabel].
//
// # Beyond HTTP: the call API
//
// [Engine.Do] is the same state machine for anything that is not an HTTP
// request: a service method, a gRPC method (package idemgrpc), a queue
// message whose id is the key. The caller gives a [Call] (principal, key,
// operation name, the encoded input the fingerprint covers) and a function
// that runs in the store's transaction and returns a [Response] whose
// Status is in the caller's protocol ([Call.Classify] decides what is
// stored). Do returns the result, stored or replayed, or a [CallError]
// naming the case ([ProblemType]) for the caller to map to its protocol.
// The HTTP middleware is Do's first caller: Begin and Finish are its steps
// rendered as HTTP.
//
// # Writing a store or an adapter
//
// What stores implement lives in package idemstore, with its contract;
// what framework adapters are built on lives in package idemadapter. The
// engine's own entry for adapters, [Engine.Begin] with its [Request],
// [Attempt] and [Result], stays here because the engine implements it.
// Applications use neither package.
package idem
