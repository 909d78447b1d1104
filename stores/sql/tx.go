package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// txKey is the context key under which BeginTx puts the transaction. No
// other package can make one, so nothing else can put a value there.
type txKey struct{}

// Tx returns the handle of the idempotency transaction that ctx carries,
// and true; or nil and false when ctx carries none — the request is not
// running under a claimed idempotency key, or its store is not this
// package's. ctx may be the framework's own context (a *gin.Context),
// which the adapter gave the attempt (see idem.AttemptContext).
//
// Handlers write through it so that their effects commit together with the
// stored response, or not at all (see Handle). Return from the handler to
// commit; return an error (or a 5xx) to roll back.
func Tx(ctx context.Context) (*Handle, bool) {
	ctx, _ = idem.AttemptContext(ctx)
	t, ok := ctx.Value(txKey{}).(*storeTx)
	if !ok || t == nil {
		return nil, false
	}
	return &t.handle, true
}

// storeTx is the transaction BeginTx began for one handler, on a
// connection of its own (a *sql.Conn, not a *sql.Tx: the store runs BEGIN
// and COMMIT itself, so that the COMMIT is bounded by the settle's context
// and a connection whose transaction state is unknown is closed, never put
// back into the pool).
type storeTx struct {
	store  *Store
	lease  idemstore.Lease
	conn   *sql.Conn
	handle Handle

	marked   bool // MySQL: the marker row is in place
	prepared bool // PostgreSQL: the session has the store's prepared statements (pgSession)
	gated    bool // SQLite: holds the store's write turn until finished

	mu         sync.Mutex
	done       bool     // Settle or Rollback ran
	closed     bool     // the handle runs nothing more
	used       bool     // the handler ran something through the handle
	failed     error    // the first failure of a statement on the handle
	lost       bool     // that failure ended the transaction or lost the connection
	dirty      bool     // the handler changed session state: close the connection, do not pool it
	savepoints []string // the handler's savepoints, oldest first
}

// BeginTx implements idemstore.Store. It takes a connection from the pool,
// begins a transaction on it and returns ctx carrying it, for Tx. ctx
// bounds taking the connection and the BEGIN only: the transaction outlives a cancelled ctx
// until Settle or Rollback ends it.
//
// On SQLite this takes the database's single write lock until Settle or
// Rollback. On PostgreSQL the idemstore.Tx is an idemstore.Syncer (see pgTx.Sync);
// on MySQL and SQLite, whose claims are durable when Claim returns, it is
// not.
func (s *Store) BeginTx(ctx context.Context, lease idemstore.Lease) (context.Context, idemstore.Tx, error) {
	if s.gate != nil {
		if err := s.gate.acquire(ctx); err != nil {
			return ctx, nil, s.wrap("begin", err)
		}
	}
	t, err := s.begin(ctx, lease)
	if err != nil {
		if s.gate != nil {
			s.gate.release()
		}
		return ctx, nil, s.wrap("begin", err)
	}
	t.gated = s.gate != nil
	ctx = context.WithValue(ctx, txKey{}, t)
	if s.dialect == dialectPostgres {
		return ctx, pgTx{t}, nil
	}
	return ctx, t, nil
}

func (s *Store) begin(ctx context.Context, lease idemstore.Lease) (*storeTx, error) {
	pool, err := s.pool()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, err
	}
	t := &storeTx{store: s, lease: lease, conn: conn}
	if s.dialect == dialectPostgres {
		err = t.beginPostgres(ctx)
	} else {
		_, err = conn.ExecContext(ctx, s.dialect.beginSQL())
	}
	if err != nil {
		t.discard()
		return nil, err
	}
	switch s.dialect {
	case dialectSQLite:
		err = t.markSQLite(ctx)
	case dialectMySQL:
		err = t.markMySQL(ctx)
	}
	if err != nil {
		t.endConn(ctx, false)
		return nil, err
	}
	t.handle = Handle{t}
	return t, nil
}

