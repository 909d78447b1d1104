package pgsql

import (
	"fmt"
	"time"
)

// Options are what the statements are built with besides the table.
type Options struct {
	// LockTimeout and StatementTimeout are pinned, rounded up to whole
	// milliseconds, for every store statement (lock_timeout and
	// statement_timeout), and StatementTimeout sets the dead-peer bound
	// of the handler's transaction (DeadPeerFor).
	LockTimeout, StatementTimeout time.Duration
	// TextFormats: the driver exchanges values as text (pgx's exec modes
	// Exec and SimpleProtocol, database/sql drivers that do not bind in
	// binary), so the statements also pin the text formats of
	// timestamps, intervals and bytea.
	TextFormats bool
	// SendTimes: the record-returning statements return each time, now()
	// included, as its binary form (timestamptz_send: a bytea of eight
	// bytes, big-endian microseconds since 2000-01-01 UTC), which reads
	// the same under every session setting. With TextFormats only
	// bytea_output is then pinned: no statement returns a time or an
	// interval as text, and none reads one from text (times are now()
	// plus integer microseconds, the interval literal is read when the
	// statement is parsed, before any pin applies).
	SendTimes bool
}

// Statements is the PostgreSQL statement set of a store, with the table
// and the timeouts filled in. The parameters of each statement are listed
// beside it; every statement that names the table is run behind one of
// the preludes, in the same implicit (or explicit) transaction, so that
// nothing a handler left on a pooled session changes what it does.
type Statements struct {
	// Prelude goes before every store statement on the pool, in the same
	// transaction: pinnedSettings. ClaimPrelude goes before the claim's
	// statements (takeovers included): the prelude with
	// synchronous_commit off. DurablePrelude goes before a durable claim's
	// statements and Keep: the prelude with DurableCommit.
	Prelude, ClaimPrelude, DurablePrelude string
	// InsertPrelude and DurableInsertPrelude are ClaimPrelude and
	// DurablePrelude without the search_path pin, for the statements that
	// name their schemas: the claim's own (Claim and ClaimRead), and
	// (DurableInsertPrelude) the settle where its pins are a statement of
	// their own.
	InsertPrelude, DurableInsertPrelude string
	// LocalPins are the prelude's timeouts (without the text formats, and
	// without the search_path, which the settle's statements do not depend
	// on) as SET LOCAL statements, for the settle's simple-protocol query
	// string, which runs in the transaction they pin: there a utility
	// statement costs the server less than a function call it parses and
	// plans anew each time. Each applies from the next statement on.
	LocalPins string

	// Claim: INSERT … ON CONFLICT DO NOTHING ($1 principal, $2 key,
	// $3 fingerprint, $4 token, $5 request id, $6 retention µs, $7 nonce,
	// $8 lease µs); rows affected 1 when it inserted. ClaimRead, sent
	// right behind it in the same pipeline: the row and now() ($1
	// principal, $2 key); no row when it was purged in between (run the
	// claim again).
	Claim, ClaimRead string
	// Takeover: a stale in_progress row ($1 principal, $2 key,
	// $3 fingerprint, $4 new token, $5 request id, $6 retention µs,
	// $7 old token, $8 lease µs, $9 take over an uncertain one).
	// Replace: a row past its retention, and Reuse: a released row
	// ($1–$7 as Takeover, $8 nonce, $9 lease µs). Each returns
	// RecordCols and now(), or no row when the fence missed.
	Takeover, Replace, Reuse string
	// Release and Keep: fenced UPDATEs ($1 principal, $2 key, $3 token);
	// rows affected 1 when they held the lease.
	Release, Keep string
	// Get returns RecordCols ($1 principal, $2 key). Purge deletes at
	// most $1 expired rows. ListStale returns RecordCols of at most $1
	// in_progress rows past their lease. Stats counts idemstore.Stats's
	// figures ($1 stale after µs): now(), in_progress, completed, failed,
	// released, stale, oldest locked_at, expired.
	Get, Purge, ListStale, Stats string

	// BeginSetup ($1 marker) runs right behind the BEGIN of the handler's
	// transaction, in the same pipeline: it sets the lease marker
	// (LeaseSetting) and the WAL position Sync waits for (SyncSetting),
	// for the transaction. BeginPeerSetup is BeginSetup that also sets the
	// dead-peer settings for the session (DeadPeer.Pins), for a connection
	// not known to have them.
	BeginSetup, BeginPeerSetup string
	// SettleCheck ($1 marker) and Settle ($1 principal, $2 key,
	// $3 token, $4 state, $5 status, $6 headers, $7 body) are the
	// settle's statements, pipelined with COMMIT: SettleCheck raises
	// with TxEndedMarker when the transaction is not the one BeginSetup
	// ran in, Settle with LeaseLostMarker when its fence missed.
	SettleCheck, Settle string

	cols, now string // RecordCols and now() as the statements return them
}

