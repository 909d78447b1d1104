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
