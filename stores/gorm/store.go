// Package idemgorm is an idem.Store on GORM for PostgreSQL, MySQL/MariaDB
// and SQLite. The handler's own writes and the stored outcome commit in one
// GORM transaction, which handlers reach with DB or TxFrom.
//
// Every claim is decided by one atomic statement's own answer, never by a
// read followed by a write, and every time comparison uses the database's
// clock. A replay of a settled record writes nothing. See README.md for the
// statement each dialect uses and why.
package idemgorm

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	idem "github.com/idemgo/idem/core"
	"gorm.io/gorm"
)

// Store is an idem.Store on a *gorm.DB. It is safe for concurrent use by
// many goroutines and, through the database, by many processes.
type Store struct {
	db      *gorm.DB
	dialect dialect
	table   tableName
	q       queries

	unguarded atomic.Bool // MySQL refused the temporary marker table
	gate      *writeGate  // SQLite: this process's writers, in order
}

// Option configures a Store.
type Option func(*options)

type options struct {
	table string
}

// WithTable makes the store use the table name instead of DefaultTable. The
// name is lower-case letters, digits and underscores, at most 48
// characters, optionally prefixed with a schema ("billing.idempotency_keys")
// on PostgreSQL and MySQL. New rejects anything else, so the name can never
// carry SQL.
func WithTable(name string) Option { return func(o *options) { o.table = name } }

// New returns a Store on db. The dialect comes from db.Dialector.Name():
// "postgres", "mysql" (MySQL 8 and MariaDB 10.5+) or "sqlite" (SQLite
// 3.37+, for example github.com/glebarez/sqlite). New does not create the
// table: run the embedded migration with your own tool (Migration) or call
// Migrate.
//
// For SQLite, open db with SQLiteDSN (WAL, a busy timeout, immediate
// transactions) so that concurrent requests queue instead of failing.
func New(db *gorm.DB, opts ...Option) (*Store, error) {
	if db == nil || db.Dialector == nil {
		return nil, errors.New("idemgorm: New: nil *gorm.DB")
	}
	o := options{table: DefaultTable}
	for _, opt := range opts {
		opt(&o)
	}
	d, err := dialectOf(db.Dialector.Name())
	if err != nil {
		return nil, err
	}
	t, err := parseTableName(o.table, d)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, dialect: d, table: t, q: buildQueries(d, t)}
	if d == dialectSQLite {
		s.gate = newWriteGate(sqliteBusyTimeout(db))
	}
	return s, nil
}

// Dialect returns the dialect the store detected: "postgres", "mysql" or
// "sqlite".
func (s *Store) Dialect() string { return s.dialect.String() }

// Guarded reports whether Settle can tell a transaction the database ended
// by itself from a live one, so that it never commits an outcome without
// the handler's writes. It is always true on PostgreSQL (an aborted
// transaction refuses every statement) and SQLite; on MySQL it is true
// unless creating the per-connection TEMPORARY marker table was refused.
func (s *Store) Guarded() bool { return !s.unguarded.Load() }

// Table returns the (possibly schema-qualified) table name the store uses.
func (s *Store) Table() string {
	if s.table.schema != "" {
		return s.table.schema + "." + s.table.name
	}
	return s.table.name
}

// Limits of the MySQL schema's VARBINARY columns. Claim refuses longer
// values on MySQL instead of letting a non-strict sql_mode truncate them,
// which could make two principals or keys the same.
const (
	mysqlMaxPrincipal   = 512
	mysqlMaxKey         = 512
	mysqlMaxFingerprint = 255
	mysqlMaxToken       = 255
)

// maxRequestID bounds the stored request id; a longer one is cut. It is
// there for tracing a replay to its original, and a client must not be
// able to make a claim fail by sending a huge request id.
const maxRequestID = 1024

// maxClaimRounds bounds Claim's loop. Each round that does not decide means
// another request changed the row between two statements (it committed,
// settled, released, or took over); more than a handful in a row means
// something is wrong.
const maxClaimRounds = 20

