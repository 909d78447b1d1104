package idemgorm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

	idem "github.com/idemgo/idem/core"
	"gorm.io/gorm"

	"github.com/go-sql-driver/mysql"
)

// txKey is the context key under which BeginTx puts the transaction. No
// other package can make one, so nothing else can put a value there.
type txKey struct{}

// Tx is the transaction BeginTx began for one handler: a GORM transaction
// that the handler's writes and the stored outcome share. It implements
// idem.Tx.
type Tx struct {
	store *Store
	lease idem.Lease
	db    *gorm.DB // the GORM transaction

	marked bool // MySQL: the marker row is in place
	gated  bool // SQLite: holds the store's write turn until finished

	mu   sync.Mutex
	done bool
}

// BeginTx implements idem.Store. It begins a GORM transaction on the
// store's *gorm.DB and returns ctx carrying it, for DB and TxFrom. The
// transaction is begun on context.WithoutCancel(ctx): database/sql rolls a
// transaction back the moment its BeginTx context is cancelled, and a
// client that hangs up must not take the commit of work already done with
// it; the engine bounds the settle with its own store timeout instead.
//
// On SQLite opened with SQLiteDSN this takes the database's single write
// lock until Settle or Rollback.
func (s *Store) BeginTx(ctx context.Context, lease idem.Lease) (context.Context, idem.Tx, error) {
	if s.gate != nil {
		if err := s.gate.acquire(ctx); err != nil {
			return ctx, nil, wrap("begin", err)
		}
	}
	gtx := s.db.WithContext(context.WithoutCancel(ctx)).Begin()
	if gtx.Error != nil {
		if s.gate != nil {
			s.gate.release()
		}
		return ctx, nil, wrap("begin", gtx.Error)
	}
	t := &Tx{store: s, lease: lease, db: gtx, gated: s.gate != nil}
	var err error
	switch s.dialect {
	case dialectSQLite:
		err = t.markSQLite()
	case dialectMySQL:
		err = t.markMySQL()
	}
	if err != nil {
		_ = t.rollback()
		t.ungate()
		return ctx, nil, wrap("begin", err)
	}
	return context.WithValue(ctx, txKey{}, t), t, nil
}

// MySQL's InnoDB rolls the whole transaction back on a deadlock (1213), or
// on a lock wait timeout with innodb_rollback_on_timeout, and the session
// carries on in autocommit mode: the same hazard as SQLite's (below). The
// same remedy: an uncommitted marker row in a TEMPORARY InnoDB table of the
// connection, which the settle UPDATE requires. Creating a temporary table
// needs the CREATE TEMPORARY TABLES privilege (and, with GTIDs, MySQL
// 8.0.13+ or row-based binary logging); where the database refuses, the
// store goes on without the guard, as Guarded reports.
const (
	mysqlMarkerTable = "CREATE TEMPORARY TABLE IF NOT EXISTS idemgorm_tx_marker" +
		" (id TINYINT NOT NULL PRIMARY KEY, token VARBINARY(255) NOT NULL) ENGINE=InnoDB"
	mysqlMarkerSet   = "INSERT INTO idemgorm_tx_marker (id, token) VALUES (1, ?) ON DUPLICATE KEY UPDATE token = ?"
	mysqlMarkerHolds = " AND EXISTS (SELECT 1 FROM idemgorm_tx_marker WHERE id = 1 AND token = ?)"
	mysqlMarkerGet   = "SELECT token FROM idemgorm_tx_marker WHERE id = 1"
)

func (t *Tx) markMySQL() error {
	if t.store.unguarded.Load() {
		return nil
	}
	err := t.db.Exec(mysqlMarkerSet, t.lease.Token, t.lease.Token).Error
	var my *mysql.MySQLError
	if err == nil || !errors.As(err, &my) || my.Number != 1146 { // 1146: no such table (on this connection yet)
		t.marked = err == nil
		return err
	}
	if cerr := t.db.Exec(mysqlMarkerTable).Error; cerr != nil {
		if !errors.As(cerr, &my) {
			return fmt.Errorf("marker table: %w", cerr)
		}
		// Refused (privilege, GTID consistency): run unguarded.
		t.store.unguarded.Store(true)
		return nil
	}
	if err := t.db.Exec(mysqlMarkerSet, t.lease.Token, t.lease.Token).Error; err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	t.marked = true
	return nil
}

