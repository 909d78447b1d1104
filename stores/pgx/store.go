// Package idempgx is an idem.Store on PostgreSQL through pgx v5 and
// pgxpool. It shares the handler's transaction: BeginTx puts a pgx.Tx into
// the request's context (handlers get it with Tx), the handler's own writes
// go into it, and Settle stores the response in the same transaction,
// fenced by the lease token, and commits. Either both the handler's writes
// and the stored response commit, or neither does.
//
// Round trips in the common case: a first request costs the claim (1) and
// the settle with its COMMIT (1, one pipelined batch) beyond the handler's
// own queries; BEGIN costs none, as it goes out pipelined with the
// handler's first statement (or with the settle when there is none). A
// replay costs one round trip and writes nothing: no transaction id, no
// WAL.
//
// The claim and the other store calls run as single autocommit statements
// on the pool, and the transaction is begun with an explicit READ
// COMMITTED, which the claim's concurrency argument needs. All times are
// the database's clock.
package idempgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is an idem.Store backed by one PostgreSQL table. It is safe for
// concurrent use by many goroutines and many processes sharing the
// database. Create it with New.
type Store struct {
	pool        *pgxpool.Pool
	table       table
	txTimeout   time.Duration
	maxAttempts int
	sql         statements

	reruns atomic.Int64 // claim statements re-run (snapshot caveat, lost takeover race)
}

// Option configures a Store.
type Option func(*config) error

type config struct {
	table       string
	txTimeout   time.Duration
	maxAttempts int
}

// WithTable sets the table name, "table" or "schema.table", each part a
// plain identifier (letters, digits, underscore, not starting with a
// digit; the table part at most 40 bytes). Names are quoted, so they are
// case-sensitive. The default is DefaultTable.
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

// WithMaxClaimAttempts bounds how many times Claim re-runs its statement
// when a concurrent request changed the row between its statements (each
// retry follows somebody else's progress, so a few are plenty). Past the
// bound Claim returns an error wrapping idem.ErrTransient. The default is
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

// New returns a Store on pool. It does not touch the database: create the
// table with Migrate or with your own migration tool (see Migrations and
// Schema). It returns an error for a nil pool or an invalid option.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idempgx: nil pool")
	}
	c := config{table: DefaultTable, txTimeout: 10 * time.Second, maxAttempts: 16}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	t, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, table: t, txTimeout: c.txTimeout, maxAttempts: c.maxAttempts, sql: newStatements(t.ident())}, nil
}

// Table returns the quoted, possibly schema-qualified, table name the store
// uses, ready to put into SQL.
func (s *Store) Table() string { return s.table.ident() }

// Migrate creates the table and its indexes if they do not exist. It is
// safe to run from several instances at once: it serialises them with a
// transaction-scoped advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	ddl, err := s.table.schemaSQL()
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return wrap("migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "idempgx:"+s.table.ident()); err != nil {
		return wrap("migrate", err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return wrap("migrate", err)
	}
	return wrap("migrate", tx.Commit(ctx))
}

// statements holds the SQL with the table name filled in.
type statements struct {
	claim, takeover, replace, release, get, purge, listStale, settle string
}

// recordCols are the columns every record-returning statement returns, in
// scanRecord's order.
const recordCols = `principal, key, fingerprint, state, lease_token, request_id,
	created_at, locked_at, expires_at, status, headers, body`