// MySQL's InnoDB rolls the whole transaction back on a deadlock (1213), or
// on a lock wait timeout with innodb_rollback_on_timeout, and the session
// carries on in autocommit mode. The handle refuses every statement after
// such an error; the marker catches the routes it cannot see: an
// uncommitted marker row in a TEMPORARY InnoDB table of the connection,
// which the settle UPDATE requires. Creating a temporary table needs the
// CREATE TEMPORARY TABLES privilege (and, with GTIDs, MySQL 8.0.13+ or
// row-based binary logging); where the database refuses it for one of
// those reasons, the store goes on without the marker, says so once in the
// log, and Guarded reports it.
const (
	mysqlMarkerTable = "CREATE TEMPORARY TABLE IF NOT EXISTS idemsql_tx_marker" +
		" (id TINYINT NOT NULL PRIMARY KEY, token VARBINARY(255) NOT NULL) ENGINE=InnoDB"
	mysqlMarkerHolds = " AND EXISTS (SELECT 1 FROM idemsql_tx_marker WHERE id = 1 AND token = ?)"
	mysqlMarkerGet   = "SELECT token FROM idemsql_tx_marker WHERE id = 1 LIMIT 1"
)

// mysqlMarkerSet sets the marker to token. The token rides in the text as a
// hex literal, which no sql_mode or character set reads differently and
// which needs no escaping: a statement without arguments is one round trip
// where go-sql-driver/mysql would otherwise prepare, execute and close it
// (unless the DSN says interpolateParams=true).
func mysqlMarkerSet(token string) string {
	x := "X'" + hex.EncodeToString([]byte(token)) + "'"
	return "INSERT INTO idemsql_tx_marker (id, token) VALUES (1, " + x + ") ON DUPLICATE KEY UPDATE token = " + x
}

// mysqlMarkerRefusals are the errors that mean the marker table cannot be
// created for this database user or server configuration: access denied
// (1044, 1142, 1227), a temporary table not allowed in a transaction under
// GTID consistency (1787), InnoDB temporary tables unavailable (1286,
// 1478).
var mysqlMarkerRefusals = map[uint16]bool{1044: true, 1142: true, 1227: true, 1787: true, 1286: true, 1478: true}

func (t *storeTx) markMySQL(ctx context.Context) error {
	if t.store.unguarded.Load() {
		return nil
	}
	_, err := t.conn.ExecContext(ctx, mysqlMarkerSet(t.lease.Token))
	if n, ok := mysqlNumber(err); err == nil || !ok || n != 1146 { // 1146: no such table (on this connection yet)
		t.marked = err == nil
		return err
	}
	if _, cerr := t.conn.ExecContext(ctx, mysqlMarkerTable); cerr != nil {
		if n, ok := mysqlNumber(cerr); !ok || !mysqlMarkerRefusals[n] {
			return fmt.Errorf("marker table: %w", cerr)
		}
		if !t.store.unguarded.Swap(true) {
			t.store.logger.WarnContext(ctx, "idemsql: the database refused the temporary marker table: "+
				"Settle can no longer tell a transaction MySQL ended by itself from a live one; "+
				"grant CREATE TEMPORARY TABLES to restore the guard", slog.String("error", cerr.Error()))
		}
		return nil
	}
	if _, err := t.conn.ExecContext(ctx, mysqlMarkerSet(t.lease.Token)); err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	t.marked = true
	return nil
}

// SQLite ends a transaction by itself when a statement in it is interrupted
// (the driver interrupts on a cancelled context), and on SQLITE_FULL,
// SQLITE_IOERR, SQLITE_NOMEM or some SQLITE_BUSY errors. The connection
// then runs every further statement in autocommit mode. The same marker
// as MySQL's, in a per-connection TEMP table: if SQLite rolled the
// transaction back, the marker went with it.
const (
	sqliteMarkerTable = "CREATE TEMP TABLE IF NOT EXISTS idemsql_tx (id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL)"
	sqliteMarkerSet   = "INSERT INTO temp.idemsql_tx (id, token) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET token = excluded.token"
	sqliteMarkerHolds = " AND EXISTS (SELECT 1 FROM temp.idemsql_tx WHERE id = 1 AND token = ?)"
	sqliteMarkerGet   = "SELECT token FROM temp.idemsql_tx WHERE id = 1"
)

