// Package idemredis is an idemstore.Store on Redis or Valkey through go-redis v9
// (a redis.UniversalClient: a plain client, a Sentinel failover client or a
// Cluster client).
//
// # The trade-off: no shared transaction
//
// The SQL stores commit the handler's business writes and the stored
// response in one transaction. This store cannot: Redis holds the
// idempotency record, the handler's business writes go to the handler's
// own database, and nothing commits the two together. BeginTx begins
// nothing; the handler's handle is a NoTx (see Tx), which has no Commit
// and no Rollback because there is nothing to end. The claim can stand
// while the business write rolled back, and the business write can commit
// while the outcome is never stored.
//
// What makes that safe is the handler's part, and it is small: make the
// business write idempotent by its downstream key. Derive it with
// idem.DownstreamKey(ctx, "payment") (the same for every attempt at the
// key, takeovers included), store it in a column with a unique constraint
// beside the request's own fields (or a hash of them), insert with
// INSERT … ON CONFLICT (downstream_key) DO NOTHING, and when nothing was
// inserted read the existing row and compare it with the request: the same
// request is answered from the row; another one is answered 422
// (idem.ProblemKeyReused), with an error so that the key is released, not
// stored. The comparison is the engine's fingerprint check for the case
// where Redis lost the record that holds the fingerprint. A takeover then
// needs no Config.Reconcile: the handler run again reads and compares the
// row. A Reconcile that answered from the row would skip the comparison
// (it gets the stale record, not the request); one that returns nil, nil
// lets the handler decide. The README has the handler in full.
//
// The failures that open the gap, what each one does, and what closes it:
//
//	failure                                   what happens                                    what makes it safe
//	------------------------------------------------------------------------------------------------------------------------------
//	the process dies after the business       the record stays in progress: 409 with          the handler runs again and the unique
//	commit and before the settle              Retry-After until the lease expires, then a     column turns its insert into a read of
//	                                          retry takes the key over                        the same row, which it compares with the
//	                                                                                          request and answers from
//	Redis restarts without persistence (or    every record is gone: a settled key runs the    the unique column again: the re-run
//	evicts the record)                        handler again, an attempt in flight finds its   answers from the existing row, or 422 when
//	                                          record gone (409 lease lost)                    the row is another request's. Persistence
//	                                                                                          (appendonly) and maxmemory-policy
//	                                                                                          noeviction make it rare
//	failover to a replica that had not        two attempts hold the key at once, one on       the unique column lets one insert in; the
//	received the claim                        each primary; the old holder's settle misses    other answers from its row. WithWaitReplicas
//	                                          the fence (409 lease lost)                      narrows the window (the claim is on n
//	                                                                                          replicas before the handler runs)
//	the lease runs out under a slow handler   a retry takes over while the slow attempt       its settle is fenced (ErrLeaseLost); its
//	                                          still runs                                      business write meets the unique column.
//	                                                                                          NoTx.CheckLease before the business
//	                                                                                          commit narrows the window
//	a connection breaks under a script        go-redis sends the script again                 every script recognises its own token: a
//	(the answer lost)                                                                         resent claim or settle answers as the
//	                                                                                          first run did
//
// The tests play every row (a Redis of the test's own killed and started
// empty mid-run, a crash after the business write, a record lost under a
// key reused with another body, a failover to a server that missed the
// claim, connections cut under each script); RELIABILITY.md has the
// figures.
//
// # Records, expiry and takeover
//
// A record is one Redis hash per (principal, key), written only by Lua
// scripts that run atomically on the server and read the time from the
// server's TIME, never the application's clock. The claim script inserts
// the in-progress record, or takes over a stale lease, or returns the
// existing record and writes nothing (a replay is one round trip and no
// write); the settle, release and keep scripts are fenced by the lease
// token.
//
// The record's key expires by itself at the record's ExpiresAt (PEXPIREAT,
// claim time plus Retention, set again by a takeover), whether it is in
// progress or settled; the settle keeps it. The lease is not the key's time
// to live, deliberately: a record that vanished when its lease ran out
// would turn every takeover into a fresh claim, so Reclaimed would never be
// reported, Reconcile never asked, and ListStale (the sweeper's report of
// stuck claims) would see nothing. Instead the lease is a condition the
// claim script checks with TIME: the claim that takes a lease stores its
// deadline in the record (its now plus ClaimRequest.Lease, as
// Record.LeaseExpiresAt), and an in-progress record past its own deadline,
// with the same fingerprint, is taken over with a new token in the same
// atomic script that checked it, so the token it replaces cannot change in
// between and the stale holder's settle, release and keep miss the fence.
// The lease a later claim asks for decides nothing about the record it
// finds. The cost is that an abandoned in-progress record (its holder
// crashed and no client retried) stays until its retention ends, like a
// settled one.
//
// Keep (for an attempt whose outcome the engine does not know) marks the
// record Uncertain and sets its deadline to the server's now, leaving it in
// progress with the expiry its claim set. A claim takes such a record over
// only with ClaimRequest.TakeOverUncertain (the engine sets it when
// Config.Reconcile is set, which it then asks), and the takeover keeps the
// mark; otherwise the record is returned as it is and nothing is written.
// Settling or releasing the record clears the mark. The mark is as durable
// as the rest of the record: a Redis that loses the record loses it too,
// and the unique downstream-key column is then what stands between the
// retry and a second effect.
//
// PurgeExpired therefore deletes nothing and returns 0: Redis expires every
// record itself, so an idem.Sweeper has nothing to purge (it still reports
// stale claims).
//
// # Keys and Cluster slots
//
// Every key starts with the prefix (WithPrefix; DefaultPrefix "idem:"),
// then a Cluster hash tag naming one of IndexShards shards:
//
//	<prefix>{s<shard>}:r:<principal>:<key>   the record (a hash)
//	<prefix>{s<shard>}:inprogress             the shard's in-progress index (a sorted set)
//
// The principal and the key are escaped ('%', ':', '{', '}', space, DEL and
// control bytes as %XX), so no two (principal, key) pairs share a name, and
// the shard is a hash of both. A record and its shard's index carry the
// same tag, so they live in one Cluster slot, and every script declares
// both in KEYS. The index holds the shard's in-progress records scored by
// their lease deadline; the claim, settle, release and keep scripts
// maintain it. ListStale reads the indexes, never KEYS or SCAN: IndexShards
// script calls in one pipeline (one round trip per Cluster primary), each
// reading at most limit entries past their deadline, then those records.
// An index entry whose record expired while in progress is removed when
// ListStale meets it, once its deadline passed. RecordKey names a record
// for redis-cli.
//
// # Round trips
//
// A claim is one EVALSHA, whatever it finds (new, taken over, in progress,
// settled). A settle is one, a release one, a keep one, BeginTx none; a
// first request therefore costs two round trips and a replay one. With
// WithWaitReplicas a claim that granted the key is followed by WAIT, one
// more round trip; a replay still costs one. Check loads the scripts;
// after a restart or failover that emptied the script cache, go-redis
// falls back from EVALSHA to EVAL once per script.
//
// # Start-up
//
// Check pings every primary, verifies Redis or Valkey 5 or later (and, with
// WithWaitReplicas, that enough replicas are connected) and loads the
// scripts. Redis has no schema: Migrate does what Check does, so a program
// written for a SQL store's start-up works unchanged, and there is no
// Schema method.
package idemredis
