// Package idemsql is an idemstore.Store on database/sql for PostgreSQL (pgx's
// stdlib driver or lib/pq), MySQL/MariaDB and SQLite. The handler's own
// writes and the stored outcome commit in one transaction, which handlers
// reach with Tx: a *Handle with the four methods of sqlc's DBTX, so sqlc's
// generated code and plain database/sql code run in it.
//
// Every claim is decided by one atomic statement's own answer, never by a
// read followed by a write, and every time comparison uses the database's
// clock; staleness is each record's own lease deadline. A replay of a
// settled record writes nothing. The transaction the handler gets is
// sealed: it cannot end it, half-commit it, or change what the store's own
// statements do. On PostgreSQL a claim commits without waiting for its WAL
// flush, and the Tx is an idemstore.Syncer that waits for it on its own
// connection; MySQL and SQLite claims are durable when Claim returns. See
// docs/design-notes.md for the statement each dialect uses and why.
//
// The package imports no database driver: the application's own driver
// is the only one linked.
package idemsql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// Store is an idemstore.Store on a *sql.DB. It is safe for concurrent use by
// many goroutines and, through the database, by many processes.
type Store struct {
	db      *sql.DB
	logger  *slog.Logger
	dialect dialect
	table   tableName // as given (the migration's name)
	qtable  tableName // as the store's statements name it, always qualified
	q       queries
	lock    time.Duration
	maria   bool // MySQL flavour: MariaDB (SET STATEMENT) or MySQL
	mariaRt bool // MariaDB 10.5+: INSERT … RETURNING

	pgScript  bool        // PostgreSQL: the driver sends an Exec without arguments as a simple query (settleAndCommit)
	unguarded atomic.Bool // MySQL refused the temporary marker table
	gate      *writeGate  // SQLite: this process's writers, in order

	claimMu   sync.Mutex
	claimStmt *sql.Stmt // MariaDB 10.5+: upsertMyRet, prepared on claimPool
	claimPool *sql.DB
}

// Option configures a Store.
type Option func(*config) error

type config struct {
	table       string
	lockTimeout time.Duration
	dialect     string
	logger      *slog.Logger
}

// WithTable makes the store use the table name instead of DefaultTable. On
// PostgreSQL the name is one idempgx takes: "table" or "schema.table", each
// part letters, digits and underscores, not starting with a digit, the
// table at most 40 bytes (its index names are derived from it), case kept.
// On MySQL and SQLite it is lower-case letters, digits and underscores, at
// most 48 characters, optionally prefixed with a database on MySQL
// ("billing.idempotency_keys"). New rejects
// anything else, so the name can never carry SQL. An unqualified name is
// qualified by New: on PostgreSQL with the schema the connection's
// search_path selects when New runs (current_schema(), public by default),
// on MySQL with the DSN's database, on SQLite with main.
func WithTable(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("idemsql: WithTable: empty name")
		}
		c.table = name
		return nil
	}
}

// WithLockTimeout bounds how long any of the store's statements waits for
// a row lock another transaction holds (a settle not yet committed, a
// stuck handler's claim): past it the statement fails with an error
// wrapping idemstore.ErrTransient, so a claim meeting such a row answers in
// time instead of waiting for it. The default is 2 seconds; keep it below
// the engine's StoreTimeout. MySQL counts it in whole seconds (at least
// one); PostgreSQL's statement timeout for the settle's transaction is
// twice as long.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idemsql: WithLockTimeout: %v is not positive", d)
		}
		c.lockTimeout = d
		return nil
	}
}

// WithDialect names the database behind the *sql.DB: "postgres", "mysql"
// (MySQL 8 and MariaDB 10.5+) or "sqlite" (SQLite 3.37+), for a driver New
// does not recognise (see New).
func WithDialect(name string) Option {
	return func(c *config) error {
		if _, err := dialectOf(name); err != nil {
			return err
		}
		c.dialect = name
		return nil
	}
}

// WithLogger makes the store log what an operator must know (the one
// warning when MySQL refuses the marker table) to l instead of
// slog.Default(). A normal request logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("idemsql: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// DefaultLockTimeout is the lock timeout unless WithLockTimeout sets one.
const DefaultLockTimeout = 2 * time.Second

// driverDialects maps the package of a database/sql driver to its dialect,
// for New's detection. The driver is recognised by its type's package
// path, so that this package imports none of them.
var driverDialects = map[string]string{
	"github.com/jackc/pgx/v5/stdlib":       "postgres",
	"github.com/jackc/pgx/v4/stdlib":       "postgres",
	"github.com/lib/pq":                    "postgres",
	"github.com/go-sql-driver/mysql":       "mysql",
	"modernc.org/sqlite":                   "sqlite",
	"github.com/glebarez/go-sqlite":        "sqlite",
	"github.com/mattn/go-sqlite3":          "sqlite",
	"github.com/ncruces/go-sqlite3/driver": "sqlite",
}

