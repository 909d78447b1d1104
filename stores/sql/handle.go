package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/sqlguard"
)

var (
	errPreparedRefused = fmt.Errorf("idemsql: prepared statements are refused on the idempotency transaction: the store must see each statement run in it: %w", idemstore.ErrTxOwned)
	errFinished        = errors.New("idemsql: the idempotency transaction is finished: the handler returned, so nothing more runs in it")
)

// Handle is the idempotency transaction as a handler gets it from Tx: the
// four methods of sqlc's DBTX (and of GORM's ConnPool), so sqlc's generated
// code and plain database/sql code run in the transaction.
//
// It has no Commit, Rollback, Conn or Begin, so that handler code that
// would end the store's transaction, or reach around it, does not compile:
// the store commits the handler's writes together with the stored outcome
// after the handler returns; to roll back, return an error (or a 5xx).
// Statements that would end or implicitly commit the transaction (COMMIT,
// ROLLBACK, BEGIN, and on MySQL DDL and the other statements that commit
// implicitly) are refused with an error wrapping idemstore.ErrTxOwned before they
// reach the database, and so is PrepareContext: a prepared statement would
// run later, where the store cannot see it. After a statement fails, every
// later one is refused with idemstore.ErrTxAborted and nothing is stored, except
// that ROLLBACK TO SAVEPOINT to an earlier savepoint recovers; SAVEPOINT
// and RELEASE SAVEPOINT run as written. Rows and Row report their errors
// to the store as the handler reads them. Once the handler has returned,
// every method fails.
//
// A Handle is safe for concurrent use, as the *sql.Conn under it is; the
// statements of one transaction still run one at a time.
type Handle struct{ t *storeTx }

// ExecContext runs query with args in the idempotency transaction.
func (h *Handle) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	v, err := h.t.admit(query)
	if err != nil {
		return nil, err
	}
	res, err := h.t.conn.ExecContext(ctx, query, args...)
	h.t.after(v, err)
	return res, err
}

// QueryContext runs query with args in the idempotency transaction and
// returns its rows; an error met while reading them aborts the
// transaction, as a failed statement does.
func (h *Handle) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	v, err := h.t.admit(query)
	if err != nil {
		return nil, err
	}
	rows, err := h.t.conn.QueryContext(ctx, query, args...)
	h.t.after(v, err)
	return relayQuery(ctx, rows, err, h.t.seen)
}

// QueryRowContext runs query with args in the idempotency transaction and
// returns its first row, as (*sql.DB).QueryRowContext does; its error,
// refusals included, comes with Scan.
func (h *Handle) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	v, err := h.t.admit(query)
	if err != nil {
		return relayRow(ctx, nil, err, h.t.seen)
	}
	rows, err := h.t.conn.QueryContext(ctx, query, args...)
	h.t.after(v, err)
	return relayRow(ctx, rows, err, h.t.seen)
}

// PrepareContext is refused with an error wrapping idemstore.ErrTxOwned, and the
// transaction is aborted: a prepared statement would run later without
// passing the handle. sqlc's generated code prepares only with
// emit_prepared_queries, on the pool, never on a DBTX it runs through.
func (h *Handle) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	h.t.refuse(errPreparedRefused)
	return nil, errPreparedRefused
}

// admit decides whether query may run now.
func (t *storeTx) admit(query string) (sqlguard.Verdict, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return sqlguard.Verdict{}, errFinished
	}
	t.used = true
	v := t.inspect(query)
	if t.failed != nil && v.Refused == "" {
		if !t.lost && v.Single && len(v.Ops) == 1 && v.Ops[0].Kind == sqlguard.RollbackTo && t.hasSavepoint(v.Ops[0].Name) {
			return v, nil
		}
		return v, fmt.Errorf("%w (first failure: %v)", idemstore.ErrTxAborted, t.failed)
	}
	if v.Refused != "" {
		err := fmt.Errorf("idemsql: refused before it reached the database: %s: %w", v.Refused, idemstore.ErrTxOwned)
		if t.failed != nil {
			// Already aborted: nothing will be stored either way.
			return v, fmt.Errorf("%w: %w (first failure: %v)", err, idemstore.ErrTxAborted, t.failed)
		}
		t.failLocked(err)
		return v, err
	}
	if v.Dirty {
		t.dirty = true
	}
	return v, nil
}

// inspect is sqlguard.Inspect, except that when the readings of
// query disagree (MySQL's 'it\'s; COMMIT' is one string, or a string and
// a COMMIT under NO_BACKSLASH_ESCAPES) it asks the session how it reads
// quotes now, and follows that reading. A query that may change the
// reading on its way is refused. Called with t.mu held.
func (t *storeTx) inspect(query string) sqlguard.Verdict {
	d := t.store.dialect.guard()
	vs := sqlguard.ReadAll(d, query)
	if v, ok := sqlguard.Agreed(vs); ok {
		return v
	}
	if sqlguard.MentionsQuoting(query) {
		return sqlguard.Inspect(d, query)
	}
	m, err := t.sessionReading()
	if err != nil {
		return sqlguard.Verdict{Refused: fmt.Sprintf("the statement reads differently under different quoting settings, and the session's could not be read: %v", err)}
	}
	for i, r := range d.Readings() {
		if r == m {
			return vs[i]
		}
	}
	return sqlguard.Inspect(d, query)
}

// sessionReading asks the transaction's session how it reads quotes.
func (t *storeTx) sessionReading() (sqlguard.Reading, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var v string
	switch t.store.dialect {
	case dialectMySQL:
		if err := t.conn.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode LIMIT 1").Scan(&v); err != nil {
			return sqlguard.Reading{}, err
		}
		v = strings.ToUpper(v)
		return sqlguard.Reading{Backslash: !strings.Contains(v, "NO_BACKSLASH_ESCAPES"), ANSIQuotes: strings.Contains(v, "ANSI_QUOTES")}, nil
	case dialectPostgres:
		if err := t.conn.QueryRowContext(ctx, "SELECT current_setting('standard_conforming_strings') LIMIT 1").Scan(&v); err != nil {
			return sqlguard.Reading{}, err
		}
		return sqlguard.Reading{Backslash: v != "on"}, nil
	}
	return sqlguard.Reading{}, nil
}

// after records how an admitted statement went.
func (t *storeTx) after(v sqlguard.Verdict, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.failLocked(err)
		return
	}
	for _, op := range v.Ops {
		switch op.Kind {
		case sqlguard.Savepoint:
			t.savepoints = append(t.savepoints, op.Name)
		case sqlguard.RollbackTo:
			if i := t.lastSavepoint(op.Name); i >= 0 {
				t.savepoints = t.savepoints[:i+1]
				if v.Single {
					t.failed = nil // recovered, as in PostgreSQL
				}
			}
		case sqlguard.Release:
			if i := t.lastSavepoint(op.Name); i >= 0 {
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
