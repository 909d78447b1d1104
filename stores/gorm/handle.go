package idemgorm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"gorm.io/gorm"
)

// ErrTxOwned is idem.ErrTxOwned: the handle refuses Commit, Rollback and
// transaction-control statements with an error wrapping it.
var ErrTxOwned = idem.ErrTxOwned

// ErrTxEnded is idemstore.ErrTxEnded: Settle returns an error wrapping it when
// the database ended the handler's transaction by itself (a MySQL
// deadlock, an interrupted SQLite statement) before the settle.
var ErrTxEnded = idemstore.ErrTxEnded

// ErrTxAborted is wrapped by the error every statement gets after an
// earlier statement on the handle failed, as PostgreSQL answers in an
// aborted transaction, on every dialect: the transaction is aborted and
// Settle stores nothing. A ROLLBACK TO SAVEPOINT to a savepoint taken
// before the failure recovers, as in PostgreSQL (GORM's nested Transaction
// relies on it).
var ErrTxAborted = errors.New("idemgorm: the idempotency transaction is aborted: an earlier statement in it failed; nothing more runs in it and nothing will be stored")

var (
	errCommitRefused   = fmt.Errorf("idemgorm: Commit refused: %w", ErrTxOwned)
	errRollbackRefused = fmt.Errorf("idemgorm: Rollback refused (nothing will be stored): %w", ErrTxOwned)
	errNoDB            = fmt.Errorf("idemgorm: the idempotency transaction has no *sql.DB to hand out: %w", ErrTxOwned)
	errPreparedRefused = fmt.Errorf("idemgorm: prepared statements (gorm.Session{PrepareStmt: true}) are refused on the idempotency transaction: the store must see each statement run in it: %w", ErrTxOwned)
	errFinished        = errors.New("idemgorm: the idempotency transaction is finished: the handler returned, so nothing more runs in it")
)

// handle is the gorm.ConnPool under the *gorm.DB a handler gets. It runs
// statements on the transaction's connection after the filter (see
// inspect), refuses Commit and Rollback, keeps every statement out once
// one failed, and never gives out the connection. It implements gorm.Tx,
// so that GORM treats it as a transaction: nested Transaction calls become
// savepoints, GORM's default transaction is skipped, dbresolver leaves it
// alone, and a PrepareStmt session wraps it instead of reaching for the
// pool.
type handle struct{ t *storeTx }

var (
	_ gorm.ConnPool         = (*handle)(nil)
	_ gorm.Tx               = (*handle)(nil)
	_ gorm.GetDBConnector   = (*handle)(nil)
	_ gorm.ConnPoolBeginner = (*handle)(nil)
	_ gorm.Tx               = (*begun)(nil)
)

// ExecContext implements gorm.ConnPool.
func (h *handle) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	v, err := h.t.admit(query)
	if err != nil {
		return nil, err
	}
	res, err := h.t.conn.ExecContext(ctx, query, args...)
	h.t.after(v, err)
	return res, err
}

// QueryContext implements gorm.ConnPool.
func (h *handle) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	v, err := h.t.admit(query)
	if err != nil {
		return nil, err
	}
	rows, err := h.t.conn.QueryContext(ctx, query, args...)
	h.t.after(v, err)
	return relayQuery(ctx, rows, err, h.t.seen)
}

// QueryRowContext implements gorm.ConnPool.
func (h *handle) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	v, err := h.t.admit(query)
	if err != nil {
		return relayRow(ctx, nil, err, h.t.seen)
	}
	rows, err := h.t.conn.QueryContext(ctx, query, args...)
	h.t.after(v, err)
	return relayRow(ctx, rows, err, h.t.seen)
}

// PrepareContext implements gorm.ConnPool. It refuses: a prepared
// statement would run later without passing the handle.
func (h *handle) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	h.t.refuse(errPreparedRefused)
	return nil, errPreparedRefused
}

// StmtContext implements gorm.Tx for GORM's PrepareStmt sessions. It
// refuses, with a statement that fails when run.
func (h *handle) StmtContext(context.Context, *sql.Stmt) *sql.Stmt {
	h.t.refuse(errPreparedRefused)
	relayDB()
	return refusedStmt
}

// Commit implements gorm.TxCommitter: the store commits after the handler
// returns, together with the stored response.
func (h *handle) Commit() error { return errCommitRefused }

// Rollback implements gorm.TxCommitter. It is refused too, but the wish is
// kept: nothing is stored, and Settle rolls everything back.
func (h *handle) Rollback() error {
	h.t.mu.Lock()
	h.t.rollbackAsked = true
	h.t.mu.Unlock()
	return errRollbackRefused
}

// GetDBConn implements gorm.GetDBConnector, so that (*gorm.DB).DB() on the
// handle answers an error instead of a pool that would run statements
// outside the transaction.
func (h *handle) GetDBConn() (*sql.DB, error) { return nil, errNoDB }