// simpleQueryDrivers are the PostgreSQL drivers that send an Exec without
// arguments as one simple-protocol query, which may hold several
// statements (see settleAndCommit).
var simpleQueryDrivers = map[string]bool{
	"github.com/jackc/pgx/v5/stdlib": true,
	"github.com/lib/pq":              true,
}

// driverPackage returns the import path of db's driver package.
func driverPackage(db *sql.DB) string {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// New returns a Store on db. The dialect is the one WithDialect names, or
// else the one of db's driver: pgx's stdlib or lib/pq (PostgreSQL),
// go-sql-driver/mysql (MySQL 8 and MariaDB 10.5+), modernc.org/sqlite,
// glebarez/go-sqlite, mattn/go-sqlite3 or ncruces/go-sqlite3 (SQLite
// 3.37+); another driver needs WithDialect. On PostgreSQL New asks which
// schema an unqualified table name is in (current_schema()), on MySQL
// which flavour the server is and which database the DSN selected, on
// SQLite the busy timeout: one short query, at start-up, before any
// handler can have changed a connection's session. New does not create
// the table: run Schema with your own migration tool, or call Migrate
// (which checks the table too; Check checks an existing one).
//
// For SQLite, open db with SQLiteDSN (WAL, a busy timeout) so that
// concurrent requests queue instead of failing.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemsql: New: nil *sql.DB")
	}
	c := config{table: DefaultTable, lockTimeout: DefaultLockTimeout, logger: slog.Default()}
	for _, opt := range opts {
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	pkg := driverPackage(db)
	if c.dialect == "" {
		c.dialect = driverDialects[pkg]
		if c.dialect == "" {
			return nil, fmt.Errorf("idemsql: New: the driver %T is not one New recognises: name the database with WithDialect", db.Driver())
		}
	}
	d, err := dialectOf(c.dialect)
	if err != nil {
		return nil, err
	}
	t, err := parseTableName(c.table, d)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, logger: c.logger, dialect: d, table: t, qtable: t, lock: c.lockTimeout,
		pgScript: d == dialectPostgres && simpleQueryDrivers[pkg]}
	switch d {
	case dialectPostgres:
		if t.schema == "" {
			if err := s.probePostgres(); err != nil {
				return nil, err
			}
		}
	case dialectSQLite:
		s.qtable.schema = "main"
		s.gate = newWriteGate(sqliteBusyTimeout(s))
	case dialectMySQL:
		if err := s.probeMySQL(); err != nil {
			return nil, err
		}
	}
	s.q = buildQueries(d, s.qtable, s.maria, s.mariaRt, s.lock)
	return s, nil
}

// probePostgres qualifies an unqualified table name with the schema the
// connection's search_path selects now (current_schema(), usually public):
// the DSN's choice, fixed at New, so that a handler's later SET
// search_path cannot move the store's statements.
func (s *Store) probePostgres() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := s.pool()
	if err != nil {
		return err
	}
	var schema sql.NullString
	if err := pool.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return s.wrap("new", err)
	}
	if !schema.Valid || schema.String == "" {
		return s.wrap("new", fmt.Errorf("%w: the connection's search_path names no existing schema: fix it or use WithTable(\"schema.table\")", idem.ErrMisconfigured))
	}
	s.qtable.schema = schema.String
	return nil
}

// probeMySQL learns the server's flavour and, for an unqualified table
// name, the DSN's database.
func (s *Store) probeMySQL() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := s.pool()
	if err != nil {
		return err
	}
	var version string
	var database sql.NullString
	if err := pool.QueryRowContext(ctx, "SELECT VERSION(), DATABASE() LIMIT 1").Scan(&version, &database); err != nil {
		return s.wrap("new", err)
	}
	s.maria = strings.Contains(strings.ToLower(version), "mariadb")
	s.mariaRt = s.maria && mariaReturning(version)
	if s.qtable.schema == "" {
		if !database.Valid || database.String == "" {
			return s.wrap("new", fmt.Errorf("%w: the MySQL connection selects no database: name one in the DSN or use WithTable(\"database.table\")", idem.ErrMisconfigured))
		}
		s.qtable.schema = database.String
	}
	return nil
}

// pool returns the *sql.DB the store's statements run on.
func (s *Store) pool() (*sql.DB, error) { return s.db, nil }

// Dialect returns the dialect the store detected: "postgres", "mysql" or
// "sqlite".
func (s *Store) Dialect() string { return s.dialect.String() }

// Guarded reports whether Settle can tell a transaction the database ended
// by itself from a live one, through routes the handle cannot see. It is
// always true on PostgreSQL (an aborted transaction refuses every
// statement) and SQLite; on MySQL it is true unless creating the
// per-connection TEMPORARY marker table was refused.
func (s *Store) Guarded() bool { return !s.unguarded.Load() }

// Table returns the qualified table name the store's statements use,
// unquoted ("public.idempotency_keys").
func (s *Store) Table() string { return s.qtable.schema + "." + s.qtable.name }

// Limits the schema holds on every dialect, and Claim checks.
const (
	maxFingerprint = 255
	maxToken       = 255
	maxNonce       = 64
)