// pinnedSettings are the session settings the store's statements depend
// on, pinned with set_config(…, true) for the statement's transaction only:
// name resolution (the table is schema-qualified, and pg_catalog comes
// first so no schema of the handler's can shadow an operator or function)
// and the timeouts; with text, also the text formats of timestamps,
// intervals and bytea. A handler may change any of them, for its
// transaction or for the pooled session.
//
// The formats matter only where values travel as text (Options.TextFormats). The other modes send and
// receive every value the store uses (text, bytea, integers, booleans,
// timestamptz) in binary, which no session setting changes, so pinning them
// there would only cost the server four set_config calls per statement.
func pinnedSettings(o Options) string {
	return "pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),\n\t" + pathlessPins(o)
}

// pathlessPins are pinnedSettings without the search_path: for statements
// that name every function, operator and table with its schema.
func pathlessPins(o Options) string {
	pins := fmt.Sprintf(`pg_catalog.set_config('lock_timeout', '%dms', true),
	pg_catalog.set_config('statement_timeout', '%dms', true)`, millis(o.LockTimeout), millis(o.StatementTimeout))
	switch {
	case o.TextFormats && o.SendTimes:
		pins += `,
	pg_catalog.set_config('bytea_output', 'hex', true)`
	case o.TextFormats:
		pins += `,
	pg_catalog.set_config('TimeZone', 'UTC', true),
	pg_catalog.set_config('DateStyle', 'ISO, MDY', true),
	pg_catalog.set_config('IntervalStyle', 'postgres', true),
	pg_catalog.set_config('bytea_output', 'hex', true)`
	}
	return pins
}

// millis rounds d up to whole milliseconds.
func millis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// DeadPeer is how the server is told to notice a client that went silent
// in the handler's transaction: keepalive probes after Idle seconds of
// silence, every Interval seconds, Count of them unanswered; and
// tcp_user_timeout (UserTimeout, milliseconds) for data the client never
// acknowledges. SettleCheck, and BeginPeerSetup on a connection not
// known to have them, set them for the session (Pins).
type DeadPeer struct {
	Idle, Interval, Count int64 // seconds, seconds, probes
	UserTimeout           int64 // milliseconds
}

// DeadPeerFor derives the dead-peer settings from the statement timeout:
// the whole bound is about twice it.
func DeadPeerFor(statementTimeout time.Duration) DeadPeer {
	secs := func(d time.Duration) int64 { return max(1, int64((d+time.Second-1)/time.Second)) }
	p := DeadPeer{Idle: secs(statementTimeout), Interval: secs(statementTimeout / 4), Count: 4}
	p.UserTimeout = (p.Idle + p.Interval*p.Count) * 1000
	return p
}

// Total is how long, at most, the server keeps the transaction of a client
// that stopped answering.
func (p DeadPeer) Total() time.Duration { return time.Duration(p.UserTimeout) * time.Millisecond }

// Pins returns the set_config calls that put p into force for the session
// (is_local false), for a SELECT list. They are set for the session, not
// the transaction, because a transaction-local value is taken back when
// the transaction ends and the server applies each change with a
// setsockopt call: about nine socket calls per transaction that way. A
// session-level set_config to the value already in force makes no socket
// call. Set inside a transaction, they last only if it commits.
//
// How a store uses them: SettleCheck runs them in every settle, over
// whatever the handler set, and the settle's COMMIT keeps them for the
// session; a transaction that does not end in that COMMIT takes back the
// handler's changes with it. A connection is known to have them once a
// settle on it committed; until then its BEGIN is followed by
// BeginPeerSetup.
func (p DeadPeer) Pins() string {
	return fmt.Sprintf(`pg_catalog.set_config('tcp_keepalives_idle', '%d', false),
	pg_catalog.set_config('tcp_keepalives_interval', '%d', false),
	pg_catalog.set_config('tcp_keepalives_count', '%d', false),
	pg_catalog.set_config('tcp_user_timeout', '%d', false)`, p.Idle, p.Interval, p.Count, p.UserTimeout)
}