func newStatements(t string) statements {
	var s statements
	// The claim. The INSERT either inserts the caller's row (returned by
	// ins) or finds the conflicting row and does nothing: no row lock, no
	// transaction id, no WAL, which is what makes a replay free. The second
	// branch returns the existing row from the statement's snapshot. When
	// the conflicting row was committed while the INSERT waited for it, the
	// snapshot predates it and the statement returns no row at all: the
	// caller runs it again with a fresh snapshot.
	//
	// The claim's own commit does not wait for its WAL to reach disk
	// (synchronous_commit off for this statement's transaction only, so
	// it is safe behind PgBouncer and leaves the pool's sessions as they
	// were). Nothing depends on the claim alone surviving a database
	// crash: the row is visible to every other claim the moment it
	// commits, and the only thing that makes it matter, the settle, commits
	// synchronously later, which flushes the WAL up to and including the
	// claim. A claim lost in a crash took the holder's transaction with
	// it, so a retry runs afresh, as after any failed request. A first
	// request thus waits for one disk flush instead of two. A replay
	// assigns no transaction id, so it has nothing to flush either way.
	s.claim = fmt.Sprintf(`WITH durability AS (
	SELECT set_config('synchronous_commit', 'off', true)
), ins AS (
	INSERT INTO %[1]s AS t (principal, key, fingerprint, state, lease_token, request_id,
		created_at, locked_at, expires_at)
	VALUES ($1, $2, $3, 'in_progress', $4, $5, now(), now(), now() + $6::bigint * interval '1 microsecond')
	ON CONFLICT (principal, key) DO NOTHING
	RETURNING %[2]s
)
SELECT true, %[2]s, now() FROM ins, durability
UNION ALL
SELECT false, %[2]s, now() FROM %[1]s, durability
WHERE principal = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`, t, recordCols)

	// Taking over a stale in_progress row: fenced by the token the caller
	// saw, and the staleness re-checked on the row's latest version with the
	// statement's own now(). Zero rows means someone else changed the row.
	s.takeover = fmt.Sprintf(`UPDATE %[1]s SET lease_token = $4, request_id = $5, locked_at = now(),
	expires_at = now() + $6::bigint * interval '1 microsecond'
WHERE principal = $1 AND key = $2 AND lease_token = $7 AND state = 'in_progress'
	AND fingerprint = $3 AND locked_at <= now() - $8::bigint * interval '1 microsecond'
RETURNING %[2]s, now()`, t, recordCols)

	// Replacing a row past its retention: it counts as absent, so every
	// column starts afresh.
	s.replace = fmt.Sprintf(`UPDATE %[1]s SET fingerprint = $3, state = 'in_progress', lease_token = $4,
	request_id = $5, created_at = now(), locked_at = now(),
	expires_at = now() + $6::bigint * interval '1 microsecond',
	status = NULL, headers = NULL, body = NULL
WHERE principal = $1 AND key = $2 AND lease_token = $7 AND expires_at <= now()
RETURNING %[2]s, now()`, t, recordCols)

	s.release = fmt.Sprintf(`DELETE FROM %s
WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'`, t)

	s.get = fmt.Sprintf(`SELECT %[2]s FROM %[1]s WHERE principal = $1 AND key = $2`, t, recordCols)

	// Several sweepers can run at once: each locks its own batch and skips
	// rows another holds. The locking re-checks expires_at on the latest
	// version of a row that changed after the snapshot.
	s.purge = fmt.Sprintf(`DELETE FROM %[1]s AS t USING (
	SELECT principal, key FROM %[1]s
	WHERE expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) AS d
WHERE t.principal = d.principal AND t.key = d.key`, t)

	s.listStale = fmt.Sprintf(`SELECT %[2]s FROM %[1]s
WHERE state = 'in_progress' AND locked_at <= now() - $1::bigint * interval '1 microsecond'
ORDER BY locked_at
LIMIT $2`, t, recordCols)

	// The settle, fenced by the lease token. It is pipelined with COMMIT in
	// one round trip, so a missed fence must not merely report zero rows: it
	// must abort the transaction, or the COMMIT queued behind it would commit
	// the handler's writes without the outcome. The CASE raises an error
	// (SQLSTATE 22P02, carrying leaseLostMarker) unless exactly one row was
	// updated; the server then skips the COMMIT.
	s.settle = fmt.Sprintf(`WITH u AS (
	UPDATE %s SET state = $4, status = $5, headers = $6, body = $7
	WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
	ELSE ('%s: fenced update matched ' || count(*) || ' rows')::int END
FROM u`, t, leaseLostMarker)
	return s
}

// leaseLostMarker is in the error the settle statement raises when its fence
// misses. It is not a valid integer, which is how it raises.
const leaseLostMarker = "idempgx lease lost"

func micros(d time.Duration) int64 { return d.Microseconds() }