// SQLite ends a transaction by itself when a statement in it is interrupted
// (the driver interrupts on a cancelled context), and on SQLITE_FULL,
// SQLITE_IOERR, SQLITE_NOMEM or some SQLITE_BUSY errors. The connection
// then runs every further statement in autocommit mode: a settle UPDATE
// after a swallowed error would commit the outcome on its own, without the
// handler's writes. So each transaction writes a marker — its lease token —
// into a per-connection TEMP table as its first statement, and the settle
// UPDATE only matches while that uncommitted marker is there: if SQLite
// rolled the transaction back, the marker went with it.
const (
	sqliteMarkerTable = "CREATE TEMP TABLE IF NOT EXISTS idemgorm_tx (id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL)"
	sqliteMarkerSet   = "INSERT INTO temp.idemgorm_tx (id, token) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET token = excluded.token"
	sqliteMarkerHolds = " AND EXISTS (SELECT 1 FROM temp.idemgorm_tx WHERE id = 1 AND token = ?)"
	sqliteMarkerGet   = "SELECT token FROM temp.idemgorm_tx WHERE id = 1"
)

// ErrTxEnded is returned (wrapped) by Tx.Settle when the database ended the
// transaction before the settle — SQLite after an interrupted or failed
// write, MySQL after a deadlock — and nothing was stored. The handler's
// writes made before that point were rolled back; any it made after ran in
// autocommit mode.
var ErrTxEnded = errors.New("the database ended the transaction early (a statement in it failed or was interrupted); nothing was stored")

func (t *Tx) markSQLite() error {
	if err := t.db.Exec(sqliteMarkerTable).Error; err != nil {
		return fmt.Errorf("marker table: %w", err)
	}
	if err := t.db.Exec(sqliteMarkerSet, t.lease.Token).Error; err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	return nil
}

// TxFrom returns the idempotency transaction that ctx carries, bound to ctx
// (its deadline cancels the handler's statements), and true; or nil and
// false when ctx carries none — the request is not running under a claimed
// idempotency key.
//
// Handlers write through it so that their effects commit together with the
// stored response, or not at all. Do not Commit or Rollback it yourself:
// the store does that when the request finishes. GORM's Transaction method
// on it nests with a SAVEPOINT.
func TxFrom(ctx context.Context) (*gorm.DB, bool) {
	t, ok := ctx.Value(txKey{}).(*Tx)
	if !ok || t == nil {
		return nil, false
	}
	return t.db.WithContext(ctx), true
}

// DB returns the *gorm.DB a handler should use for ctx: the idempotency
// transaction when ctx carries one (see TxFrom), otherwise fallback bound to
// ctx — typically the application's own *gorm.DB, for routes or requests
// that run without an idempotency key. Use TxFrom to tell the two apart.
// It returns nil when ctx carries no transaction and fallback is nil.
func DB(ctx context.Context, fallback *gorm.DB) *gorm.DB {
	if tx, ok := TxFrom(ctx); ok {
		return tx
	}
	if fallback == nil {
		return nil
	}
	return fallback.WithContext(ctx)
}

// DB returns the idempotency transaction ctx carries, or the store's own
// *gorm.DB bound to ctx when there is none. Use TxFrom to tell the two
// apart.
func (s *Store) DB(ctx context.Context) *gorm.DB { return DB(ctx, s.db) }

