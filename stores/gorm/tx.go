package idemgorm

import (
	"context"
	"errors"

	idem "github.com/idemgo/idem/core"
	"gorm.io/gorm"
)

// sessionKey is the context key under which BeginTx puts the GORM session
// of the transaction.
type sessionKey struct{}

// Tx returns the *gorm.DB of the idempotency transaction that ctx carries,
// bound to ctx (its deadline cancels the handler's statements), and true;
// or nil and false when ctx carries none — the request is not running under
// a claimed idempotency key. ctx may be the framework's own context (a
// *gin.Context), which the adapter gave the attempt (see
// idem.AttemptContext).
//
// Handlers write through it so that their effects commit together with the
// stored response, or not at all. The transaction is sealed as
// idemsql.Handle is: statements that would end or implicitly commit it are
// refused with an error wrapping idemstore.ErrTxOwned, and so are Commit and
// Rollback on it (Rollback also makes the settle store nothing); after a
// statement fails, every later one is refused with idemstore.ErrTxAborted and
// nothing is stored, except that ROLLBACK TO SAVEPOINT to an earlier
// savepoint recovers. GORM's Transaction method on it nests with a
// SAVEPOINT; Begin gives a *gorm.DB in the same transaction (see
// pool.BeginTx). Return from the handler to commit; return an error (or a
// 5xx) to roll back.
func Tx(ctx context.Context) (*gorm.DB, bool) {
	ctx, _ = idem.AttemptContext(ctx)
	db, ok := ctx.Value(sessionKey{}).(*gorm.DB)
	if !ok || db == nil {
		return nil, false
	}
	return db.WithContext(ctx), true
}

// DB returns the *gorm.DB a handler should use for ctx: the idempotency
// transaction when ctx carries one (see Tx), otherwise fallback bound to
// ctx — typically the application's own *gorm.DB, for routes or requests
// that run without an idempotency key. ctx may be the framework's own
// context (a *gin.Context), which the adapter gave the attempt (see
// idem.AttemptContext).
//
// It never falls back while an attempt is running: when ctx belongs to an
// idempotent attempt whose store is not this one, every statement of the
// *gorm.DB it returns fails with ErrNoTx, instead of writing outside the
// guarantee. It returns nil when ctx carries no attempt and fallback is
// nil.
func DB(ctx context.Context, fallback *gorm.DB) *gorm.DB {
	if tx, ok := Tx(ctx); ok {
		return tx
	}
	if fallback == nil {
		return nil
	}
	db := fallback.WithContext(ctx)
	if _, running := idem.AttemptContext(ctx); running {
		_ = db.AddError(ErrNoTx)
	}
	return db
}

// ErrNoTx is the error of every statement run through the *gorm.DB that
// DB returns for an idempotent attempt that carries no idemgorm
// transaction (the engine runs on another store).
var ErrNoTx = errors.New("idemgorm: this request runs in an idempotent attempt whose store is not idemgorm: DB will not fall back to the application's database, whose writes would be outside the guarantee")
