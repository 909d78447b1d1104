// Package idempgx is an idemstore.Store on PostgreSQL through pgx v5 and
// pgxpool. It shares the handler's transaction: BeginTx begins a real
// READ COMMITTED transaction and puts a Handle on it into the request's
// context (handlers get it with Tx), the handler's own writes go into it,
// and Settle stores the response in the same transaction, fenced by the
// lease token, and commits. Either both the handler's writes and the
// stored response commit, or neither does.
//
// The transaction is sealed. The Handle has the methods of sqlc's DBTX
// (Exec, Query, QueryRow, SendBatch, CopyFrom) and Begin, which opens a
// savepoint, and no Commit, Rollback or Conn: ending the transaction, or
// reaching around it, does not compile. Transaction-control statements
// are refused (idemstore.ErrTxOwned), a failed statement aborts the transaction as
// PostgreSQL does, and a transaction that ended anyway (by a route the
// handle does not see) is detected and reported as idemstore.ErrTxEnded: its
// claim is never released, and the engine keeps it (Keep) in progress,
// marked uncertain, for Config.Reconcile or an operator.
//
// Each record carries its lease deadline (lease_expires_at, the database's
// clock): an in-progress record past it is stale, whatever lease the next
// request asks for.
//
// Round trips in the common case: a first request costs the claim (1),
// BEGIN (1) and the settle with its COMMIT (1, one pipelined batch) beyond
// the handler's own queries. A replay costs one round trip and writes
// nothing: no transaction id, no WAL. The claim commits without waiting
// for its WAL flush unless it is Durable (idem.Config.DurableClaims);
// idem.DownstreamKey waits for the flush on the transaction's own
// connection (the Tx is an idemstore.Syncer), and the settle always commits
// durably.
//
// The claim and the other store calls run as single autocommit statements
// on the pool, each pipelined behind a statement that pins the session
// settings they depend on (search_path, lock and statement timeouts, and
// with the text exec modes TimeZone, DateStyle, IntervalStyle and
// bytea_output; synchronous_commit where durability is what the statement
// guarantees) for that implicit transaction only, so nothing a handler
// left on a pooled connection changes what they do. All times are the
// database's clock.
package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/stores/internal/fanout"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// Store is an idemstore.Store backed by one PostgreSQL table. It is safe for
// concurrent use by many goroutines and many processes sharing the
// database. Create it with New.
type Store struct {
	pool        *pgxpool.Pool
	table       pgsql.Table
	txTimeout   time.Duration
	maxAttempts int
	timeouts    timeouts
	sql         pgsql.Statements
	deadPeer    pgsql.DeadPeer // the settings BeginTx and Settle put into force (DeadPeerTimeout)

	notify  bool       // WithNotifications
	channel string     // the notification channel (channelName)
	hub     fanout.Hub // Subscribe's subscriptions and listener

	// The statements sent through pgconn (direct.go).
	direct      bool // the pool prepares statements: claims and settles go through pgconn
	directSQL   [numDirect]string
	directNames [numDirect]string
	preparedKey string
	tracer      pgx.BatchTracer // the pool's, told of every direct batch

	reruns atomic.Int64 // claims run again (a row purged between the claim's statements, a lost takeover race)
	ended  endedLeases  // leases whose transaction ended behind the store's back
}

// Option configures a Store.
type Option func(*config) error

type config struct {
	table       string
	txTimeout   time.Duration
	maxAttempts int
	timeouts    timeouts
	notify      bool
}

// timeouts are the server-side bounds on the store's own statements.
type timeouts struct {
	lock, statement time.Duration
}

// Defaults for WithLockTimeout and WithStatementTimeout: a store call that
// meets a row another transaction holds gives up (as a transient error)
// well before idem's default StoreTimeout of 5 s.
const (
	DefaultLockTimeout      = 2 * time.Second
	DefaultStatementTimeout = 4 * time.Second
)

// maxTimeout bounds the timeouts: PostgreSQL takes at most 2^31-1 ms.
const maxTimeout = 24 * time.Hour