// maxClaimRounds bounds Claim's loop. Each round that does not decide means
// another request changed the row between two statements (it committed,
// settled, released, or took over); more than a handful in a row means
// something is wrong.
const maxClaimRounds = 20

func (s *Store) checkClaim(req idemstore.ClaimRequest) error {
	switch {
	case req.Principal == "":
		return errors.New("idemsql: claim: empty principal")
	case req.Key == "":
		return errors.New("idemsql: claim: empty key")
	case req.Token == "":
		return errors.New("idemsql: claim: empty lease token")
	case req.Nonce == "":
		return errors.New("idemsql: claim: empty nonce")
	case len(req.Fingerprint) == 0:
		return errors.New("idemsql: claim: empty fingerprint")
	case req.Lease <= 0 || req.Retention <= 0:
		return fmt.Errorf("idemsql: claim: lease %v and retention %v must be positive", req.Lease, req.Retention)
	case len(req.Principal) > idemstore.MaxPrincipalLength:
		return fmt.Errorf("idemsql: claim: principal is %d bytes, the schema holds %d", len(req.Principal), idemstore.MaxPrincipalLength)
	case len(req.Key) > idemstore.MaxKeyLengthLimit:
		return fmt.Errorf("idemsql: claim: key is %d bytes, the schema holds %d", len(req.Key), idemstore.MaxKeyLengthLimit)
	case len(req.Fingerprint) > maxFingerprint:
		return fmt.Errorf("idemsql: claim: fingerprint is %d bytes, the schema holds %d", len(req.Fingerprint), maxFingerprint)
	case len(req.Token) > maxToken:
		return fmt.Errorf("idemsql: claim: lease token is %d bytes, the schema holds %d", len(req.Token), maxToken)
	case len(req.Nonce) > maxNonce:
		return fmt.Errorf("idemsql: claim: nonce is %d bytes, the schema holds %d", len(req.Nonce), maxNonce)
	}
	return nil
}