// Claim implements idem.Store. The common case is one statement (one round
// trip); a replay writes nothing. A row past its ExpiresAt is replaced, and
// an in-progress row with the same fingerprint whose lease is older than
// req.Lease is taken over, each by one fenced UPDATE that re-checks its
// condition against the row's latest version with the database clock. When
// that UPDATE matches nothing, someone else changed the row and the claim
// starts over.
//
// When the connection breaks under a claim statement (up to
// maxConnRetries times) the claim runs again on another connection. That is
// safe whether or not the server executed the lost statement: a row that
// carries req.Token can only have been written by this call, so finding it
// means the lost statement did claim the key.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.ClaimResult, error) {
	if req.Principal == "" || req.Key == "" || req.Token == "" {
		return idem.ClaimResult{}, errors.New("idempgx: claim: principal, key and token must not be empty")
	}
	lease := req.Lease.Truncate(time.Microsecond)
	connRetries := 0
	lostTakeover := false // a stale takeover's answer was lost
	retryable := func(err error) bool {
		if retryClaim(err) {
			return true
		}
		if connLost(ctx, err) && connRetries < maxConnRetries {
			connRetries++
			return true
		}
		return false
	}
	for attempt := 0; attempt < s.maxAttempts; attempt++ {
		if attempt > 0 {
			s.reruns.Add(1)
		}
		rows, err := s.pool.Query(ctx, s.sql.claim,
			req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, micros(req.Retention))
		if err != nil {
			if retryable(err) {
				continue
			}
			return idem.ClaimResult{}, wrap("claim", err)
		}
		var (
			inserted bool
			rec      idem.Record
			now      time.Time
			found    bool
		)
		for rows.Next() {
			// The statement returns one row or none; PK (principal, key).
			if found {
				continue
			}
			if rec, err = scanRecord(rows, &inserted, &now); err != nil {
				rows.Close()
				return idem.ClaimResult{}, wrap("claim", err)
			}
			found = true
		}
		if err := rows.Err(); err != nil {
			if retryable(err) {
				continue
			}
			return idem.ClaimResult{}, wrap("claim", err)
		}
		switch {
		case !found:
			// The conflicting row committed while the INSERT waited for it,
			// after this statement's snapshot: run it again.
			continue
		case inserted:
			return idem.ClaimResult{Claimed: true, Record: rec, Now: now}, nil
		case rec.LeaseToken == req.Token && rec.State == idem.StateInProgress:
			// Our own statement claimed it, and its answer was lost.
			return idem.ClaimResult{Claimed: true, Reclaimed: lostTakeover, Record: rec, Now: now}, nil
		case !now.Before(rec.ExpiresAt):
			res, ok, err := s.takeOver(ctx, s.sql.replace, req, rec.LeaseToken)
			if err != nil && retryable(err) {
				continue
			}
			if err != nil || ok {
				return res, err
			}
		case rec.State == idem.StateInProgress && !rec.LockedAt.After(now.Add(-lease)) &&
			string(rec.Fingerprint) == string(req.Fingerprint):
			res, ok, err := s.takeOver(ctx, s.sql.takeover, req, rec.LeaseToken, micros(lease))
			if err != nil && retryable(err) {
				lostTakeover = true
				continue
			}
			if err != nil || ok {
				res.Reclaimed = ok
				return res, err
			}
		default:
			return idem.ClaimResult{Record: rec, Now: now}, nil
		}
	}
	return idem.ClaimResult{}, fmt.Errorf("idempgx: claim: %w: gave up after %d attempts under contention", idem.ErrTransient, s.maxAttempts)
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

// takeOver runs a fenced takeover UPDATE (stale lease or expired record).
// ok is false when it matched no row.
func (s *Store) takeOver(ctx context.Context, query string, req idem.ClaimRequest, oldToken string, extra ...any) (idem.ClaimResult, bool, error) {
	args := append([]any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID,
		micros(req.Retention), oldToken}, extra...)
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return idem.ClaimResult{}, false, wrap("claim: take over", err)
	}
	defer rows.Close()
	var (
		rec   idem.Record
		now   time.Time
		found bool
	)
	for rows.Next() {
		if found {
			continue
		}
		if rec, err = scanRecord(rows, nil, &now); err != nil {
			return idem.ClaimResult{}, false, wrap("claim: take over", err)
		}
		found = true
	}
	if err := rows.Err(); err != nil {
		if retryClaim(err) {
			return idem.ClaimResult{}, false, nil
		}
		return idem.ClaimResult{}, false, wrap("claim: take over", err)
	}
	if !found {
		return idem.ClaimResult{}, false, nil
	}
	return idem.ClaimResult{Claimed: true, Record: rec, Now: now}, true, nil
}