func (s *Store) checkClaim(req idem.ClaimRequest) error {
	switch {
	case req.Principal == "":
		return errors.New("idemgorm: Claim: empty principal")
	case req.Key == "":
		return errors.New("idemgorm: Claim: empty key")
	case req.Token == "":
		return errors.New("idemgorm: Claim: empty lease token")
	case len(req.Fingerprint) == 0:
		return errors.New("idemgorm: Claim: empty fingerprint")
	case req.Lease <= 0 || req.Retention <= 0:
		return fmt.Errorf("idemgorm: Claim: lease %v and retention %v must be positive", req.Lease, req.Retention)
	}
	if s.dialect == dialectMySQL {
		switch {
		case len(req.Principal) > mysqlMaxPrincipal:
			return fmt.Errorf("idemgorm: Claim: principal is %d bytes, the mysql schema holds %d", len(req.Principal), mysqlMaxPrincipal)
		case len(req.Key) > mysqlMaxKey:
			return fmt.Errorf("idemgorm: Claim: key is %d bytes, the mysql schema holds %d", len(req.Key), mysqlMaxKey)
		case len(req.Fingerprint) > mysqlMaxFingerprint:
			return fmt.Errorf("idemgorm: Claim: fingerprint is %d bytes, the mysql schema holds %d", len(req.Fingerprint), mysqlMaxFingerprint)
		case len(req.Token) > mysqlMaxToken:
			return fmt.Errorf("idemgorm: Claim: lease token is %d bytes, the mysql schema holds %d", len(req.Token), mysqlMaxToken)
		}
	}
	return nil
}

// Claim implements idem.Store. The first statement inserts the caller's
// in-progress record or finds the existing one, atomically (on SQLite a
// read comes first, so that replays do not queue for the single writer;
// the INSERT still decides). A found record
// that is claimable (past its expiry, or in progress with a lease older than
// req.Lease and the same fingerprint) is taken over with one UPDATE fenced
// by the token that was read and re-checked against the database clock.
// Whenever a statement finds that another request changed the row in
// between, Claim starts again; deadlocks and serialization failures are
// retried the same way. A settled record is returned as it is, and nothing
// is written.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.ClaimResult, error) {
	if err := s.checkClaim(req); err != nil {
		return idem.ClaimResult{}, err
	}
	if len(req.RequestID) > maxRequestID {
		req.RequestID = req.RequestID[:maxRequestID]
	}
	var lastErr error
	for round := range maxClaimRounds {
		res, decided, err := s.claimOnce(ctx, req)
		switch {
		case err == nil && decided:
			return res, nil
		case err != nil && !isFastTransient(err):
			return idem.ClaimResult{}, wrap("claim", err)
		case err != nil:
			lastErr = err
		}
		if cerr := ctx.Err(); cerr != nil {
			return idem.ClaimResult{}, fmt.Errorf("idemgorm: claim: %w", cerr)
		}
		if round > 0 {
			// Back off a little: another request is changing this row
			// right now, or the database keeps choosing us as the
			// deadlock victim.
			time.Sleep(time.Duration(round) * time.Millisecond)
		}
	}
	if lastErr == nil {
		lastErr = errors.New("the record kept changing")
	}
	return idem.ClaimResult{}, wrap("claim", fmt.Errorf("%w: no decision after %d rounds: %w", idem.ErrTransient, maxClaimRounds, lastErr))
}

// writeTurn runs fn in its turn among this process's SQLite writers (see
// writeGate); on the other dialects it just runs fn.
func (s *Store) writeTurn(ctx context.Context, fn func() error) error {
	if s.gate == nil {
		return fn()
	}
	if err := s.gate.acquire(ctx); err != nil {
		return err
	}
	defer s.gate.release()
	return fn()
}

// claimOnce runs one round of Claim. decided is false when the row changed
// between two statements and the round must be run again.
func (s *Store) claimOnce(ctx context.Context, req idem.ClaimRequest) (res idem.ClaimResult, decided bool, err error) {
	var (
		rec      idem.Record
		now      time.Time
		found    bool
		inserted bool
	)
	switch s.dialect {
	case dialectPostgres:
		rec, now, inserted, found, err = s.claimPostgres(ctx, req)
	case dialectSQLite:
		rec, now, inserted, found, err = s.claimSQLite(ctx, req)
	default:
		rec, now, inserted, found, err = s.claimMySQL(ctx, req)
	}
	if err != nil || !found {
		return res, false, err
	}
	if inserted {
		return idem.ClaimResult{Claimed: true, Record: rec, Now: now}, true, nil
	}

	switch {
	case !now.Before(rec.ExpiresAt):
		// Past retention: absent as far as correctness goes. (MySQL's
		// upsert already replaces such a row; seeing one here means it
		// expired after the upsert ran, and the next round replaces it.)
		if s.dialect == dialectMySQL {
			return res, false, nil
		}
		taken, ok, terr := s.takeover(ctx, s.q.takeExpired, []any{
			req.Fingerprint, req.Token, req.RequestID, req.Retention.Microseconds(),
			req.Principal, req.Key, rec.LeaseToken,
		}, req)
		if terr != nil || !ok {
			return res, false, terr
		}
		return idem.ClaimResult{Claimed: true, Record: taken.rec, Now: taken.now}, true, nil

	case rec.State == idem.StateInProgress && now.Sub(rec.LockedAt) >= req.Lease &&
		bytes.Equal(rec.Fingerprint, req.Fingerprint):
		taken, ok, terr := s.takeover(ctx, s.q.takeStale, []any{
			req.Token, req.RequestID, req.Retention.Microseconds(),
			req.Principal, req.Key, rec.LeaseToken, req.Fingerprint, req.Lease.Microseconds(),
		}, req)
		if terr != nil || !ok {
			return res, false, terr
		}
		return idem.ClaimResult{Claimed: true, Reclaimed: true, Record: taken.rec, Now: taken.now}, true, nil
	}
	// Live in-progress, settled, or another fingerprint: dispatch on it.
	return idem.ClaimResult{Record: rec, Now: now}, true, nil
}