// Claim implements idemstore.Store. The first statement inserts the caller's
// in-progress record or finds the existing one, atomically (on SQLite a
// read comes first, so that replays do not queue for the single writer;
// the INSERT still decides). A found record that is claimable (past its
// expiry; released; or in progress past its own lease_expires_at, with the
// same fingerprint, and not uncertain unless req.TakeOverUncertain) is
// taken over with one UPDATE fenced by the token that was read and
// re-checking its condition against the database clock. Whenever a
// statement finds that another request changed the row in between, Claim
// starts again; deadlocks and serialization failures are retried the same
// way. A settled record is returned as it is, and nothing is written. A
// row locked by another transaction for longer than the lock timeout makes
// Claim fail with an error wrapping idemstore.ErrTransient.
//
// On PostgreSQL a claim that inserts the record commits without waiting
// for its WAL flush, unless req.Durable (see pgTx.Sync); on MySQL and
// SQLite, and for every takeover, Claim returns once the claim is durable,
// and req.Durable changes nothing.
func (s *Store) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if err := s.checkClaim(req); err != nil {
		return idemstore.ClaimResult{}, err
	}
	req.RequestID = idemstore.BoundRequestID(req.RequestID)
	var lastErr error
	for round := range maxClaimRounds {
		res, decided, err := s.claimOnce(ctx, req)
		switch {
		case err == nil && decided:
			if res.Claimed && (res.Record.LeaseToken != req.Token || res.Record.State != idemstore.StateInProgress ||
				!bytes.Equal(res.Record.Fingerprint, req.Fingerprint)) {
				// Never answer Claimed for a row that is not the caller's
				// own in-progress row.
				return idemstore.ClaimResult{}, s.wrap("claim", fmt.Errorf("the claimed row is %s with token %q, not this claim's in-progress row",
					res.Record.State, res.Record.LeaseToken))
			}
			return res, nil
		case err != nil && !isFastTransient(err):
			return idemstore.ClaimResult{}, s.wrap("claim", err)
		case err != nil:
			lastErr = err
		}
		if cerr := ctx.Err(); cerr != nil {
			return idemstore.ClaimResult{}, s.wrap("claim", cerr)
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
	return idemstore.ClaimResult{}, idemstore.WrapStoreError("idemsql", "claim", idemstore.ClassTransient,
		fmt.Errorf("no decision after %d rounds: %w", maxClaimRounds, lastErr))
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
func (s *Store) claimOnce(ctx context.Context, req idemstore.ClaimRequest) (res idemstore.ClaimResult, decided bool, err error) {
	var (
		r        rowWithNow
		found    bool
		inserted bool
	)
	switch s.dialect {
	case dialectPostgres:
		r, inserted, found, err = s.claimPostgres(ctx, req)
	case dialectSQLite:
		r, inserted, found, err = s.claimSQLite(ctx, req)
	default:
		r, inserted, found, err = s.claimMySQL(ctx, req)
	}
	if err != nil || !found {
		return res, false, err
	}
	rec, now := r.rec, r.now
	if inserted {
		return idemstore.ClaimResult{Claimed: true, Record: rec, Now: now}, true, nil
	}

	switch {
	case !now.Before(rec.ExpiresAt):
		// Past retention: absent as far as correctness goes. (MySQL's
		// upsert already replaces such a row; seeing one here means it
		// expired after the upsert ran, and the next round replaces it.)
		if s.dialect == dialectMySQL {
			return res, false, nil
		}
		query, args := s.takeoverStmt(takeExpired, req, rec.LeaseToken)
		taken, ok, terr := s.takeover(ctx, query, args, req)
		if terr != nil || !ok {
			return res, false, terr
		}
		return idemstore.ClaimResult{Claimed: true, Record: taken.rec, Now: taken.now}, true, nil

	case rec.State == idemstore.StateReleased:
		query, args := s.takeoverStmt(takeFreed, req, rec.LeaseToken)
		taken, ok, terr := s.takeover(ctx, query, args, req)
		if terr != nil || !ok {
			return res, false, terr
		}
		return idemstore.ClaimResult{Claimed: true, Record: taken.rec, Now: taken.now}, true, nil

	case rec.State == idemstore.StateInProgress && !now.Before(rec.LeaseExpiresAt) &&
		bytes.Equal(rec.Fingerprint, req.Fingerprint) && (!rec.Uncertain || req.TakeOverUncertain):
		// Its own lease ended (its holder crashed, hung or kept it): taken
		// over, keeping its nonce and its uncertain mark.
		query, args := s.takeoverStmt(takeStale, req, rec.LeaseToken)
		taken, ok, terr := s.takeover(ctx, query, args, req)
		if terr != nil || !ok {
			return res, false, terr
		}
		return idemstore.ClaimResult{Claimed: true, Reclaimed: true, Record: taken.rec, Now: taken.now}, true, nil
	}
	// Live in-progress, uncertain without TakeOverUncertain, settled, or
	// another fingerprint: dispatch on it.
	return idemstore.ClaimResult{Record: rec, Now: now}, true, nil
}

// The fenced takeovers claimOnce runs.
type takeoverKind int

const (
	takeExpired takeoverKind = iota // a row past its retention
	takeFreed                       // a released row
	takeStale                       // an in-progress row whose lease ended
)

// takeoverStmt returns the dialect's statement for a takeover of kind by
// req of the row held under the token old, and its arguments.
func (s *Store) takeoverStmt(kind takeoverKind, req idemstore.ClaimRequest, old string) (string, []any) {
	lease, retention := req.Lease.Microseconds(), req.Retention.Microseconds()
	if s.dialect == dialectPostgres {
		pg := s.q.pg
		switch kind {
		case takeExpired:
			return pg.replace[durable(req)], []any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, retention, old, req.Nonce, lease}
		case takeFreed:
			return pg.reuse[durable(req)], []any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, retention, old, req.Nonce, lease}
		}
		return pg.takeover[durable(req)], []any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, retention, old, lease, req.TakeOverUncertain}
	}
	switch kind {
	case takeExpired:
		return s.q.takeExpired, []any{req.Fingerprint, req.Token, req.RequestID, req.Nonce, lease, retention, req.Principal, req.Key, old}
	case takeFreed:
		return s.q.takeFreed, []any{req.Fingerprint, req.Nonce, req.Fingerprint, req.Token, req.RequestID, lease, retention, req.Principal, req.Key, old}
	}
	return s.q.takeStale, []any{req.Token, req.RequestID, lease, retention, req.Principal, req.Key, old, req.Fingerprint, req.TakeOverUncertain}
}

// durable indexes pgQueries' claim and takeover forms.
func durable(req idemstore.ClaimRequest) int {
	if req.Durable {
		return 1
	}
	return 0
}

// claimPostgres inserts or returns the existing row in one statement
// (pgsql.OneClaim), committed synchronously only when req.Durable.
func (s *Store) claimPostgres(ctx context.Context, req idemstore.ClaimRequest) (r rowWithNow, inserted, found bool, err error) {
	pool, err := s.pool()
	if err != nil {
		return r, false, false, err
	}
	lease, ret := req.Lease.Microseconds(), req.Retention.Microseconds()
	rows, err := pool.QueryContext(ctx, s.q.pg.claim[durable(req)], req.Principal, req.Key, req.Fingerprint,
		req.Token, req.RequestID, ret, req.Nonce, lease)
	if err != nil {
		return r, false, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return r, false, false, err
		}
		return r, false, false, errors.New("the claim statement returned no row")
	}
	// The flag, whether the read found a row, and the clock first: the
	// row's columns are NULL when it found none.
	var (
		rr  recordRow
		row sql.NullString
	)
	dest := make([]any, 0, 17)
	dest = append(dest, &inserted, &row)
	for range 14 {
		dest = append(dest, skipValue{})
	}
	dest = append(dest, (*pgTime)(&rr.now))
	if err := rows.Scan(dest...); err != nil {
		return r, false, false, err
	}
	if !inserted && row.Valid {
		if err := rows.Scan(append([]any{&inserted}, rr.destPG(true)...)...); err != nil {
			return r, false, false, err
		}
	}
	if rows.Next() {
		return r, false, false, errors.New("the claim statement returned more than one row")
	}
	if err := rows.Close(); err != nil {
		return r, false, false, err
	}
	switch {
	case inserted:
		return rowWithNow{claimedRecord(req, rr.now.t), rr.now.t}, true, true, nil
	case !row.Valid:
		// The conflicting row committed after this statement's snapshot.
		return r, false, false, nil
	}
	rec, err := rr.record()
	return rowWithNow{rec, rr.now.t}, false, err == nil, err
}