// scanRecord scans recordCols, preceded by the inserted flag when inserted
// is not nil and followed by now() when now is not nil.
func scanRecord(rows pgx.Rows, inserted *bool, now *time.Time) (idem.Record, error) {
	var (
		rec     idem.Record
		state   string
		status  *int32
		headers []byte
		body    []byte
	)
	dest := make([]any, 0, 14)
	if inserted != nil {
		dest = append(dest, inserted)
	}
	dest = append(dest, &rec.Principal, &rec.Key, &rec.Fingerprint, &state, &rec.LeaseToken,
		&rec.RequestID, &rec.CreatedAt, &rec.LockedAt, &rec.ExpiresAt, &status, &headers, &body)
	if now != nil {
		dest = append(dest, now)
	}
	if err := rows.Scan(dest...); err != nil {
		return idem.Record{}, err
	}
	rec.State = idem.State(state)
	if status != nil {
		resp := &idem.Response{Status: int(*status), Header: http.Header{}, Body: body}
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &resp.Header); err != nil {
				return idem.Record{}, fmt.Errorf("decode stored headers: %w", err)
			}
			if resp.Header == nil {
				resp.Header = http.Header{}
			}
		}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		rec.Response = resp
	}
	return rec, nil
}

// Release implements idem.Store: a DELETE fenced by the lease token and the
// in_progress state. It returns idem.ErrLeaseLost when the row is gone,
// settled or held by another token. A DELETE whose connection broke is sent
// again on another connection; if the lost one did delete the row, the
// second finds nothing and reports ErrLeaseLost, which is true: the lease
// holds nothing any more.
func (s *Store) Release(ctx context.Context, l idem.Lease) error {
	var affected int64
	err := s.onConn(ctx, func() error {
		tag, err := s.pool.Exec(ctx, s.sql.release, l.Principal, l.Key, l.Token)
		affected = tag.RowsAffected()
		return err
	})
	if err != nil {
		return wrap("release", err)
	}
	if affected != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Get implements idem.Store. It returns idem.ErrNotFound when no row
// exists; an expired row is returned as it is.
func (s *Store) Get(ctx context.Context, principal, key string) (idem.Record, error) {
	var (
		rec   idem.Record
		found bool
	)
	err := s.onConn(ctx, func() error {
		rows, err := s.pool.Query(ctx, s.sql.get, principal, key)
		if err != nil {
			return err
		}
		defer rows.Close()
		found = rows.Next()
		if found {
			if rec, err = scanRecord(rows, nil, nil); err != nil {
				return err
			}
		}
		rows.Close()
		return rows.Err()
	})
	if err != nil {
		return idem.Record{}, wrap("get", err)
	}
	if !found {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec, nil
}

// onConn runs fn, and runs it again (up to maxConnRetries times) when it
// failed because its connection broke. Only for statements that are safe to
// repeat.
func (s *Store) onConn(ctx context.Context, fn func() error) error {
	for retries := 0; ; retries++ {
		err := fn()
		if err == nil || retries >= maxConnRetries || !connLost(ctx, err) {
			return err
		}
	}
}

// PurgeExpired implements idem.Store: it deletes at most limit rows past
// their expires_at, oldest first, in one statement. Rows another purger
// (or a claim) has locked are skipped, so several instances can sweep at
// once without waiting for each other.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.sql.purge, limit)
	if err != nil {
		return 0, wrap("purge expired", err)
	}
	return int(tag.RowsAffected()), nil
}

// ListStale implements idem.Store: in_progress rows whose locked_at is at
// least olderThan ago on the database clock, oldest first, at most limit.
func (s *Store) ListStale(ctx context.Context, olderThan time.Duration, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.sql.listStale, micros(olderThan), limit)
	if err != nil {
		return nil, wrap("list stale", err)
	}
	defer rows.Close()
	var out []idem.Record
	for rows.Next() {
		rec, err := scanRecord(rows, nil, nil)
		if err != nil {
			return nil, wrap("list stale", err)
		}
		out = append(out, rec)
	}
	return out, wrap("list stale", rows.Err())
}

var _ idem.Store = (*Store)(nil)