// markSQLite sets the marker, creating its table first only when the
// connection has none yet (its first transaction, or one after a
// transaction that created it rolled back): one statement per transaction
// instead of two. A statement that fails to prepare leaves the transaction
// as it was.
func (t *storeTx) markSQLite(ctx context.Context) error {
	_, err := t.conn.ExecContext(ctx, sqliteMarkerSet, t.lease.Token)
	if err != nil && strings.Contains(err.Error(), "no such table: temp.idemsql_tx") {
		if _, err := t.conn.ExecContext(ctx, sqliteMarkerTable); err != nil {
			return fmt.Errorf("marker table: %w", err)
		}
		_, err = t.conn.ExecContext(ctx, sqliteMarkerSet, t.lease.Token)
	}
	if err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	t.marked = true
	return nil
}

// Used implements idemstore.Tx: whether the handler ran anything through the
// handle.
func (t *storeTx) Used() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

// Settle implements idemstore.Tx. It stores outcome with an UPDATE fenced by the
// lease token and the in-progress state, in the handler's transaction, then
// commits with a COMMIT bounded by ctx. When the UPDATE matches no row the
// lease was lost to a takeover: it rolls back (the handler's writes with
// it) and returns idemstore.ErrLeaseLost. When a statement on the handle failed,
// or the handler asked for a rollback, it rolls back and stores nothing;
// the error wraps idemstore.ErrTxEnded when the database had already ended the
// transaction by itself. After Settle the transaction is finished.
func (t *storeTx) Settle(ctx context.Context, outcome idemstore.Outcome) error {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return errors.New("idemsql: settle: transaction already finished")
	}
	t.done, t.closed = true, true
	failed, lost := t.failed, t.lost
	t.mu.Unlock()
	defer t.ungate()

	if outcome.State != idemstore.StateCompleted && outcome.State != idemstore.StateFailed {
		t.endConn(ctx, false)
		return fmt.Errorf("idemsql: settle: outcome state %q is not terminal", outcome.State)
	}
	if failed != nil {
		ended := lost || t.serverEnded(ctx)
		t.endConn(ctx, false)
		switch {
		case ended && !errors.Is(failed, driver.ErrBadConn) && !connGone(failed):
			return fmt.Errorf("idemsql: settle: the database rolled the transaction back by itself (%v); nothing was stored: %w", failed, idemstore.ErrTxEnded)
		case errors.Is(failed, idemstore.ErrTxOwned):
			return fmt.Errorf("idemsql: settle: the handler tried to end the transaction; it was rolled back and nothing was stored: %w", failed)
		default:
			return fmt.Errorf("idemsql: settle: nothing was stored: %w: %w", idemstore.ErrTxAborted, failed)
		}
	}
	body := outcome.Response.Body
	if body == nil {
		body = []byte{}
	}
	if t.store.dialect == dialectPostgres {
		return t.settlePostgres(ctx, []any{t.lease.Principal, t.lease.Key, t.lease.Token,
			string(outcome.State), outcome.Response.Status, idemstore.EncodeHeader(outcome.Response.Header), body})
	}
	q := t.store.q
	args := []any{string(outcome.State), outcome.Response.Status, idemstore.EncodeHeader(outcome.Response.Header), body,
		t.lease.Principal, t.lease.Key, t.lease.Token}
	query := q.settle
	switch {
	case t.marked && t.store.dialect == dialectSQLite:
		query += sqliteMarkerHolds
		args = append(args, t.lease.Token)
	case t.marked:
		query += mysqlMarkerHolds
		args = append(args, t.lease.Token)
	}
	res, err := t.store.execOn(ctx, t.conn, query, args...)
	if err != nil {
		ended := t.serverEnded(ctx)
		t.endConn(ctx, false)
		if ended {
			return fmt.Errorf("idemsql: settle: the database rolled the transaction back by itself; nothing was stored: %w", idemstore.ErrTxEnded)
		}
		return t.store.wrap("settle", err)
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		t.endConn(ctx, false)
		return t.store.wrap("settle", err)
	case n == 0:
		err := idemstore.ErrLeaseLost
		if t.marked && t.serverEnded(ctx) {
			err = fmt.Errorf("idemsql: settle: the database rolled the transaction back by itself; nothing was stored: %w", idemstore.ErrTxEnded)
		}
		t.endConn(ctx, false)
		return err
	case n != 1:
		t.endConn(ctx, false)
		return fmt.Errorf("idemsql: settle: the fenced UPDATE matched %d rows", n)
	}
	return t.commit(ctx)
}