// Settle implements idem.Tx. It stores outcome with an UPDATE fenced by the
// lease token and the in-progress state, in the handler's transaction, then
// commits. When the UPDATE matches no row the lease was lost to a takeover:
// it rolls back (the handler's writes with it) and returns
// idem.ErrLeaseLost. When any statement or the commit fails — for example
// because a failed statement aborted the transaction on PostgreSQL — it
// returns that error and nothing is stored. After Settle the Tx is
// finished.
func (t *Tx) Settle(ctx context.Context, outcome idem.Outcome) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return errors.New("idemgorm: settle: transaction already finished")
	}
	t.done = true
	defer t.ungate()
	if outcome.State != idem.StateCompleted && outcome.State != idem.StateFailed {
		_ = t.rollback()
		return fmt.Errorf("idemgorm: settle: outcome state %q is not terminal", outcome.State)
	}
	header, err := encodeHeader(outcome.Response.Header)
	if err != nil {
		_ = t.rollback()
		return fmt.Errorf("idemgorm: settle: encode headers: %w", err)
	}
	body := outcome.Response.Body
	if body == nil {
		body = []byte{}
	}
	args := []any{string(outcome.State), outcome.Response.Status, header, body,
		t.lease.Principal, t.lease.Key, t.lease.Token}
	query := t.store.q.settle
	switch {
	case t.store.dialect == dialectSQLite:
		query += sqliteMarkerHolds
		args = append(args, t.lease.Token)
	case t.marked:
		query += mysqlMarkerHolds
		args = append(args, t.lease.Token)
	}
	res := t.db.WithContext(ctx).Exec(query, args...)
	if res.Error != nil {
		_ = t.rollback()
		if t.store.dialect == dialectSQLite && strings.Contains(res.Error.Error(), "no such table: temp.idemgorm_tx") {
			// The marker table was created in this transaction, and
			// SQLite's rollback took it away.
			return fmt.Errorf("idemgorm: settle: %w", ErrTxEnded)
		}
		return wrap("settle", res.Error)
	}
	switch res.RowsAffected {
	case 1:
	case 0:
		err := idem.ErrLeaseLost
		switch {
		case t.store.dialect == dialectSQLite:
			err = t.whyNotSettled(sqliteMarkerGet)
		case t.marked:
			err = t.whyNotSettled(mysqlMarkerGet)
		}
		_ = t.rollback()
		return err
	default:
		_ = t.rollback()
		return fmt.Errorf("idemgorm: settle: the fenced UPDATE matched %d rows", res.RowsAffected)
	}
	if t.store.dialect == dialectSQLite {
		return t.commitSQLite()
	}
	if err := t.db.Commit().Error; err != nil {
		// database/sql has ended the transaction either way; roll back in
		// case the driver left it open.
		_ = t.rollback()
		return wrap("settle: commit", err)
	}
	return nil
}

// whyNotSettled tells a lost lease from a transaction the database ended on
// its own, when the guarded settle UPDATE matched nothing.
func (t *Tx) whyNotSettled(markerGet string) error {
	var token string
	err := t.db.WithContext(context.Background()).Raw(markerGet).Row().Scan(&token)
	var my *mysql.MySQLError
	switch {
	case err == nil && token == t.lease.Token:
		return idem.ErrLeaseLost
	case err == nil || errors.Is(err, sql.ErrNoRows) || strings.Contains(err.Error(), "no such table") ||
		(errors.As(err, &my) && my.Number == 1146):
		return fmt.Errorf("idemgorm: settle: %w", ErrTxEnded)
	default:
		return fmt.Errorf("idemgorm: settle: cannot tell whether the transaction is still open, nothing was stored: %w", err)
	}
}

// commitSQLite commits with a COMMIT statement on the transaction's own
// connection instead of database/sql's Commit. When COMMIT fails (a
// deferred foreign key, SQLITE_BUSY) SQLite keeps the transaction open, and
// database/sql would put the connection back into the pool with it — still
// holding the write lock and the handler's uncommitted writes, for the next
// user of that connection to see or commit. Here a failed COMMIT is
// followed by a ROLLBACK on the same connection. Either way database/sql's
// own transaction is then ended with a Rollback that finds nothing to do.
func (t *Tx) commitSQLite() error {
	db := t.db.WithContext(context.Background())
	if err := db.Exec("COMMIT").Error; err != nil {
		rerr := db.Exec("ROLLBACK").Error
		_ = t.rollback()
		if rerr != nil && !noTxActive(rerr) {
			return wrap("settle: commit", errors.Join(err, fmt.Errorf("rollback after failed commit: %w", rerr)))
		}
		return wrap("settle: commit", err)
	}
	_ = t.rollback()
	return nil
}

// noTxActive reports SQLite's answer to COMMIT or ROLLBACK outside a
// transaction.
func noTxActive(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no transaction is active")
}

// Rollback implements idem.Tx: it abandons the transaction and every write
// made in it. It is safe to call after Settle and more than once.
func (t *Tx) Rollback(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil
	}
	t.done = true
	defer t.ungate()
	return t.rollback()
}

// ungate gives the SQLite write turn to the next writer, once.
func (t *Tx) ungate() {
	if t.gated {
		t.gated = false
		t.store.gate.release()
	}
}

func (t *Tx) rollback() error {
	pool := t.db.Statement.ConnPool
	committer, ok := pool.(gorm.TxCommitter)
	if !ok || committer == nil {
		return nil
	}
	if err := committer.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) && !noTxActive(err) {
		return wrap("rollback", err)
	}
	return nil
}

var _ idem.Tx = (*Tx)(nil)