// WithTable sets the table name, "table" or "schema.table", each part a
// plain identifier (letters, digits, underscore, not starting with a
// digit; the table part at most 40 bytes). Names are quoted, so they are
// case-sensitive. A name without a schema is qualified by New with the
// schema the pool's search_path selects then (current_schema()), and never
// looked up through search_path afterwards. The default is DefaultTable.
func WithTable(name string) Option {
	return func(c *config) error {
		if _, err := parseTable(name); err != nil {
			return err
		}
		c.table = name
		return nil
	}
}

// WithTxTimeout bounds BEGIN and ROLLBACK, which run on a context detached
// from the request's cancellation (a client hanging up must not strand a
// transaction). The default is 10 seconds.
func WithTxTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idempgx: tx timeout must be positive, got %v", d)
		}
		c.txTimeout = d
		return nil
	}
}

// WithLockTimeout sets PostgreSQL's lock_timeout for the store's own
// statements (claim, takeover, release, keep, get, purge, list, settle): a claim
// or release that meets a row held by another transaction, such as an
// uncommitted settle, fails after d with an error wrapping
// idemstore.ErrTransient (SQLSTATE 55P03) instead of waiting for it. It is set
// per statement, never on the session, and overrides whatever the handler
// set. d is rounded up to a millisecond and must be between 1 ms and 24 h.
// The default is DefaultLockTimeout.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 || d > maxTimeout {
			return fmt.Errorf("idempgx: lock timeout must be positive and at most %v, got %v", maxTimeout, d)
		}
		c.timeouts.lock = d
		return nil
	}
}

// WithStatementTimeout sets PostgreSQL's statement_timeout for the store's
// own statements, like WithLockTimeout: past d a statement is cancelled
// with an error wrapping idemstore.ErrTransient (SQLSTATE 57014). It also
// bounds how long the server keeps the handler's transaction open for a
// client that went silent: TCP keepalives and tcp_user_timeout are set on
// the transaction's session, by its BEGIN and again by its settle, so that
// a dead client is noticed within about 2 × d (DeadPeerTimeout), and its
// transaction, with any row lock a half-sent settle took, is rolled back. d is rounded up to a millisecond and must
// be between 1 ms and 24 h. The default is DefaultStatementTimeout.
func WithStatementTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 || d > maxTimeout {
			return fmt.Errorf("idempgx: statement timeout must be positive and at most %v, got %v", maxTimeout, d)
		}
		c.timeouts.statement = d
		return nil
	}
}

// WithNotifications turns on the store's notifications (Subscribe, which
// the engine uses for Config.WaitInFlight): a request waiting for a key's
// holder on another instance is then woken by the holder's settle or
// release through PostgreSQL's LISTEN/NOTIFY instead of at its next poll
// (25 ms doubling to 500 ms). They cost commits: once a process
// subscribed, its settles and releases NOTIFY, and PostgreSQL serialises
// notifying commits on one cluster-wide lock held through the commit's
// flush, so settles take longer and fewer commit at once (see
// BENCHMARKS.md). Without this option Subscribe returns
// idemstore.ErrNotificationsOff, nothing is ever notified, and waiters on
// the instance that holds the key are still woken in-process at once.
func WithNotifications() Option {
	return func(c *config) error {
		c.notify = true
		return nil
	}
}

