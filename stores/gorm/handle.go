package idemgorm

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	"github.com/idemgo/idem/core/idemstore"
	idemsql "github.com/idemgo/idem/stores/sql"
	"gorm.io/gorm"
)

var (
	errCommitRefused   = fmt.Errorf("idemgorm: Commit refused: %w", idemstore.ErrTxOwned)
	errNoDB            = fmt.Errorf("idemgorm: the idempotency transaction has no *sql.DB to hand out: %w", idemstore.ErrTxOwned)
	errPreparedRefused = fmt.Errorf("idemgorm: prepared statements (gorm.Session{PrepareStmt: true}) are refused on the idempotency transaction: the store must see each statement run in it: %w", idemstore.ErrTxOwned)
)

// pool is the gorm.ConnPool under the *gorm.DB a handler gets: idemsql's
// handle, which runs the statements, plus what GORM asks of a
// transaction. It implements gorm.Tx, so that GORM treats it as one:
// nested Transaction calls become savepoints, GORM's default transaction
// is skipped, dbresolver leaves it alone, and a PrepareStmt session wraps
// it instead of reaching for the pool.
type pool struct{ *idemsql.Handle }

var (
	_ gorm.ConnPool         = (*pool)(nil)
	_ gorm.Tx               = (*pool)(nil)
	_ gorm.GetDBConnector   = (*pool)(nil)
	_ gorm.ConnPoolBeginner = (*pool)(nil)
	_ gorm.Tx               = (*begun)(nil)
)

// session returns the *gorm.DB of h: a new session of the application's
// *gorm.DB whose connection pool is h.
func (s *Store) session(h *idemsql.Handle) *gorm.DB {
	db := s.db.Session(&gorm.Session{NewDB: true, Context: context.Background()})
	p := &pool{h}
	db.Config.ConnPool = p
	db.Config.PrepareStmt = false
	db.Statement.ConnPool = p
	return db
}

// StmtContext implements gorm.Tx for GORM's PrepareStmt sessions. It
// refuses, as the handle's PrepareContext does, with a statement that
// fails when run.
func (p *pool) StmtContext(ctx context.Context, _ *sql.Stmt) *sql.Stmt {
	_, _ = p.PrepareContext(ctx, "")
	return refusedStmt()
}

// Commit implements gorm.TxCommitter: refused, since the store commits
// after the handler returns, together with the stored response.
func (p *pool) Commit() error { return errCommitRefused }

// Rollback implements gorm.TxCommitter. It is refused as the ROLLBACK
// statement is, which aborts the transaction: nothing is stored, and every
// later statement fails.
func (p *pool) Rollback() error {
	_, err := p.ExecContext(context.Background(), "ROLLBACK")
	return fmt.Errorf("idemgorm: Rollback refused (nothing will be stored): %w", err)
}

// GetDBConn implements gorm.GetDBConnector, so that (*gorm.DB).DB() on the
// transaction answers an error instead of a pool that would run statements
// outside it.
func (p *pool) GetDBConn() (*sql.DB, error) { return nil, errNoDB }

// BeginTx implements gorm.ConnPoolBeginner, so that db.Begin() on the
// transaction (a handler's own tx := db.Begin()) gives a working *gorm.DB
// in the store's transaction instead of GORM's ErrInvalidTransaction.
// Nothing is begun: its Commit does nothing (the work commits with the
// stored outcome after the handler returns), and its Rollback, which
// cannot undo part of the store's transaction, is refused with idemstore.ErrTxOwned
// and makes the settle store nothing, as Rollback on the transaction does;
// after a failed statement it does nothing more, since the failure aborted
// the transaction already. For nested work that may roll back on its own,
// db.Transaction sets a savepoint. Options the store's transaction cannot
// honour (an isolation level, read only) are refused with idemstore.ErrTxOwned.
func (p *pool) BeginTx(_ context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	if opts != nil && (opts.Isolation != sql.LevelDefault || opts.ReadOnly) {
		return nil, fmt.Errorf("idemgorm: Begin with isolation %v, read only %v, refused: the handler runs in the idempotency transaction, whose isolation is the store's: %w",
			opts.Isolation, opts.ReadOnly, idemstore.ErrTxOwned)
	}
	return &begun{p}, nil
}

// begun is the ConnPool of a *gorm.DB the handler began on the
// transaction: its statements, with a Commit that waits for the store's
// and a Rollback that is refused (see pool.BeginTx).
type begun struct{ *pool }

// Commit implements gorm.TxCommitter: the work commits with the store's
// transaction.
func (b *begun) Commit() error { return nil }

// Rollback implements gorm.TxCommitter: refused, and nothing is stored,
// unless a statement already failed and aborted the transaction.
func (b *begun) Rollback() error {
	err := b.pool.Rollback()
	if errors.Is(err, idemstore.ErrTxAborted) {
		return nil
	}
	return err
}

// refusedStmt is the statement StmtContext hands out: one of a driver that
// has nothing but a statement that never runs.
var refusedStmt = sync.OnceValue(func() *sql.Stmt {
	st, _ := sql.OpenDB(refusedConnector{}).Prepare("refused")
	return st
})

type refusedConnector struct{}

func (refusedConnector) Connect(context.Context) (driver.Conn, error) { return refusedConn{}, nil }
func (refusedConnector) Driver() driver.Driver                        { return refusedDriver{} }

type refusedDriver struct{}

func (refusedDriver) Open(string) (driver.Conn, error) { return refusedConn{}, nil }

type refusedConn struct{}

func (refusedConn) Prepare(string) (driver.Stmt, error) { return refusedDriverStmt{}, nil }
func (refusedConn) Close() error                        { return nil }
func (refusedConn) Begin() (driver.Tx, error)           { return nil, errPreparedRefused }

type refusedDriverStmt struct{}

func (refusedDriverStmt) Close() error                               { return nil }
func (refusedDriverStmt) NumInput() int                              { return -1 }
func (refusedDriverStmt) Exec([]driver.Value) (driver.Result, error) { return nil, errPreparedRefused }
func (refusedDriverStmt) Query([]driver.Value) (driver.Rows, error)  { return nil, errPreparedRefused }