// LeaseSetting is the transaction-local setting BeginSetup puts a random
// marker into. SettleCheck checks it in the same transaction: a different value
// means the transaction BeginSetup ran in has ended and another one began
// (COMMIT; BEGIN by a route the handle does not see: the connection a
// QueryRewriter is given, a statement the SQL guard misreads), so its work may
// have committed without the outcome.
const LeaseSetting = "idem.lease"

// TxEndedMarker is in the error the settle's first statement raises when
// the marker is not the one BeginSetup set.
const TxEndedMarker = "idempgx transaction ended"

// SyncSetting is the transaction-local setting BeginSetup puts the WAL insert
// position into when the transaction begins: past the claim's commit
// record, which committed before the transaction began, and before anything
// the handler writes. Sync waits for the WAL to be flushed up to it.
const SyncSetting = "idem.sync_lsn"

// SyncMark is the expression that keeps the WAL insert position in
// SyncSetting for the rest of the transaction, for a SELECT list: BeginSetup's,
// and idemsql's BEGIN's.
const SyncMark = "pg_catalog.set_config('" + SyncSetting + "', pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text, true)"

// DurableCommit pins synchronous_commit, for the rest of the transaction it
// runs in, to a commit that waits for its WAL to be flushed: 'on' (and the
// synchronous standbys' flush, where there are any), or 'remote_apply'
// where that is in force already, which is stronger and which an
// application reading from its standbys relies on. A weaker value the
// handler or the server set ('off', 'local', 'remote_write') does not
// apply to it. The comparison names its operator: the statement is parsed
// under the session's search_path, before the one pinned beside it
// applies.
const DurableCommit = `pg_catalog.set_config('synchronous_commit',
	CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'remote_apply'
		THEN 'remote_apply' ELSE 'on' END, true)`

// RecordCols are the columns every record-returning statement returns, in
// this order.
const RecordCols = `principal, key, fingerprint, state, lease_token, request_id, nonce,
	created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body`

// recordCols are RecordCols and now() as the statements built with o
// return them: with SendTimes each time through timestamptz_send, named
// as its column. The five calls cost the server less than the three
// set_config calls for the text formats of times they make unnecessary,
// and those less than EXTRACT(EPOCH …) as an integer
// (bench/pgbench/callgrind.sh; docs/design-notes.md).
func recordCols(o Options) (cols, now string) {
	if !o.SendTimes {
		return RecordCols, "pg_catalog.now()"
	}
	send := func(c string) string { return "pg_catalog.timestamptz_send(" + c + ") AS " + c }
	cols = `principal, key, fingerprint, state, lease_token, request_id, nonce,
	` + send("created_at") + ", " + send("locked_at") + ", " + send("lease_expires_at") + ", " + send("expires_at") +
		`, uncertain, status, headers, body`
	return cols, "pg_catalog.timestamptz_send(pg_catalog.now())"
}