// WithMaxClaimAttempts bounds how many times Claim re-runs its statement
// when a concurrent request changed the row between its statements (each
// retry follows somebody else's progress, so a few are plenty). Past the
// bound Claim returns an error wrapping idemstore.ErrTransient. The default is
// 16.
func WithMaxClaimAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("idempgx: max claim attempts must be at least 1, got %d", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// New returns a Store on pool. It touches the database only to qualify a
// table name given without a schema (one SELECT current_schema(), bounded
// by the tx timeout); create the table with Migrate or with your own
// migration tool (see Migrations and Schema), and call Check at start-up.
// It returns an error for a nil pool, an invalid option, or a search_path
// that names no existing schema (wrapping idem.ErrMisconfigured).
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idempgx: nil pool")
	}
	c := config{table: DefaultTable, txTimeout: 10 * time.Second, maxAttempts: 16,
		timeouts: timeouts{lock: DefaultLockTimeout, statement: DefaultStatementTimeout}}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	t, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	if t.Schema == "" {
		if t.Schema, err = currentSchema(pool, c.txTimeout); err != nil {
			return nil, err
		}
	}
	mode := pool.Config().ConnConfig.DefaultQueryExecMode
	s := &Store{pool: pool, table: t, txTimeout: c.txTimeout, maxAttempts: c.maxAttempts,
		timeouts: c.timeouts, deadPeer: pgsql.DeadPeerFor(c.timeouts.statement), notify: c.notify, channel: channelName(t.Ident()),
		sql: pgsql.New(t, pgsql.Options{LockTimeout: c.timeouts.lock, StatementTimeout: c.timeouts.statement,
			TextFormats: textFormats(mode)})}
	s.initDirect(mode)
	return s, nil
}

// currentSchema returns the schema the pool's search_path selects.
func currentSchema(pool *pgxpool.Pool, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var schema *string
	if err := pool.QueryRow(ctx, pgsql.CurrentSchemaSQL).Scan(&schema); err != nil {
		return "", wrap("new: current schema", err)
	}
	if schema == nil || *schema == "" {
		return "", wrap("new", fmt.Errorf("%w: the search_path names no existing schema: fix it, or name the schema in WithTable(\"schema.table\")", idem.ErrMisconfigured))
	}
	return *schema, nil
}

// DeadPeerTimeout returns how long, at most, the server keeps the
// handler's transaction open for a client that stopped answering (a
// crashed host, a network partition): the TCP keepalive idle time plus its
// probes, which BeginTx sets, with tcp_user_timeout, for the
// connection's session: every settle sets them again, over whatever the
// handler set, and the pooled connection keeps them. It is derived from the statement timeout: about twice it. Without
// it the operating system's defaults (often 2 h 11 min) would hold the
// transaction, and any row lock a half-sent settle took, that long.
// Connections over a Unix socket ignore these settings.
func (s *Store) DeadPeerTimeout() time.Duration {
	return pgsql.DeadPeerFor(s.timeouts.statement).Total()
}

// Table returns the quoted, possibly schema-qualified, table name the store
// uses, ready to put into SQL.
func (s *Store) Table() string { return s.table.Ident() }

