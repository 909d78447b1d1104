// Package idemgorm is an idemstore.Store for GORM applications on PostgreSQL,
// MySQL/MariaDB and SQLite: the idemsql store on the *sql.DB behind the
// *gorm.DB, whose transaction handlers reach as a *gorm.DB with Tx (or
// DB). The handler's own writes and the stored outcome commit in one
// transaction.
//
// Everything the store does — its statements, the seal on the
// transaction, the dialects — is idemsql's (see its documentation); this
// package gives GORM a session whose connection pool is idemsql's handle,
// and keeps GORM's habits working on it: Begin and Transaction nest as
// savepoints, Commit and Rollback are refused with idemstore.ErrTxOwned.
package idemgorm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	idemsql "github.com/idemgo/idem/stores/sql"
	"gorm.io/gorm"
	"gorm.io/plugin/dbresolver"
)

// Store is an idemstore.Store on a *gorm.DB: an idemsql.Store on its *sql.DB
// (the primary's, when gorm.io/plugin/dbresolver is configured), whose
// BeginTx also puts the GORM session of the transaction into the context.
// The store runs its own statements on the *sql.DB, never through GORM's
// callbacks or logger: a replica never answers a claim, and a normal
// request logs nothing. It is safe for concurrent use.
type Store struct {
	*idemsql.Store
	db *gorm.DB
}

// Option configures a Store: the options of idemsql (WithTable,
// WithLockTimeout, idemsql.WithLogger).
type Option = idemsql.Option

// DefaultTable is the table the store uses unless WithTable names
// another.
const DefaultTable = idemsql.DefaultTable

// DefaultLockTimeout is the lock timeout unless WithLockTimeout sets one.
const DefaultLockTimeout = idemsql.DefaultLockTimeout

// WithTable is idemsql.WithTable: the store's table name, optionally
// schema-qualified.
func WithTable(name string) Option { return idemsql.WithTable(name) }

// WithLockTimeout is idemsql.WithLockTimeout: how long the store's
// statements wait for a row lock before failing as transient.
func WithLockTimeout(d time.Duration) Option { return idemsql.WithLockTimeout(d) }

// SchemaError is idemsql.SchemaError: what Check found wrong with the
// table.
type SchemaError = idemsql.SchemaError

// SQLiteDSN is idemsql.SQLiteDSN: a DSN for github.com/glebarez/sqlite
// that makes a file database fit for concurrent requests.
func SQLiteDSN(path string, busyTimeout time.Duration) string {
	return idemsql.SQLiteDSN(path, busyTimeout)
}

// New returns a Store on db. The dialect is the one db.Dialector.Name()
// names: "postgres", "mysql" (MySQL 8 and MariaDB 10.5+) or "sqlite"
// (SQLite 3.37+, for example github.com/glebarez/sqlite). The store's
// warnings go to slog.Default() unless idemsql.WithLogger says otherwise.
// See idemsql.New for what New asks the database, and Migrate, Schema and
// Check for the table.
func New(db *gorm.DB, opts ...Option) (*Store, error) {
	if db == nil || db.Dialector == nil || db.Statement == nil {
		return nil, errors.New("idemgorm: New: nil or uninitialised *gorm.DB")
	}
	if _, ok := db.Statement.ConnPool.(gorm.TxCommitter); ok {
		return nil, errors.New("idemgorm: New: the *gorm.DB is a transaction; pass the application's *gorm.DB")
	}
	pool, err := primary(db)
	if err != nil {
		return nil, err
	}
	inner, err := idemsql.New(pool, append([]Option{idemsql.WithDialect(db.Dialector.Name())}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Store{Store: inner, db: db}, nil
}

// primary returns the *sql.DB the store's statements run on: the primary's
// (dbresolver's source) when dbresolver is configured, otherwise db's own.
func primary(db *gorm.DB) (*sql.DB, error) {
	p := db.Clauses(dbresolver.Write).Statement.ConnPool
	switch x := p.(type) {
	case *sql.DB:
		return x, nil
	case gorm.GetDBConnector:
		db, err := x.GetDBConn()
		if err == nil && db != nil {
			return db, nil
		}
	}
	return nil, fmt.Errorf("idemgorm: the *gorm.DB's connection pool is a %T, which hands out no *sql.DB", p)
}

// BeginTx implements idemstore.Store: idemsql's BeginTx, with the transaction's
// GORM session in the returned context, for Tx and DB. The session is
// made here, once per transaction, without a round trip.
func (s *Store) BeginTx(ctx context.Context, lease idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, lease)
	if err != nil {
		return ctx, nil, err
	}
	h, ok := idemsql.Tx(ctx)
	if !ok {
		_ = tx.Rollback(ctx)
		return ctx, nil, errors.New("idemgorm: begin: idemsql's context carries no handle")
	}
	return context.WithValue(ctx, sessionKey{}, s.session(h)), tx, nil
}

var _ idemstore.Store = (*Store)(nil)