// settlePostgres settles on PostgreSQL with pgsql.Settle's args: in one
// round trip with the settings and COMMIT (settleAndCommit), or, on a
// driver that cannot send them as one query string, one by one. The settle
// raises when its fence misses (pgsql.LeaseLostMarker): the lease was lost
// to a takeover, and the transaction is rolled back.
func (t *storeTx) settlePostgres(ctx context.Context, args []any) error {
	if sent, err := t.settleAndCommit(ctx, args); sent {
		return err
	}
	pg := t.store.q.pg
	_, err := t.conn.ExecContext(ctx, pg.settlePrelude)
	if err == nil {
		_, err = t.conn.ExecContext(ctx, pg.settle, args...)
	}
	if err != nil {
		ended := !isLeaseLost(err) && t.serverEnded(ctx)
		t.endConn(ctx, false)
		switch {
		case isLeaseLost(err):
			return idemstore.ErrLeaseLost
		case ended:
			return fmt.Errorf("idemsql: settle: the database rolled the transaction back by itself; nothing was stored: %w", idemstore.ErrTxEnded)
		}
		return t.store.wrap("settle", err)
	}
	return t.commit(ctx)
}

// commit runs COMMIT on the transaction's connection, bounded by ctx. When
// it fails the connection is rolled back (SQLite keeps a transaction open
// after a failed COMMIT) or closed: it never goes back into the pool with
// the transaction's state unknown.
func (t *storeTx) commit(ctx context.Context) error {
	if _, err := t.conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.endConn(ctx, false)
		return t.store.wrap("settle: commit", err)
	}
	t.endConn(ctx, true)
	return nil
}

// serverEnded reports whether the database has ended the transaction by
// itself: the MySQL or SQLite marker is gone. PostgreSQL never does while
// the connection lives.
func (t *storeTx) serverEnded(ctx context.Context) bool {
	if !t.marked {
		return false
	}
	get := mysqlMarkerGet
	if t.store.dialect == dialectSQLite {
		get = sqliteMarkerGet
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var token string
	err := t.conn.QueryRowContext(cctx, get).Scan(&token)
	n, isMy := mysqlNumber(err)
	switch {
	case err == nil:
		return token != t.lease.Token
	case errors.Is(err, sql.ErrNoRows), strings.Contains(err.Error(), "no such table"),
		isMy && n == 1146:
		return true
	}
	return false // cannot tell (the connection is gone): nothing committed through it
}

// Rollback implements idemstore.Tx: it abandons the transaction and every write
// made in it. It is safe to call after Settle and more than once.
func (t *storeTx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return nil
	}
	t.done, t.closed = true, true
	t.mu.Unlock()
	defer t.ungate()
	t.endConn(ctx, false)
	return nil
}