// claimPostgres inserts or returns the existing row in one statement.
func (s *Store) claimPostgres(ctx context.Context, req idem.ClaimRequest) (rec idem.Record, now time.Time, inserted, found bool, err error) {
	rows, err := s.db.WithContext(ctx).Raw(s.q.claimPG,
		req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, req.Retention.Microseconds(),
		req.Principal, req.Key).Rows()
	if err != nil {
		return rec, now, false, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		// The conflicting row committed after this statement's snapshot.
		return rec, now, false, false, rows.Err()
	}
	var r recordRow
	if err := rows.Scan(append([]any{&inserted}, r.dest(true)...)...); err != nil {
		return rec, now, false, false, err
	}
	if err := rows.Close(); err != nil {
		return rec, now, false, false, err
	}
	rec, err = r.record()
	return rec, r.now.t, inserted, err == nil, err
}

// claimSQLite reads the row first and inserts only when there is none.
// SQLite has one writer: a claim that began with its INSERT would queue
// behind every running handler's transaction just to learn that the key
// exists, so a replay or a 409 would wait for unrelated work. In WAL mode
// the read does not wait. The decision is still the statements' own: an
// existing settled row is terminal, a live one is answered as it is, a
// claimable one goes to the fenced takeover, and an absent one is claimed
// only by the INSERT … ON CONFLICT DO NOTHING RETURNING, which returns a
// row only when it inserted one. When it conflicts (another request
// inserted in between) the row is read again; when that row is gone too
// (released meanwhile) the round starts over.
func (s *Store) claimSQLite(ctx context.Context, req idem.ClaimRequest) (rec idem.Record, now time.Time, inserted, found bool, err error) {
	r, ok, err := s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || ok {
		return r.rec, r.now, false, ok, err
	}
	err = s.writeTurn(ctx, func() error {
		r, ok, err = s.queryRow(ctx, true, s.q.insertLite,
			req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, req.Retention.Microseconds())
		return err
	})
	if err != nil {
		return rec, now, false, false, err
	}
	if ok {
		return r.rec, r.now, true, true, nil
	}
	r, ok, err = s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || !ok {
		return rec, now, false, false, err
	}
	return r.rec, r.now, false, true, nil
}

// claimMySQL runs the conditional upsert (see buildQueries) and reads the
// row it left. The row carries the caller's token iff the upsert inserted
// it or replaced an expired one.
func (s *Store) claimMySQL(ctx context.Context, req idem.ClaimRequest) (rec idem.Record, now time.Time, inserted, found bool, err error) {
	ret := req.Retention.Microseconds()
	res := s.db.WithContext(ctx).Exec(s.q.upsertMy,
		req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, ret,
		req.Token,                  // lease_token = IF(expired, token, lease_token)
		req.Token, req.Fingerprint, // fingerprint
		req.Token,                // state
		req.Token, req.RequestID, // request_id
		req.Token, req.Token, req.Token, // status, headers, body
		req.Token, req.Token, // created_at, locked_at
		req.Token, ret, // expires_at
	)
	if res.Error != nil {
		return rec, now, false, false, res.Error
	}
	affected := res.RowsAffected
	if affected < 0 || affected > 2 {
		return rec, now, false, false, fmt.Errorf("upsert reported %d rows affected, want 0, 1 or 2", affected)
	}
	r, ok, err := s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || !ok {
		return rec, now, false, false, err
	}
	mine := r.rec.LeaseToken == req.Token
	if mine && affected == 0 {
		return rec, now, false, false, errors.New("upsert changed no row, yet the row carries this claim's token")
	}
	if !mine && affected == 2 {
		// We replaced an expired row and someone took it from us within
		// the same instant: only possible with a lease or retention of
		// (almost) zero. Not ours any more; decide again.
		return rec, now, false, false, nil
	}
	return r.rec, r.now, mine, true, nil
}