// BeginTx implements gorm.ConnPoolBeginner, so that db.Begin() on the
// handle (a handler's own tx := db.Begin(), and the default transaction
// GORM opens around each write) gives a working *gorm.DB in the store's
// transaction instead of GORM's ErrInvalidTransaction. Nothing is begun:
// its Commit does nothing (the work commits with the stored outcome after
// the handler returns), and its Rollback, which cannot undo part of the
// store's transaction, is refused with ErrTxOwned and makes the settle
// store nothing, as Rollback on the handle does; after a failed statement
// (GORM's default transaction rolls back a failed write) it does nothing
// more, since the failure aborted the transaction already. For nested
// work that may roll back on its own, db.Transaction sets a savepoint.
// Options the store's transaction cannot honour (an isolation level, read
// only) are refused with ErrTxOwned.
func (h *handle) BeginTx(_ context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	if opts != nil && (opts.Isolation != sql.LevelDefault || opts.ReadOnly) {
		return nil, fmt.Errorf("idemgorm: Begin with isolation %v, read only %v, refused: the handler runs in the idempotency transaction, whose isolation is the store's: %w",
			opts.Isolation, opts.ReadOnly, ErrTxOwned)
	}
	return &begun{h}, nil
}

// begun is the ConnPool of a *gorm.DB the handler began on the handle: the
// handle's statements, with a Commit that waits for the store's and a
// Rollback that is refused (see handle.BeginTx).
type begun struct{ *handle }

// Commit implements gorm.TxCommitter: the work commits with the store's
// transaction.
func (b *begun) Commit() error { return nil }

// Rollback implements gorm.TxCommitter: refused, and nothing is stored,
// unless a statement already failed and aborted the transaction.
func (b *begun) Rollback() error {
	b.t.mu.Lock()
	defer b.t.mu.Unlock()
	if b.t.failed != nil {
		return nil
	}
	b.t.rollbackAsked = true
	return errRollbackRefused
}

// admit decides whether query may run now.
func (t *storeTx) admit(query string) (verdict, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return verdict{}, errFinished
	}
	t.used = true
	v := t.inspect(query)
	if v.refused != "" {
		err := fmt.Errorf("idemgorm: refused before it reached the database: %s: %w", v.refused, ErrTxOwned)
		t.failLocked(err)
		return v, err
	}
	if v.dirty {
		t.dirty = true
	}
	if t.failed != nil {
		if !t.lost && v.single && len(v.ops) == 1 && v.ops[0].kind == stmtRollbackTo && t.hasSavepoint(v.ops[0].name) {
			return v, nil
		}
		return v, fmt.Errorf("%w (first failure: %v)", ErrTxAborted, t.failed)
	}
	return v, nil
}

// inspect is the package's inspect, except that when the readings of
// query disagree (MySQL's 'it\'s; COMMIT' is one string, or a string and
// a COMMIT under NO_BACKSLASH_ESCAPES) it asks the session how it reads
// quotes now, and follows that reading. A query that may change the
// reading on its way is refused. Called with t.mu held.
func (t *storeTx) inspect(query string) verdict {
	d := t.store.dialect
	vs := readAll(d, query)
	if v, ok := agreed(vs); ok {
		return v
	}
	if mentionsQuoting(query) {
		return inspect(d, query)
	}
	m, err := t.sessionReading()
	if err != nil {
		return verdict{refused: fmt.Sprintf("the statement reads differently under different quoting settings, and the session's could not be read: %v", err)}
	}
	for i, r := range d.readings() {
		if r == m {
			return vs[i]
		}
	}
	return inspect(d, query)
}

// sessionReading asks the transaction's session how it reads quotes.
func (t *storeTx) sessionReading() (lexMode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var v string
	switch t.store.dialect {
	case dialectMySQL:
		if err := t.conn.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode LIMIT 1").Scan(&v); err != nil {
			return lexMode{}, err
		}
		v = strings.ToUpper(v)
		return lexMode{backslash: !strings.Contains(v, "NO_BACKSLASH_ESCAPES"), ansiQuotes: strings.Contains(v, "ANSI_QUOTES")}, nil
	case dialectPostgres:
		if err := t.conn.QueryRowContext(ctx, "SELECT current_setting('standard_conforming_strings') LIMIT 1").Scan(&v); err != nil {
			return lexMode{}, err
		}
		return lexMode{backslash: v != "on"}, nil
	}
	return lexMode{}, nil
}

// after records how an admitted statement went.
func (t *storeTx) after(v verdict, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.failLocked(err)
		return
	}
	for _, op := range v.ops {
		switch op.kind {
		case stmtSavepoint:
			t.savepoints = append(t.savepoints, op.name)
		case stmtRollbackTo:
			if i := t.lastSavepoint(op.name); i >= 0 {
				t.savepoints = t.savepoints[:i+1]
				if v.single {
					t.failed = nil // recovered, as in PostgreSQL
				}
			}
		case stmtRelease:
			if i := t.lastSavepoint(op.name); i >= 0 {
				t.savepoints = t.savepoints[:i]
			}
		}
	}
}

// seen records an error met while the handler read rows.
func (t *storeTx) seen(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failLocked(err)
}

func (t *storeTx) refuse(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.used = true
	t.failLocked(err)
}

func (t *storeTx) failLocked(err error) {
	if t.failed == nil {
		t.failed = err
	}
	if t.store.endsTx(err) {
		t.lost = true
	}
}

func (t *storeTx) hasSavepoint(name string) bool { return t.lastSavepoint(name) >= 0 }

func (t *storeTx) lastSavepoint(name string) int {
	for i := len(t.savepoints) - 1; i >= 0; i-- {
		if t.savepoints[i] == name {
			return i
		}
	}
	return -1
}