// endConn ends the transaction's connection: after a successful COMMIT it
// goes back to the pool; otherwise it is rolled back first, and closed
// instead when the ROLLBACK fails, so that no pooled connection is ever
// left inside a transaction.
func (t *storeTx) endConn(ctx context.Context, committed bool) {
	if t.conn == nil {
		return
	}
	if !committed {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := t.conn.ExecContext(rctx, "ROLLBACK")
		cancel()
		if err != nil && !noTxActive(err) {
			t.discard()
			return
		}
	}
	t.mu.Lock()
	dirty := t.dirty
	t.mu.Unlock()
	if dirty {
		// What the handler set (search_path, sql_mode, a temporary
		// table…) would outlive the request on a pooled connection.
		t.discard()
		return
	}
	_ = t.conn.Close()
	t.conn = nil
}

// discard closes the connection instead of returning it to the pool.
func (t *storeTx) discard() {
	if t.conn == nil {
		return
	}
	_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = t.conn.Close()
	t.conn = nil
}

// noTxActive reports SQLite's answer to COMMIT or ROLLBACK outside a
// transaction.
func noTxActive(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no transaction is active")
}

// connGone reports an error that says the connection itself was lost.
func connGone(err error) bool {
	if err == nil {
		return false
	}
	var lost errConnLost
	return errors.Is(err, driver.ErrBadConn) || mysqlInvalidConn(err) ||
		errors.Is(err, sql.ErrConnDone) || errors.As(err, &lost)
}

// ungate gives the SQLite write turn to the next writer, once.
func (t *storeTx) ungate() {
	if t.gated {
		t.gated = false
		t.store.gate.release()
	}
}

// pgTx is the idemstore.Tx of a PostgreSQL transaction: a storeTx that is an
// idemstore.Syncer, since the claim before it may have committed without its
// WAL flush (see buildQueries).
type pgTx struct{ *storeTx }

// Sync implements idemstore.Syncer: it returns once the WAL is flushed past
// the claim of the transaction's attempt, so the claim survives a database
// crash (pgsql.WaitFlushed). It runs on the transaction's own connection
// and writes nothing. A handler's transaction that failed already cannot
// run it, and a failure of its statements aborts the transaction as a
// handler's would.
//
// When the flush stalls short of the claim (another session wrote after it
// and keeps its transaction open, and nothing on the server commits), Sync
// commits a transaction of its own, with synchronous_commit on, through
// the pool, when the pool has an idle connection or room for a new one at
// that moment: it does not wait for a connection another request holds.
func (t pgTx) Sync(ctx context.Context) error {
	return t.store.wrap("sync", pgsql.WaitFlushed(ctx, t.syncQuery, t.store.nudge))
}

// nudge is Sync's pgsql.Nudge: pgsql.NudgeSQL through the pool, within
// pgsql.NudgeTimeout, when the pool has an idle connection or room for a
// new one.
func (s *Store) nudge(ctx context.Context) {
	if st := s.db.Stats(); st.Idle == 0 && st.MaxOpenConnections > 0 && st.OpenConnections >= st.MaxOpenConnections {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, pgsql.NudgeTimeout)
	defer cancel()
	_, _ = s.db.ExecContext(ctx, pgsql.NudgeSQL)
}

// syncQuery is Sync's pgsql.QueryRow: it runs one of Sync's statements on
// the transaction's connection, as long as the transaction is open and has
// not failed, and records its failure as a handler statement's would be.
func (t pgTx) syncQuery(ctx context.Context, query string, dest ...any) error {
	t.mu.Lock()
	closed, failed := t.closed, t.failed
	t.mu.Unlock()
	switch {
	case closed:
		return errFinished
	case failed != nil:
		return fmt.Errorf("%w (first failure: %v)", idemstore.ErrTxAborted, failed)
	}
	if err := t.conn.QueryRowContext(ctx, query).Scan(dest...); err != nil {
		t.seen(err)
		return err
	}
	return nil
}

var (
	_ idemstore.Tx     = (*storeTx)(nil)
	_ idemstore.Syncer = pgTx{}
)