// takeover runs a fenced takeover UPDATE. ok is false when it matched no
// row: the row changed since it was read.
func (s *Store) takeover(ctx context.Context, query string, args []any, req idem.ClaimRequest) (rowWithNow, bool, error) {
	if s.dialect != dialectMySQL {
		var (
			r   rowWithNow
			ok  bool
			err error
		)
		err = s.writeTurn(ctx, func() error {
			r, ok, err = s.queryRow(ctx, true, query, args...)
			return err
		})
		if err != nil || !ok {
			return rowWithNow{}, false, err
		}
		if r.rec.LeaseToken != req.Token {
			return rowWithNow{}, false, errors.New("takeover returned a row without this claim's token")
		}
		return r, true, nil
	}
	res := s.db.WithContext(ctx).Exec(query, args...)
	if res.Error != nil {
		return rowWithNow{}, false, res.Error
	}
	// The UPDATE always changes lease_token when it matches, so "changed"
	// and "found" rows agree whatever clientFoundRows says.
	if res.RowsAffected != 1 {
		return rowWithNow{}, false, nil
	}
	r, ok, err := s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || !ok || r.rec.LeaseToken != req.Token {
		return rowWithNow{}, false, err
	}
	return r, true, nil
}

type rowWithNow struct {
	rec idem.Record
	now time.Time
}

// queryRow runs a statement that returns at most one record row (plus the
// database clock when withNow) and reads it completely.
func (s *Store) queryRow(ctx context.Context, withNow bool, query string, args ...any) (rowWithNow, bool, error) {
	rows, err := s.db.WithContext(ctx).Raw(query, args...).Rows()
	if err != nil {
		return rowWithNow{}, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return rowWithNow{}, false, rows.Err()
	}
	var r recordRow
	if err := rows.Scan(r.dest(withNow)...); err != nil {
		return rowWithNow{}, false, err
	}
	// Drain and close: SQLite's RETURNING and MySQL's result sets finish
	// their statement only then, and a close error is a statement error.
	for rows.Next() {
	}
	if err := rows.Close(); err != nil {
		return rowWithNow{}, false, err
	}
	rec, err := r.record()
	if err != nil {
		return rowWithNow{}, false, err
	}
	return rowWithNow{rec, r.now.t}, true, nil
}

// Release implements idem.Store: a DELETE fenced by the lease token and the
// in-progress state. It returns idem.ErrLeaseLost when it deleted nothing.
func (s *Store) Release(ctx context.Context, lease idem.Lease) error {
	var res *gorm.DB
	if err := s.writeTurn(ctx, func() error {
		res = s.db.WithContext(ctx).Exec(s.q.release, lease.Principal, lease.Key, lease.Token)
		return res.Error
	}); err != nil {
		return wrap("release", err)
	}
	if res.RowsAffected != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Get implements idem.Store. It returns idem.ErrNotFound when no record
// exists; an expired record is returned as it is.
func (s *Store) Get(ctx context.Context, principal, key string) (idem.Record, error) {
	r, ok, err := s.queryRow(ctx, false, s.q.get, principal, key)
	if err != nil {
		return idem.Record{}, wrap("get", err)
	}
	if !ok {
		return idem.Record{}, idem.ErrNotFound
	}
	return r.rec, nil
}

// PurgeExpired implements idem.Store: it deletes at most limit records
// whose expires_at has passed on the database clock. Run it in a loop until
// it returns less than limit. Several purgers may run at once: on
// PostgreSQL they skip each other's rows (FOR UPDATE SKIP LOCKED); on MySQL
// each picks its batch without locking and deletes it by primary key, so
// two may pick the same rows and the later one deletes fewer; on SQLite
// they take turns. Each record is counted by the purger that deleted it.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if s.dialect == dialectMySQL {
		n, err := s.purgeMySQL(ctx, limit)
		return n, wrap("purge expired", err)
	}
	var res *gorm.DB
	if err := s.writeTurn(ctx, func() error {
		res = s.db.WithContext(ctx).Exec(s.q.purge, limit)
		return res.Error
	}); err != nil {
		return 0, wrap("purge expired", err)
	}
	return int(res.RowsAffected), nil
}