// claimedRecord is the record a claim of req inserted at t, the database
// clock it inserted with: req's own values, its lease and retention from t.
func claimedRecord(req idemstore.ClaimRequest, t time.Time) idem.Record {
	return idem.Record{
		Principal: req.Principal, Key: req.Key, Fingerprint: bytes.Clone(req.Fingerprint), State: idemstore.StateInProgress,
		LeaseToken: req.Token, RequestID: req.RequestID, Nonce: req.Nonce,
		CreatedAt: t, LockedAt: t,
		LeaseExpiresAt: time.UnixMicro(t.UnixMicro() + req.Lease.Microseconds()),
		ExpiresAt:      time.UnixMicro(t.UnixMicro() + req.Retention.Microseconds()),
	}
}

// skipValue is a scan destination that drops its value.
type skipValue struct{}

func (skipValue) Scan(any) error { return nil }

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
func (s *Store) claimSQLite(ctx context.Context, req idemstore.ClaimRequest) (r rowWithNow, inserted, found bool, err error) {
	r, ok, err := s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || ok {
		return r, false, ok, err
	}
	err = s.writeTurn(ctx, func() error {
		r, ok, err = s.insertSQLite(ctx, req)
		return err
	})
	if err != nil {
		return r, false, false, err
	}
	if ok {
		return r, true, true, nil
	}
	r, ok, err = s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	return r, false, ok, err
}

// claimReturning runs MariaDB's one-statement claim as a prepared
// statement, prepared once per pool connection and kept: go-sql-driver/mysql
// otherwise prepares, executes and closes a statement with arguments on
// every run (two round trips) unless the DSN says interpolateParams=true.
func (s *Store) claimReturning(ctx context.Context, req idemstore.ClaimRequest) (rowWithNow, bool, error) {
	pool, err := s.pool()
	if err != nil {
		return rowWithNow{}, false, err
	}
	s.claimMu.Lock()
	stmt := s.claimStmt
	if stmt == nil || s.claimPool != pool {
		stmt, err = pool.PrepareContext(ctx, s.q.upsertMyRet)
		if err != nil {
			s.claimMu.Unlock()
			return rowWithNow{}, false, err
		}
		if s.claimStmt != nil {
			_ = s.claimStmt.Close()
		}
		s.claimStmt, s.claimPool = stmt, pool
	}
	s.claimMu.Unlock()
	rows, err := stmt.QueryContext(ctx, upsertMyArgs(req)...)
	if err != nil {
		return rowWithNow{}, false, err
	}
	return scanRow(rows, s.dialect, true)
}