func New(t Table, o Options) Statements {
	var s Statements
	s.cols, s.now = recordCols(o)
	pins := pinnedSettings(o)
	T := t.Ident()
	s.Prelude = "SELECT " + pins
	s.LocalPins = fmt.Sprintf(`SET LOCAL lock_timeout = '%dms';
SET LOCAL statement_timeout = '%dms'`, millis(o.LockTimeout), millis(o.StatementTimeout))
	// The statements whose guarantee is durability commit durably whatever
	// the session says: Keep (a kept record that a crash took back would
	// be taken over and run again without Reconcile) and a Durable claim.
	s.DurablePrelude = s.Prelude + ",\n\t" + DurableCommit
	// A claim's commit does not wait for its WAL to reach disk (see the
	// claim below) unless the request asks for it (ClaimRequest.Durable):
	// synchronous_commit off for its implicit transaction only, so it is
	// safe behind PgBouncer and leaves the pool's sessions as they were.
	s.ClaimPrelude = s.Prelude + ",\n\tpg_catalog.set_config('synchronous_commit', 'off', true)"
	// Claim and ClaimRead name every function and operator with its
	// schema, so no search_path changes what they do, and their preludes
	// leave it out: pinning it costs the server about 12,000 instructions
	// per claim, a replay's whole cost being about 190,000
	// (bench/pgbench/callgrind.sh).
	s.InsertPrelude = "SELECT " + pathlessPins(o) + ",\n\tpg_catalog.set_config('synchronous_commit', 'off', true)"
	s.DurableInsertPrelude = "SELECT " + pathlessPins(o) + ",\n\t" + DurableCommit
	p := DeadPeerFor(o.StatementTimeout)
	// The handler's transaction begins with BEGIN ISOLATION LEVEL READ
	// COMMITTED READ WRITE (the store's pgx.TxOptions): READ COMMITTED is
	// explicit, as the claim's concurrency argument needs it whatever the
	// server's default; READ WRITE too, whatever a handler left in
	// default_transaction_read_only. BeginSetup follows it in the same
	// pipeline, sent like the store's other statements: in pgx's default
	// exec mode prepared, so the server parses and plans it once per
	// connection, not on every request. It sets the marker
	// and reads the WAL insert position Sync waits for (SyncSetting): in
	// the first statements on the transaction's connection after the
	// claim returned, since later the handler's own writes would be past
	// it, and those are not flushed before some commit follows them (see
	// SyncSQL). The keepalive settings bound how long the server keeps
	// this transaction for a client that went away (see DeadPeerTimeout).
	// They are session settings (DeadPeer.Pins), which SettleCheck sets in
	// every settle, so only a connection's first transaction sets them
	// here (BeginPeerSetup). The statement is parsed under the session's
	// search_path, so its function and type names carry their schema.
	s.BeginSetup = fmt.Sprintf(`SELECT %s,
	pg_catalog.set_config('%s', $1, true)`, SyncMark, LeaseSetting)
	s.BeginPeerSetup = s.BeginSetup + ",\n\t" + p.Pins()
	// The settle's first statement: the marker check, and the settings
	// pinned over whatever the handler set (SET LOCAL statement_timeout =
	// '1ms' included). It is its own statement because a timeout set in a
	// statement applies from the next one on. synchronous_commit is pinned
	// with them (DurableCommit): the response goes to the client once the
	// COMMIT returns, so the commit must be durable by then even if the
	// handler turned synchronous_commit off, for its transaction or for
	// the session; the claim's durability rides on it too. Its operators
	// and types are named with their schema: the statement is parsed, and
	// planned again whenever the search_path changed, under the handler's
	// search_path, which neither it nor the Settle after it pins, so a
	// handler's schema put before pg_catalog could otherwise supply an =
	// or a || that makes the check pass in another transaction
	// (IS NOT DISTINCT FROM cannot name its operator; a NULL marker, no
	// marker set at all, fails the = and raises). The keepalive
	// settings are put into force again (DeadPeer.Pins), over whatever the
	// handler set, before the settle's UPDATE takes the row lock: a client
	// that goes silent in the middle of its settle is dropped within
	// DeadPeerTimeout too.
	s.SettleCheck = fmt.Sprintf(`SELECT %s,
	%s,
	%s,
	CASE WHEN pg_catalog.current_setting('%s', true) OPERATOR(pg_catalog.=) $1::pg_catalog.text THEN 1
	ELSE ('%s: %s is '::pg_catalog.text OPERATOR(pg_catalog.||)
		pg_catalog.quote_nullable(pg_catalog.current_setting('%s', true)))::pg_catalog.int4 END`,
		pathlessPins(o), DurableCommit, p.Pins(), LeaseSetting, TxEndedMarker, LeaseSetting, LeaseSetting)
	// The claim, two statements pipelined behind ClaimPrelude in one
	// implicit transaction. The INSERT either inserts the caller's row
	// (rows affected 1) or finds the conflicting row and does nothing: no
	// row lock, no transaction id, no WAL, which is what makes a replay
	// free. The SELECT then reads the row with a snapshot of its own, taken
	// after the INSERT: the caller's row, or the conflicting one, committed
	// even when the INSERT had to wait for it. It returns no row only when
	// the row was purged in between; the caller runs the claim again.
	//
	// Two plain statements cost the server fewer instructions than one
	// that does both (a CTE, UNION ALL and an anti-join, all initialised on
	// every run; bench/pgbench/callgrind.sh).
	//
	// The claim's own commit does not wait for its WAL to reach disk (it
	// runs behind ClaimPrelude), so that a first request waits for one
	// disk flush, the settle's, instead of two. Until the WAL writer
	// flushes it (within wal_writer_delay, 200 ms by default) or a
	// synchronous commit does, a database crash can take the claim back,
	// its nonce included: the retry then finds no row, claims the key
	// afresh with a new nonce and runs the handler, without a takeover and
	// so without Config.Reconcile. What the handler did in the database
	// went with the crash too (its transaction had not committed), and so
	// did any nonce a downstream key was made of: idem.DownstreamKey waits
	// for the claim to be durable first (SyncSQL). But an effect
	// outside the database that does not go through DownstreamKey (an
	// email, a call to a provider without an idempotency key) may have
	// happened, and the retry does it again. Applications with such
	// effects set Config.DurableClaims (or Call.DurableClaim), which runs
	// the claim behind DurablePrelude: its commit waits for the flush. The
	// settle commits durably (see SettleCheck), which flushes the WAL up to
	// and including the claim. A replay assigns no transaction id, so it
	// has nothing to flush either way.
	s.Claim = fmt.Sprintf(`INSERT INTO %s (principal, key, fingerprint, state, lease_token, request_id, nonce,
	created_at, locked_at, lease_expires_at, expires_at, uncertain)
VALUES ($1, $2, $3, 'in_progress', $4, $5, $7, pg_catalog.now(), pg_catalog.now(),
	pg_catalog.now() OPERATOR(pg_catalog.+) ($8::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'),
	pg_catalog.now() OPERATOR(pg_catalog.+) ($6::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'), false)
ON CONFLICT (principal, key) DO NOTHING`, T)
	s.ClaimRead = fmt.Sprintf(`SELECT %[2]s, %[3]s FROM %[1]s WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2`,
		T, s.cols, s.now)

	// Taking over a stale in_progress row: fenced by the token the caller
	// saw, and the staleness re-checked on the row's latest version with
	// the statement's own now(): its own lease deadline, never the new
	// request's lease, and an Uncertain row only when the request may take
	// it ($9, ClaimRequest.TakeOverUncertain). Zero rows means someone else
	// changed the row (a Keep included). The nonce and the Uncertain mark
	// stay: the taken-over attempt's downstream keys are reused, and its
	// outcome is still unknown until Reconcile says.
	s.Takeover = fmt.Sprintf(`UPDATE %[1]s SET lease_token = $4, request_id = $5, locked_at = now(),
	lease_expires_at = now() + $8::bigint * interval '1 microsecond',
	expires_at = now() + $6::bigint * interval '1 microsecond'
WHERE principal = $1 AND key = $2 AND lease_token = $7 AND state = 'in_progress'
	AND fingerprint = $3 AND lease_expires_at <= now() AND (NOT uncertain OR $9::boolean)
RETURNING %[2]s, %[3]s`, T, s.cols, s.now)

	// Replacing a row past its retention: it counts as absent, so every
	// column starts afresh, the nonce included.
	s.Replace = fmt.Sprintf(`UPDATE %[1]s SET fingerprint = $3, state = 'in_progress', lease_token = $4,
	request_id = $5, nonce = $8, created_at = now(), locked_at = now(),
	lease_expires_at = now() + $9::bigint * interval '1 microsecond',
	expires_at = now() + $6::bigint * interval '1 microsecond',
	uncertain = false, status = NULL, headers = NULL, body = NULL
WHERE principal = $1 AND key = $2 AND lease_token = $7 AND expires_at <= now()
RETURNING %[2]s, %[3]s`, T, s.cols, s.now)

	// Claiming a released row: the key is free, so the new attempt's
	// fingerprint, token, lease and retention replace the old, fenced by
	// the released token and re-checked on the row's latest version. The
	// nonce stays for the same request (the same fingerprint: the released
	// attempt's downstream keys reach the provider again and are
	// deduplicated); another request is another downstream operation and
	// gets the new one. In SET, fingerprint is the row's old value.
	s.Reuse = fmt.Sprintf(`UPDATE %[1]s SET fingerprint = $3, state = 'in_progress', lease_token = $4,
	request_id = $5, nonce = CASE WHEN fingerprint = $3 THEN nonce ELSE $8 END,
	created_at = now(), locked_at = now(),
	lease_expires_at = now() + $9::bigint * interval '1 microsecond',
	expires_at = now() + $6::bigint * interval '1 microsecond', uncertain = false
WHERE principal = $1 AND key = $2 AND lease_token = $7 AND state = 'released' AND expires_at > now()
RETURNING %[2]s, %[3]s`, T, s.cols, s.now)

	// A release keeps the row, and with it the nonce, until it expires.
	s.Release = fmt.Sprintf(`UPDATE %s SET state = 'released', uncertain = false
WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'`, T)

	// Keep leaves the row in progress under its token, marks it Uncertain
	// and ends its lease, so that the next claim finds it stale at once.
	s.Keep = fmt.Sprintf(`UPDATE %s SET uncertain = true, lease_expires_at = now()
WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'`, T)

	s.Get = fmt.Sprintf(`SELECT %[2]s FROM %[1]s WHERE principal = $1 AND key = $2`, T, s.cols)

	// Several sweepers can run at once: each locks its own batch and skips
	// rows another holds. The locking re-checks state and expires_at on the
	// latest version of a row that changed after the snapshot. Settled rows
	// come from the expires_at index, which holds only them; the few
	// expired in_progress rows (abandoned claims) from the lease_expires_at
	// index, which holds only those; the batch takes settled rows first.
	s.Purge = fmt.Sprintf(`WITH settled AS (
	SELECT principal, key FROM %[1]s
	WHERE state <> 'in_progress' AND expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
), held AS (
	SELECT principal, key FROM %[1]s
	WHERE state = 'in_progress' AND expires_at <= now()
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS t USING (
	SELECT principal, key FROM settled
	UNION ALL
	SELECT principal, key FROM held
	LIMIT $1
) AS d
WHERE t.principal = d.principal AND t.key = d.key`, T)

	s.ListStale = fmt.Sprintf(`SELECT %[2]s FROM %[1]s
WHERE state = 'in_progress' AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT $1`, T, s.cols)

	// The settle, fenced by the lease token. It is pipelined with COMMIT in
	// one round trip, so a missed fence must not merely report zero rows: it
	// must abort the transaction, or the COMMIT queued behind it would commit
	// the handler's writes without the outcome. The CASE raises an error
	// (SQLSTATE 22P02, carrying LeaseLostMarker) unless the UPDATE changed
	// a row, which the primary key makes at most one; the server then skips
	// the COMMIT. EXISTS over the CTE costs the server less than count(*),
	// whose aggregate is set up on every run. The error's text calls a
	// function that is not immutable, pg_backend_pid(): the planner would
	// otherwise evaluate the cast of a constant text, and raise, while it
	// plans the statement. It names every function, operator and type with
	// its schema, so it does what it says under the handler's search_path,
	// and the statement before it (SettleCheck) leaves the search_path
	// alone: pinning it costs the server about 10,000 instructions per
	// settle (bench/pgbench/callgrind.sh).
	s.Settle = fmt.Sprintf(`WITH u AS (
	UPDATE %s SET state = $4, status = $5, headers = $6::pg_catalog.bytea, body = $7, uncertain = false
	WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2
		AND lease_token OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'
	RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT FROM u) THEN 1
	ELSE ('%s: fenced update matched no row (backend '::pg_catalog.text
		OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.||) ')')::pg_catalog.int4 END`, T, LeaseLostMarker)
	s.Stats = fmt.Sprintf(`SELECT now(),
	count(*) FILTER (WHERE state = 'in_progress'),
	count(*) FILTER (WHERE state = 'completed'),
	count(*) FILTER (WHERE state = 'failed'),
	count(*) FILTER (WHERE state = 'released'),
	count(*) FILTER (WHERE state = 'in_progress' AND locked_at <= now() - $1::bigint * interval '1 microsecond'),
	min(locked_at) FILTER (WHERE state = 'in_progress'),
	count(*) FILTER (WHERE expires_at <= now())
FROM %s`, T)
	return s
}

// SyncSQL reads, on the transaction's connection, the WAL position
// BeginSetup took (SyncSetting, NULL if the handler removed it), the
// insert position now and the flush position, as text: the first poll of
// a Sync. SyncPollSQL reads the flush position again. Both call only
// pg_catalog functions, so nothing in the handler's session changes what
// they do, and neither can fail in a transaction that is not aborted.
const (
	SyncSQL = `SELECT pg_catalog.current_setting('` + SyncSetting + `', true),
	pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text, pg_catalog.pg_current_wal_flush_lsn()::pg_catalog.text`
	SyncPollSQL = `SELECT pg_catalog.pg_current_wal_flush_lsn()::pg_catalog.text`
)

// NudgeSQL is the statement of a Nudge, run alone on a connection that is
// in no transaction: a transaction of its own that takes a transaction id,
// so that its commit writes a record, and commits with synchronous_commit
// on, so that the commit flushes the WAL up to that record, past whatever
// was written before it.
const NudgeSQL = `SELECT pg_catalog.set_config('synchronous_commit', 'on', true), pg_catalog.txid_current()`

// LeaseLostMarker is in the error the settle statement raises when its fence
// misses. It is not a valid integer, which is how it raises.
const LeaseLostMarker = "idempgx lease lost"