// purgeMySQL picks at most limit expired rows with a plain read and
// deletes those still expired by primary key (see queries.pickMy).
func (s *Store) purgeMySQL(ctx context.Context, limit int) (int, error) {
	db := s.db.WithContext(ctx)
	rows, err := db.Raw(s.q.pickMy, limit).Rows()
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	args := make([]any, 0, 2*limit)
	for rows.Next() {
		// Strings, as Claim passes them: GORM would expand a []byte
		// inside parentheses into a list of its bytes.
		var principal, key string
		if err := rows.Scan(&principal, &key); err != nil {
			return 0, err
		}
		args = append(args, principal, key)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(args) == 0 {
		return 0, nil
	}
	pairs := strings.Repeat("(?, ?), ", len(args)/2)
	res := db.Exec(fmt.Sprintf(s.q.purge, pairs[:len(pairs)-2]), args...)
	return int(res.RowsAffected), res.Error
}

// ListStale implements idem.Store: at most limit in-progress records whose
// lease is older than olderThan on the database clock, oldest first.
func (s *Store) ListStale(ctx context.Context, olderThan time.Duration, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.db.WithContext(ctx).Raw(s.q.listStale, olderThan.Microseconds(), limit).Rows()
	if err != nil {
		return nil, wrap("list stale", err)
	}
	defer rows.Close()
	var out []idem.Record
	for rows.Next() {
		var r recordRow
		if err := rows.Scan(r.dest(false)...); err != nil {
			return nil, wrap("list stale", err)
		}
		rec, err := r.record()
		if err != nil {
			return nil, wrap("list stale", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list stale", err)
	}
	return out, nil
}

// recordRow is one scanned row of queries.cols (and the clock).
type recordRow struct {
	principal, key, state, token, requestID string
	fingerprint, body                       []byte
	status                                  sql.NullInt64
	headers                                 sql.NullString
	created, locked, expires, now           timeValue
}

func (r *recordRow) dest(withNow bool) []any {
	d := []any{&r.principal, &r.key, &r.fingerprint, &r.state, &r.token, &r.requestID,
		&r.status, &r.headers, &r.body, &r.created, &r.locked, &r.expires}
	if withNow {
		d = append(d, &r.now)
	}
	return d
}

func (r *recordRow) record() (idem.Record, error) {
	rec := idem.Record{
		Principal: r.principal, Key: r.key, Fingerprint: r.fingerprint, State: idem.State(r.state),
		LeaseToken: r.token, RequestID: r.requestID,
		CreatedAt: r.created.t, LockedAt: r.locked.t, ExpiresAt: r.expires.t,
	}
	if !rec.State.Valid() {
		return idem.Record{}, fmt.Errorf("record %q/%q has unknown state %q", r.principal, r.key, r.state)
	}
	if r.status.Valid {
		resp := &idem.Response{Status: int(r.status.Int64), Header: http.Header{}, Body: r.body}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		if r.headers.Valid && r.headers.String != "" {
			if err := json.Unmarshal([]byte(r.headers.String), &resp.Header); err != nil {
				return idem.Record{}, fmt.Errorf("record %q/%q: stored headers: %w", r.principal, r.key, err)
			}
			if resp.Header == nil {
				resp.Header = http.Header{}
			}
		}
		rec.Response = resp
	}
	return rec, nil
}

// timeValue scans a time column as the dialects return it: a time.Time
// (PostgreSQL) or unix microseconds as an integer, possibly in text form
// (MySQL without prepared statements returns numbers as text).
type timeValue struct{ t time.Time }

func (v *timeValue) Scan(src any) error {
	switch x := src.(type) {
	case time.Time:
		v.t = x
		return nil
	case int64:
		v.t = time.UnixMicro(x)
		return nil
	case []byte:
		return v.parse(string(x))
	case string:
		return v.parse(x)
	case float64:
		v.t = time.UnixMicro(int64(x))
		return nil
	case nil:
		return errors.New("idemgorm: NULL time")
	}
	return fmt.Errorf("idemgorm: cannot scan %T into a time", src)
}

func (v *timeValue) parse(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("idemgorm: time %q: %w", s, err)
	}
	v.t = time.UnixMicro(n)
	return nil
}

// encodeHeader is the stored form of a response header: JSON of the map,
// "{}" when empty.
func encodeHeader(h http.Header) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

var _ idem.Store = (*Store)(nil)