// mariaReturning reports whether a MariaDB VERSION() ("10.11.6-MariaDB-…")
// is 10.5 or later, which has INSERT … RETURNING.
func mariaReturning(version string) bool {
	major, rest, _ := strings.Cut(version, ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	return err1 == nil && err2 == nil && (ma > 10 || ma == 10 && mi >= 5)
}

// insertSQLite runs the claim's INSERT … ON CONFLICT DO NOTHING. ok is
// true when it inserted the row; the row is then req's own values, with
// the database clock it returned as created_at, locked_at and now, and
// lease_expires_at and expires_at that clock plus the lease and the
// retention, as the INSERT computed them (SQLite's 'now' is one value
// throughout a statement).
func (s *Store) insertSQLite(ctx context.Context, req idemstore.ClaimRequest) (rowWithNow, bool, error) {
	pool, err := s.pool()
	if err != nil {
		return rowWithNow{}, false, err
	}
	lease, ret := req.Lease.Microseconds(), req.Retention.Microseconds()
	rows, err := pool.QueryContext(ctx, s.q.insertLite,
		req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, req.Nonce, lease, ret)
	if err != nil {
		return rowWithNow{}, false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return rowWithNow{}, false, rows.Err()
	}
	var (
		created timeValue
		token   string
	)
	if err := rows.Scan(&created, &token); err != nil {
		return rowWithNow{}, false, err
	}
	for rows.Next() {
	}
	if err := rows.Close(); err != nil {
		return rowWithNow{}, false, err
	}
	if token != req.Token {
		return rowWithNow{}, false, fmt.Errorf("the claim INSERT returned token %q, not this claim's", token)
	}
	return rowWithNow{claimedRecord(req, created.t), created.t}, true, nil
}

// upsertMyArgs are the arguments of queries.upsertMy for req: the row to
// insert, then the values that replace an expired row.
func upsertMyArgs(req idemstore.ClaimRequest) []any {
	lease, ret := req.Lease.Microseconds(), req.Retention.Microseconds()
	return []any{req.Principal, req.Key, req.Fingerprint, req.Token, req.RequestID, req.Nonce, lease, ret,
		req.Token, req.Fingerprint, req.RequestID, req.Nonce, lease, ret}
}

// claimMySQL runs the conditional upsert (see buildQueries) and reads the
// row it left, both on the primary. The row carries the caller's token iff
// the upsert inserted it or replaced an expired one.
//
// On MariaDB 10.5+ the upsert returns that row itself: one statement.
func (s *Store) claimMySQL(ctx context.Context, req idemstore.ClaimRequest) (r rowWithNow, inserted, found bool, err error) {
	if s.q.upsertMyRet != "" {
		r, ok, err := s.claimReturning(ctx, req)
		if err != nil {
			return r, false, false, err
		}
		if !ok {
			return r, false, false, errors.New("the upsert returned no row")
		}
		return r, r.rec.LeaseToken == req.Token, true, nil
	}
	affected, err := s.exec(ctx, s.q.upsertMy, upsertMyArgs(req)...)
	if err != nil {
		return r, false, false, err
	}
	if affected < 0 || affected > 2 {
		return r, false, false, fmt.Errorf("upsert reported %d rows affected, want 0, 1 or 2", affected)
	}
	r, ok, err := s.queryRow(ctx, true, s.q.selectNow, req.Principal, req.Key)
	if err != nil || !ok {
		return r, false, false, err
	}
	mine := r.rec.LeaseToken == req.Token
	if mine && affected == 0 {
		return r, false, false, errors.New("upsert changed no row, yet the row carries this claim's token")
	}
	if !mine && affected == 2 {
		// We replaced an expired row and someone took it from us within
		// the same instant: only possible with a lease or retention of
		// (almost) zero. Not ours any more; decide again.
		return r, false, false, nil
	}
	return r, mine, true, nil
}

// takeover runs a fenced takeover UPDATE. ok is false when it matched no
// row: the row changed since it was read.
func (s *Store) takeover(ctx context.Context, query string, args []any, req idemstore.ClaimRequest) (rowWithNow, bool, error) {
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
	n, err := s.exec(ctx, query, args...)
	if err != nil {
		return rowWithNow{}, false, err
	}
	// The UPDATE always changes lease_token when it matches, so "changed"
	// and "found" rows agree whatever clientFoundRows says.
	if n != 1 {
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

// exec runs one of the store's writing statements on the primary and
// returns the rows it affected, with the lock timeout in force (see
// execOn).
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	pool, err := s.pool()
	if err != nil {
		return 0, err
	}
	if s.dialect == dialectMySQL && !s.maria {
		conn, err := pool.Conn(ctx)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		res, err := s.execOn(ctx, conn, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	res, err := pool.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// execOn runs one of the store's writing statements on conn. PostgreSQL's
// and MariaDB's statements carry their timeouts themselves; on MySQL the
// session's innodb_lock_wait_timeout is set first (MySQL has no
// per-statement way), and left at the store's value.
func (s *Store) execOn(ctx context.Context, conn *sql.Conn, query string, args ...any) (sql.Result, error) {
	if s.dialect == dialectMySQL && !s.maria {
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = "+
			strconv.FormatInt(mysqlLockSeconds(s.lock), 10)); err != nil {
			return nil, err
		}
	}
	return conn.ExecContext(ctx, query, args...)
}

// queryRow runs a statement that returns at most one record row (plus the
// database clock when withNow) on the primary and reads it completely.
func (s *Store) queryRow(ctx context.Context, withNow bool, query string, args ...any) (rowWithNow, bool, error) {
	pool, err := s.pool()
	if err != nil {
		return rowWithNow{}, false, err
	}
	rows, err := pool.QueryContext(ctx, query, args...)
	if err != nil {
		return rowWithNow{}, false, err
	}
	return scanRow(rows, s.dialect, withNow)
}

// scanRow reads at most one record row (plus the database clock when
// withNow) from rows completely, and closes them.
func scanRow(rows *sql.Rows, d dialect, withNow bool) (rowWithNow, bool, error) {
	defer rows.Close()
	if !rows.Next() {
		return rowWithNow{}, false, rows.Err()
	}
	var r recordRow
	if err := rows.Scan(r.destOf(d, withNow)...); err != nil {
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

// Release implements idemstore.Store: an UPDATE to the released state, fenced by
// the lease token and the in-progress state, clearing the uncertain mark;
// the row keeps its nonce until it expires. It returns idemstore.ErrLeaseLost
// when it matched nothing.
func (s *Store) Release(ctx context.Context, lease idemstore.Lease) error {
	q := s.q.release
	if s.dialect == dialectPostgres {
		q = s.q.pg.release
	}
	return s.endLease(ctx, "release", q, lease)
}

// Keep implements idemstore.Store: an UPDATE, fenced like Release, that marks the
// in-progress record uncertain and ends its lease on the database clock,
// leaving it in progress. It returns idemstore.ErrLeaseLost when it matched
// nothing. On PostgreSQL it commits synchronously.
func (s *Store) Keep(ctx context.Context, lease idemstore.Lease) error {
	q := s.q.keep
	if s.dialect == dialectPostgres {
		q = s.q.pg.keep
	}
	return s.endLease(ctx, "keep", q, lease)
}

// endLease runs Release's or Keep's fenced UPDATE. On SQLite it first
// reads whether the lease still holds its row, and a lease that holds
// nothing ends there, without waiting for the write turn: another
// attempt's transaction can hold that turn for as long as its handler
// runs, and the engine ends every claim whose answer it lost (a waiter's
// whose client went away among them) with a Release or a Keep. The read is
// final: the claim has returned, and no other claim writes this token.
func (s *Store) endLease(ctx context.Context, op, query string, lease idemstore.Lease) error {
	if s.gate != nil {
		held, err := s.holds(ctx, lease)
		if err != nil {
			return s.wrap(op, err)
		}
		if !held {
			return idemstore.ErrLeaseLost
		}
	}
	var n int64
	if err := s.writeTurn(ctx, func() (err error) {
		n, err = s.exec(ctx, query, lease.Principal, lease.Key, lease.Token)
		return err
	}); err != nil {
		return s.wrap(op, err)
	}
	if n != 1 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// holds reports whether lease still holds its in-progress row.
func (s *Store) holds(ctx context.Context, lease idemstore.Lease) (bool, error) {
	pool, err := s.pool()
	if err != nil {
		return false, err
	}
	var one int
	switch err := pool.QueryRowContext(ctx, s.q.held, lease.Principal, lease.Key, lease.Token).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// Get implements idemstore.Store. It returns idemstore.ErrNotFound when no record
// exists; an expired record is returned as it is.
func (s *Store) Get(ctx context.Context, principal, key string) (idem.Record, error) {
	q := s.q.get
	if s.dialect == dialectPostgres {
		q = s.q.pg.get
	}
	r, ok, err := s.queryRow(ctx, false, q, principal, key)
	if err != nil {
		return idem.Record{}, s.wrap("get", err)
	}
	if !ok {
		return idem.Record{}, idemstore.ErrNotFound
	}
	return r.rec, nil
}

// purgeRounds bounds the statements one PurgeExpired call runs to fill its
// batch.
const purgeRounds = 8

// PurgeExpired implements idemstore.Store: it deletes at most limit records
// whose expires_at has passed on the database clock. Several purgers may
// run at once: on PostgreSQL they skip each other's rows (FOR UPDATE SKIP
// LOCKED); on MySQL each picks its batch without locking and deletes it by
// primary key, so two may pick the same rows; on SQLite they take turns.
// Each record is counted by the purger that deleted it. A statement that
// deleted fewer rows than asked while expired rows remained (another
// purger took them, or skipped rows were locked) is followed by another,
// so that PurgeExpired returns less than limit only when a statement found
// nothing more to delete: the sweeper, which stops at the first short
// batch, does not stop early because another sweeper was faster.
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	total := 0
	for range purgeRounds {
		n, err := s.purgeOnce(ctx, limit-total)
		total += n
		if err != nil {
			return total, s.wrap("purge expired", err)
		}
		if n == 0 || total >= limit {
			break
		}
	}
	return total, nil
}

func (s *Store) purgeOnce(ctx context.Context, limit int) (int, error) {
	if s.dialect == dialectMySQL {
		return s.purgeMySQL(ctx, limit)
	}
	var n int64
	err := s.writeTurn(ctx, func() (err error) {
		if s.dialect == dialectPostgres {
			n, err = s.exec(ctx, s.q.pg.purge, limit)
		} else {
			n, err = s.exec(ctx, s.q.purge, limit)
		}
		return err
	})
	return int(n), err
}

// purgeTestHook, when set by a test, runs between the MySQL purge's pick
// and its DELETE with the picked (principal, key) pairs.
var purgeTestHook func(picked []any)

// purgeMySQL picks at most limit expired rows with a plain read and
// deletes those still expired by primary key (see queries.pickMy).
func (s *Store) purgeMySQL(ctx context.Context, limit int) (int, error) {
	pool, err := s.pool()
	if err != nil {
		return 0, err
	}
	rows, err := pool.QueryContext(ctx, s.q.pickMy, limit)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	args := make([]any, 0, 2*limit)
	for rows.Next() {
		var principal, key []byte
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
	if purgeTestHook != nil {
		purgeTestHook(args)
	}
	pairs := strings.Repeat("(?, ?), ", len(args)/2)
	n, err := s.exec(ctx, fmt.Sprintf(s.q.purge, pairs[:len(pairs)-2]), args...)
	return int(n), err
}

// ListStale implements idemstore.Store: at most limit in-progress records whose
// lease_expires_at has passed on the database clock, uncertain ones
// included, the longest expired first.
func (s *Store) ListStale(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	pool, err := s.pool()
	if err != nil {
		return nil, s.wrap("list stale", err)
	}
	q := s.q.listStale
	if s.dialect == dialectPostgres {
		q = s.q.pg.listStale
	}
	rows, err := pool.QueryContext(ctx, q, limit)
	if err != nil {
		return nil, s.wrap("list stale", err)
	}
	defer rows.Close()
	var out []idem.Record
	for rows.Next() {
		var r recordRow
		if err := rows.Scan(r.destOf(s.dialect, false)...); err != nil {
			return nil, s.wrap("list stale", err)
		}
		rec, err := r.record()
		if err != nil {
			return nil, s.wrap("list stale", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("list stale", err)
	}
	return out, nil
}

// recordRow is one scanned row of queries.cols (and the clock).
type recordRow struct {
	principal, key, state, token, requestID, nonce string
	fingerprint, headers, body                     []byte
	status                                         sql.NullInt64
	created, locked, leaseUntil, expires, now      timeValue
	uncertain                                      boolValue
}

// destOf is dest, or destPG on PostgreSQL.
func (r *recordRow) destOf(d dialect, withNow bool) []any {
	if d == dialectPostgres {
		return r.destPG(withNow)
	}
	return r.dest(withNow)
}

// destPG is the scan destination for pgsql.RecordCols (and the clock).
func (r *recordRow) destPG(withNow bool) []any {
	d := []any{&r.principal, &r.key, &r.fingerprint, &r.state, &r.token, &r.requestID, &r.nonce,
		(*pgTime)(&r.created), (*pgTime)(&r.locked), (*pgTime)(&r.leaseUntil), (*pgTime)(&r.expires),
		&r.uncertain, &r.status, &r.headers, &r.body}
	if withNow {
		d = append(d, (*pgTime)(&r.now))
	}
	return d
}

// dest is the scan destination for queries.cols (and the clock).
func (r *recordRow) dest(withNow bool) []any {
	d := []any{&r.principal, &r.key, &r.fingerprint, &r.state, &r.token, &r.requestID, &r.nonce,
		&r.status, &r.headers, &r.body, &r.created, &r.locked, &r.leaseUntil, &r.expires, &r.uncertain}
	if withNow {
		d = append(d, &r.now)
	}
	return d
}

func (r *recordRow) record() (idem.Record, error) {
	rec := idem.Record{
		Principal: r.principal, Key: r.key, Fingerprint: r.fingerprint, State: idemstore.State(r.state),
		LeaseToken: r.token, RequestID: r.requestID, Nonce: r.nonce,
		CreatedAt: r.created.t, LockedAt: r.locked.t, LeaseExpiresAt: r.leaseUntil.t, ExpiresAt: r.expires.t,
		Uncertain: bool(r.uncertain),
	}
	if !rec.State.Valid() {
		return idem.Record{}, fmt.Errorf("record %q/%q has unknown state %q", r.principal, r.key, r.state)
	}
	if r.status.Valid {
		h, err := idemstore.DecodeHeader(r.headers)
		if err != nil {
			return idem.Record{}, fmt.Errorf("record %q/%q: stored headers: %w", r.principal, r.key, err)
		}
		body := r.body
		if body == nil {
			body = []byte{}
		}
		rec.Response = &idem.Response{Status: int(r.status.Int64), Header: h, Body: body}
	}
	return rec, nil
}

// timeValue scans a time column as the store's statements return it: unix
// microseconds as an integer, possibly in text form (MySQL without
// prepared statements, PostgreSQL's simple protocol).
type timeValue struct{ t time.Time }

func (v *timeValue) Scan(src any) error {
	switch x := src.(type) {
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
	case time.Time:
		v.t = x
		return nil
	case nil:
		return errors.New("idemsql: NULL time")
	}
	return fmt.Errorf("idemsql: cannot scan %T into a time", src)
}

func (v *timeValue) parse(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("idemsql: time %q: %w", s, err)
	}
	v.t = time.UnixMicro(n)
	return nil
}

// pgTime scans a time as PostgreSQL's statements return it
// (pgsql.Options.SendTimes): timestamptz_send's eight bytes
// (pgsql.DecodeTimestamptz).
type pgTime timeValue

func (v *pgTime) Scan(src any) error {
	b, _ := src.([]byte)
	t, ok := pgsql.DecodeTimestamptz(b)
	if !ok {
		return fmt.Errorf("idemsql: cannot scan %T (%v) into a PostgreSQL time", src, src)
	}
	v.t = t
	return nil
}

// boolValue scans the uncertain column: a boolean on PostgreSQL, an
// integer 0 or 1 on MySQL (possibly in text form) and SQLite.
type boolValue bool

func (v *boolValue) Scan(src any) error {
	switch x := src.(type) {
	case bool:
		*v = boolValue(x)
		return nil
	case int64:
		*v = x != 0
		return nil
	case []byte:
		return v.parse(string(x))
	case string:
		return v.parse(x)
	case nil:
		return errors.New("idemsql: NULL uncertain")
	}
	return fmt.Errorf("idemsql: cannot scan %T into a bool", src)
}

func (v *boolValue) parse(s string) error {
	switch s {
	case "1", "t", "true":
		*v = true
	case "0", "f", "false":
		*v = false
	default:
		return fmt.Errorf("idemsql: bool %q", s)
	}
	return nil
}

var _ idemstore.Store = (*Store)(nil)
