package idempgx_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

// habits are the pgx idioms that would end the store's transaction, which
// must not compile on the handle, and the code that must: sqlc's generated
// code, river's executor interface, scany's querier, pgx.BeginFunc and
// nested savepoints.
var habits = []storetest.Habit{
	{Name: "defer Rollback", Body: "defer tx.Rollback(ctx)", Want: "tx.Rollback undefined (type *idempgx.Handle has no field or method Rollback)"},
	{Name: "defer Rollback in a closure", Body: "defer func() { _ = tx.Rollback(ctx) }()", Want: "has no field or method Rollback"},
	{Name: "Commit", Body: "return tx.Commit(ctx)", Want: "tx.Commit undefined (type *idempgx.Handle has no field or method Commit)"},
	{Name: "Conn", Body: `_, err := tx.Conn().Exec(ctx, "COMMIT"); return err`, Want: "tx.Conn undefined (type *idempgx.Handle has no field or method Conn)"},
	{Name: "Prepare", Body: `_, err := tx.Prepare(ctx, "s", "SELECT 1"); return err`, Want: "has no field or method Prepare"},
	{Name: "LargeObjects", Body: "_ = tx.LargeObjects()", Want: "has no field or method LargeObjects"},
	{Name: "as a pgx.Tx", Body: "var _ pgx.Tx = tx", Want: "*idempgx.Handle does not implement pgx.Tx (missing method Commit)"},
	{Name: "sqlc, river, scany, BeginFunc", Body: `
		q := New(tx) // sqlc's generated constructor takes a DBTX
		if _, err := q.CountEffects(ctx); err != nil {
			return err
		}
		var _ riverExecutor = tx
		var _ scanyQuerier = tx
		return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := New(sp).CountEffects(ctx); err != nil {
				return err
			}
			nested, err := sp.Begin(ctx)
			if err != nil {
				return err
			}
			defer nested.Rollback(ctx) // a savepoint's: the idiom is fine there
			return nested.Commit(ctx)
		})`},
}

// habitFile is the package each habit is checked in: the handler, the
// code sqlc (pgx/v5) generates for one query, the interface river's pgx
// driver runs its queries through, and scany's pgxscan.Querier.
const habitFile = `package habit

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	idempgx "github.com/idemgo/idem/stores/pgx"
)

func handler(ctx context.Context) error {
	tx, _ := idempgx.Tx(ctx)
	%s
	return nil
}

type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

func New(db DBTX) *Queries { return &Queries{db: db} }

type Queries struct{ db DBTX }

func (q *Queries) CountEffects(ctx context.Context) (int64, error) {
	row := q.db.QueryRow(ctx, "SELECT count(*) FROM effects")
	var count int64
	err := row.Scan(&count)
	return count, err
}

type scanyQuerier interface {
	Query(ctx context.Context, query string, args ...interface{}) (pgx.Rows, error)
}

type riverExecutor interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}
`

// TestHandleHabitsDoNotCompile: the handle has no Commit, Rollback, Conn,
// Prepare or LargeObjects, so handler code that would end the store's
// transaction, or reach around it, is a compile error that names the
// missing method, while sqlc's generated code, river's executor, scany's
// querier and pgx.BeginFunc take the handle (storetest.CheckHabits).
func TestHandleHabitsDoNotCompile(t *testing.T) {
	storetest.CheckHabits(t, habitFile, habits,
		"github.com/idemgo/idem/stores/pgx", "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgconn")
}