// Migrate creates the table and its indexes if they do not exist, then
// runs Check, so that a table of the same name created otherwise (an older
// schema, one without lease_expires_at and uncertain included) is reported
// as a *SchemaError. It is safe to run from several
// instances at once: it serialises them with a transaction-scoped advisory
// lock. It does not create the schema: a schema other than "public" must
// exist.
func (s *Store) Migrate(ctx context.Context) error {
	ddl := s.table.SchemaSQL()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return wrap("migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The DDL's defaults, checks and index predicate bind their functions
	// and operators when created: from pg_catalog, whatever the session's
	// search_path says.
	if _, err := tx.Exec(ctx, pgsql.MigrateLockSQL, s.table.MigrateLockKey()); err != nil {
		return wrap("migrate", err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		// An older table of the same name, which CREATE TABLE IF NOT
		// EXISTS left alone, fails the index on a column it lacks: say
		// what it lacks.
		_ = tx.Rollback(ctx)
		var se *SchemaError
		if cerr := s.Check(ctx); errors.As(cerr, &se) {
			return se
		}
		return wrap("migrate", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return wrap("migrate", err)
	}
	// An older table of the same name is left as it is by CREATE TABLE IF
	// NOT EXISTS: say so now rather than at the first request.
	return s.Check(ctx)
}

// textFormats reports whether the pool's statements exchange values as
// text (pinnedSettings).
func textFormats(mode pgx.QueryExecMode) bool {
	return mode == pgx.QueryExecModeExec || mode == pgx.QueryExecModeSimpleProtocol
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// query runs stmt on a pool connection, pipelined behind the prelude in one
// batch (one round trip, one implicit transaction), and calls each for
// every row it returns.
func (s *Store) query(ctx context.Context, each func(pgx.Rows) error, stmt string, args ...any) error {
	return s.queryBehind(ctx, s.sql.Prelude, each, stmt, args...)
}

// queryBehind is query behind another prelude.
func (s *Store) queryBehind(ctx context.Context, prelude string, each func(pgx.Rows) error, stmt string, args ...any) error {
	b := newBatch()
	b.queue(prelude)
	b.queue(stmt, args...)
	br := s.pool.SendBatch(ctx, &b.Batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return err
	}
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			if err = each(rows); err != nil {
				break
			}
		}
	}
	if rows != nil {
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// exec is query for a statement that returns no rows.
func (s *Store) exec(ctx context.Context, stmt string, args ...any) (pgconn.CommandTag, error) {
	return s.execBehind(ctx, s.sql.Prelude, stmt, args...)
}

// execBehind is exec behind another prelude.
func (s *Store) execBehind(ctx context.Context, prelude, stmt string, args ...any) (pgconn.CommandTag, error) {
	b := newBatch()
	b.queue(prelude)
	b.queue(stmt, args...)
	br := s.pool.SendBatch(ctx, &b.Batch)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// The bounds Claim holds on what it stores, in bytes. The table has no
// CHECK constraints (PostgreSQL would parse them on every write); these take
// their place.
const (
	maxFingerprint = 255
	maxNonce       = 64
)

// Claim implements idemstore.Store. The common case is one batch (one round
// trip: the settings it pins, the INSERT and the SELECT of the row); a
// replay writes nothing. A row past its ExpiresAt is replaced, a released
// row is claimed (keeping its nonce for the same fingerprint), and an
// in-progress row with the same fingerprint past its own LeaseExpiresAt is
// taken over (an Uncertain one only with req.TakeOverUncertain), each by
// one fenced UPDATE that re-checks its condition against the row's latest
// version with the database clock. When that UPDATE matches nothing,
// someone else changed the row and the claim starts over. A row another
// transaction holds (an uncommitted settle) is waited for at most the lock
// timeout (WithLockTimeout); past it Claim returns an error wrapping
// idemstore.ErrTransient.
//
// The claim commits without waiting for its WAL to be flushed, unless
// req.Durable: then its commit waits, as the settle's does (see
// Config.DurableClaims). Until the flush a database crash can take the
// claim back; idem.DownstreamKey waits for it (the Tx BeginTx returns is
// an idemstore.Syncer).
//
// When the connection breaks under a claim statement (up to
// maxConnRetries times) the claim runs again on another connection. That is
// safe whether or not the server executed the lost statement: a row that
// carries req.Token can only have been written by this call, so finding it
// means the lost statement did claim the key.
//
// Claim refuses a fingerprint over 255 bytes and a nonce over 64, and cuts
// the request id with idemstore.BoundRequestID, as the table's CHECKs once did.
func (s *Store) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	switch {
	case req.Principal == "" || req.Key == "" || req.Token == "" || req.Nonce == "":
		return idemstore.ClaimResult{}, errors.New("idempgx: claim: principal, key, token and nonce must not be empty")
	case len(req.Fingerprint) > maxFingerprint:
		return idemstore.ClaimResult{}, fmt.Errorf("idempgx: claim: fingerprint is %d bytes, the store holds %d", len(req.Fingerprint), maxFingerprint)
	case len(req.Nonce) > maxNonce:
		return idemstore.ClaimResult{}, fmt.Errorf("idempgx: claim: nonce is %d bytes, the store holds %d", len(req.Nonce), maxNonce)
	}
	req.RequestID = idemstore.BoundRequestID(req.RequestID)
	prelude, insertPrelude := s.sql.ClaimPrelude, s.sql.InsertPrelude
	if req.Durable {
		prelude, insertPrelude = s.sql.DurablePrelude, s.sql.DurableInsertPrelude
	}
	connRetries := 0
	lostTakeover := false // a stale takeover's answer was lost
	retryable := func(err error) bool {
		if retryClaim(err) {
			return true
		}
		if (connLost(ctx, err) || stale(err)) && connRetries < maxConnRetries {
			connRetries++
			return true
		}
		return false
	}
	for attempt := 0; attempt < s.maxAttempts; attempt++ {
		if attempt > 0 {
			s.reruns.Add(1)
		}
		inserted, rec, now, found, err := s.claimOnce(ctx, insertPrelude, req)
		if err != nil {
			if retryable(err) {
				continue
			}
			return idemstore.ClaimResult{}, wrap("claim", err)
		}
		switch {
		case !found:
			// The row the INSERT met was purged before the SELECT read
			// it: run the claim again.
			continue
		case inserted:
			return idemstore.ClaimResult{Claimed: true, Record: rec, Now: now}, nil
		case rec.LeaseToken == req.Token && rec.State == idemstore.StateInProgress:
			// Our own statement claimed it, and its answer was lost.
			return idemstore.ClaimResult{Claimed: true, Reclaimed: lostTakeover, Record: rec, Now: now}, nil
		case !now.Before(rec.ExpiresAt):
			res, ok, err := s.takeOver(ctx, prelude, s.sql.Replace, req, rec.LeaseToken, req.Nonce, micros(req.Lease))
			if err != nil && retryable(err) {
				continue
			}
			if err != nil || ok {
				return res, err
			}
		case rec.State == idemstore.StateReleased:
			res, ok, err := s.takeOver(ctx, prelude, s.sql.Reuse, req, rec.LeaseToken, req.Nonce, micros(req.Lease))
			if err != nil && retryable(err) {
				continue
			}
			if err != nil || ok {
				return res, err
			}
		case rec.State == idemstore.StateInProgress && !now.Before(rec.LeaseExpiresAt) &&
			string(rec.Fingerprint) == string(req.Fingerprint) && (!rec.Uncertain || req.TakeOverUncertain):
			res, ok, err := s.takeOver(ctx, prelude, s.sql.Takeover, req, rec.LeaseToken, micros(req.Lease), req.TakeOverUncertain)
			if err != nil && retryable(err) {
				lostTakeover = true
				continue
			}
			if err != nil || ok {
				res.Reclaimed = ok
				return res, err
			}
		default:
			return idemstore.ClaimResult{Record: rec, Now: now}, nil
		}
	}
	return idemstore.ClaimResult{}, fmt.Errorf("idempgx: claim: %w: gave up after %d attempts under contention", idemstore.ErrTransient, s.maxAttempts)
}

// claimOnce runs the claim's batch: the prelude (InsertPrelude or
// DurableInsertPrelude), the INSERT and the SELECT, one round trip. inserted reports whether the INSERT wrote the
// row; found whether the SELECT returned one.
func (s *Store) claimOnce(ctx context.Context, prelude string, req idemstore.ClaimRequest) (inserted bool, rec idem.Record, now time.Time, found bool, err error) {
	if s.direct {
		return s.claimDirect(ctx, req)
	}
	b := newBatch()
	b.queue(prelude)
	b.queue(s.sql.Claim, req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, micros(req.Retention), req.Nonce,
		micros(req.Lease))
	b.queue(s.sql.ClaimRead, req.Principal, req.Key)
	br := s.pool.SendBatch(ctx, &b.Batch)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err = br.Exec(); err != nil {
		return false, rec, now, false, err
	}
	tag, err := br.Exec()
	if err != nil {
		return false, rec, now, false, err
	}
	row := br.QueryRow()
	rec, err = scanRecord(row, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, rec, now, false, nil
	}
	if err != nil {
		return false, rec, now, false, err
	}
	return tag.RowsAffected() == 1, rec, now, true, nil
}

// maxConnRetries bounds how often one Claim re-runs after losing its
// connection, so that a database that is down fails the claim quickly.
const maxConnRetries = 2

// retryClaim reports whether the claim statement failed in a way that
// re-running it resolves: under a default isolation level above READ
// COMMITTED the snapshot race surfaces as a serialization failure instead
// of an empty result. The statement is atomic, so it had no effect.
func retryClaim(err error) bool {
	code := sqlState(err)
	return code == "40001" || code == "40P01"
}

// takeOver runs a fenced takeover UPDATE (stale lease, expired or released
// record) behind prelude. ok is false when it matched no row.
func (s *Store) takeOver(ctx context.Context, prelude, query string, req idemstore.ClaimRequest, oldToken string, extra ...any) (idemstore.ClaimResult, bool, error) {
	args := append([]any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID,
		micros(req.Retention), oldToken}, extra...)
	var (
		rec   idem.Record
		now   time.Time
		found bool
	)
	err := s.queryBehind(ctx, prelude, func(rows pgx.Rows) error {
		if found {
			return nil
		}
		var err error
		rec, err = scanRecord(rows, &now)
		found = err == nil
		return err
	}, query, args...)
	if err != nil {
		if retryClaim(err) {
			return idemstore.ClaimResult{}, false, nil
		}
		return idemstore.ClaimResult{}, false, wrap("claim: take over", err)
	}
	if !found {
		return idemstore.ClaimResult{}, false, nil
	}
	return idemstore.ClaimResult{Claimed: true, Record: rec, Now: now}, true, nil
}

// Release implements idemstore.Store: an UPDATE to 'released' fenced by the
// lease token and the in_progress state, clearing Uncertain; the row keeps
// its nonce until it expires; a store with a subscription (Subscribe) sends
// its pg_notify in the same batch. It returns idemstore.ErrLeaseLost when the row is
// gone, settled, released or held by another token. An UPDATE whose
// connection broke is sent again on another connection; if the lost one
// did release the row, the second matches nothing and reports
// ErrLeaseLost, which is true: the lease holds nothing any more. A row
// another transaction holds is waited for at most the lock timeout. Its
// commit is as durable as the session makes it: a release a crash took
// back leaves the claim in progress until its lease ends, and the next
// takeover runs the handler, which is what the release allowed anyway.
//
// Release changes nothing, and returns an error wrapping idemstore.ErrTxEnded,
// for a lease whose transaction this store saw end behind its back (a
// COMMIT by a route the handle does not see, then an error answer):
// part of that work may have committed, so the claim must be kept (Keep),
// never released.
func (s *Store) Release(ctx context.Context, l idemstore.Lease) error {
	if s.ended.has(l) {
		return fmt.Errorf("idempgx: release: %w: the claim must be kept, not released", idemstore.ErrTxEnded)
	}
	return s.fenced(ctx, "release", s.sql.Prelude, s.sql.Release, l, true)
}

// Keep implements idemstore.Store: an UPDATE fenced like Release's that leaves
// the row in progress under its token, sets uncertain and ends the lease
// (lease_expires_at = now()), so that the next claim finds it stale at
// once and takes it over only with ClaimRequest.TakeOverUncertain. It
// works for a lease whose transaction ended behind the store, which is
// what it is for. Its commit waits for the WAL flush whatever the session
// says: a Keep that a crash took back would leave a record that a claim
// without Reconcile takes over and runs again once its lease ends. It is
// sent again on another connection when its connection broke; a repeat
// matches the row again and sets the same.
func (s *Store) Keep(ctx context.Context, l idemstore.Lease) error {
	return s.fenced(ctx, "keep", s.sql.DurablePrelude, s.sql.Keep, l, false)
}

// fenced runs stmt, an UPDATE fenced by l's principal, key and token and
// the in_progress state, behind prelude, and, with notify, the store's
// notification of the record in the same batch (queueNotify); a
// connection that broke under it is replaced. It returns
// idemstore.ErrLeaseLost unless it changed one row.
func (s *Store) fenced(ctx context.Context, op, prelude, stmt string, l idemstore.Lease, notify bool) error {
	var affected int64
	err := s.onConn(ctx, func() error {
		b := newBatch()
		b.queue(prelude)
		b.queue(stmt, l.Principal, l.Key, l.Token)
		notified := notify && s.queueNotify(&b.Batch, l.Principal, l.Key)
		br := s.pool.SendBatch(ctx, &b.Batch)
		_, err := br.Exec()
		var tag pgconn.CommandTag
		if err == nil {
			tag, err = br.Exec()
		}
		if err == nil && notified {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		affected = tag.RowsAffected()
		return err
	})
	if err != nil {
		return wrap(op, err)
	}
	if affected != 1 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Get implements idemstore.Store. It returns idemstore.ErrNotFound when no row
// exists; an expired row is returned as it is.
func (s *Store) Get(ctx context.Context, principal, key string) (idem.Record, error) {
	var (
		rec   idem.Record
		found bool
	)
	err := s.onConn(ctx, func() error {
		found = false
		return s.query(ctx, func(rows pgx.Rows) error {
			var err error
			rec, err = scanRecord(rows, nil)
			found = err == nil
			return err
		}, s.sql.Get, principal, key)
	})
	if err != nil {
		return idem.Record{}, wrap("get", err)
	}
	if !found {
		return idem.Record{}, idemstore.ErrNotFound
	}
	return rec, nil
}

// onConn runs fn, and runs it again (up to maxConnRetries times) when it
// failed because its connection broke or a prepared statement was gone
// (stale). Only for statements that are safe to repeat.
func (s *Store) onConn(ctx context.Context, fn func() error) error {
	for retries := 0; ; retries++ {
		err := fn()
		if err == nil || retries >= maxConnRetries || !connLost(ctx, err) && !stale(err) {
			return err
		}
	}
}

// PurgeExpired implements idemstore.Store: it deletes at most limit rows past
// their expires_at, oldest first, in one statement. Rows another purger
// (or a claim) has locked are skipped, so several instances can sweep at
// once without waiting for each other.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.exec(ctx, s.sql.Purge, limit)
	if err != nil {
		return 0, wrap("purge expired", err)
	}
	return int(tag.RowsAffected()), nil
}

// ListStale implements idemstore.Store: in_progress rows past their
// lease_expires_at on the database clock (Uncertain ones included), the
// longest expired first, at most limit, through the index on
// lease_expires_at that holds only in_progress rows.
func (s *Store) ListStale(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []idem.Record
	err := s.query(ctx, func(rows pgx.Rows) error {
		rec, err := scanRecord(rows, nil)
		if err == nil {
			out = append(out, rec)
		}
		return err
	}, s.sql.ListStale, limit)
	if err != nil {
		return nil, wrap("list stale", err)
	}
	return out, nil
}

// endedLeases remembers the leases whose transaction this store saw end
// behind its back (in Settle or Rollback), so that a Release of one
// changes nothing: the engine keeps such a claim (Keep), and a release
// from anywhere else would let a retry run work that may have committed.
// An entry is kept for an hour, far longer than any lease: each is one
// rare misbehaving request.
type endedLeases struct {
	mu sync.Mutex
	m  map[idemstore.Lease]time.Time
}

// endedTTL bounds how long an entry nobody releases is kept.
const endedTTL = time.Hour

func (e *endedLeases) add(l idemstore.Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if e.m == nil {
		e.m = make(map[idemstore.Lease]time.Time)
	}
	for k, at := range e.m {
		if now.Sub(at) > endedTTL {
			delete(e.m, k)
		}
	}
	e.m[l] = now
}

// has reports whether l is remembered.
func (e *endedLeases) has(l idemstore.Lease) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.m[l]
	return ok && time.Since(at) <= endedTTL
}

var _ idemstore.Store = (*Store)(nil)
