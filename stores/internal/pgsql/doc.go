// Package pgsql is the PostgreSQL statement set of idem's SQL stores: the
// claim, the takeovers, settle, release, keep, get, purge, list stale and
// stats, the handler's BEGIN with its lease marker and the settle's check
// of it, the Sync probes, the schema (Migrations, Table.SchemaSQL) and the
// schema check (CheckSQL, Diagnose). It is text and small helpers only, and
// imports no driver: the pgx store (stores/pgx) runs it through pgx's
// pipeline, and a database/sql store's PostgreSQL dialect can run the same
// text through pgx's stdlib or lib/pq, whose placeholders are also $n.
//
// How the statements are meant to run, and what each guarantee rests on:
//
//   - Every statement that names the table runs behind one of the preludes
//     (Statements.Prelude, ClaimPrelude, DurablePrelude) in the same
//     transaction: pipelined in one implicit transaction (one round trip,
//     as the pgx store does), or inside an explicit one. The preludes pin,
//     for that transaction only, every setting the statements depend on:
//     search_path (pg_catalog first, the table schema-qualified), the lock
//     and statement timeouts, the text formats where values travel as text
//     (Options.TextFormats), and synchronous_commit. The claim's own two
//     statements name every function and operator with its schema, so
//     their preludes (InsertPrelude, DurableInsertPrelude) leave the
//     search_path as the session has it.
//   - The claim is two statements, Claim and ClaimRead, pipelined behind
//     InsertPrelude or DurableInsertPrelude: an INSERT … ON CONFLICT DO NOTHING,
//     which writes nothing (no transaction id, no WAL) when the key exists,
//     then a SELECT of the row with its own snapshot. Two plain statements
//     cost the server fewer instructions than one statement that does both
//     (a CTE with UNION ALL and an anti-join, initialised on every run),
//     for first requests and replays alike, in the same round trip. They
//     need a pipeline to cost one round trip: pgx's (a database/sql store
//     on pgx's stdlib reaches it through the connection's Raw), or any
//     driver's that sends several extended-protocol statements before one
//     Sync.
//   - The handler's transaction begins with BEGIN and Statements.BeginSetup
//     pipelined, which sets the lease marker (LeaseSetting), the WAL
//     position a Sync waits for (SyncSetting) and, on a connection not
//     known to have them (BeginPeerSetup), the dead-peer bounds
//     (DeadPeerFor, DeadPeer.Pins).
//     The settle sends SettleCheck, Settle and COMMIT in one pipeline:
//     SettleCheck sets the dead-peer bounds again and raises with
//     TxEndedMarker when the marker is not the one BeginSetup set (the
//     transaction ended behind the store),
//     Settle raises with LeaseLostMarker when its fence missed, and either
//     error makes the server skip the COMMIT.
//
// Names are validated by ParseTable and quoted by Table.Ident; a table
// named without a schema is qualified by the store (CurrentSchemaSQL)
// before it builds its statements with New.
package pgsql
