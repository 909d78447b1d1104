package idemsql_test

import (
	"testing"

	"github.com/idemgo/idem/core/storetest"
)

// habits are the database/sql idioms that would end the store's
// transaction or reach around it, which must not compile on the handle,
// and the code that must: sqlc's generated code.
var habits = []storetest.Habit{
	{Name: "defer Rollback", Body: "defer tx.Rollback()", Want: "tx.Rollback undefined (type *idemsql.Handle has no field or method Rollback)"},
	{Name: "Commit", Body: "return tx.Commit()", Want: "tx.Commit undefined (type *idemsql.Handle has no field or method Commit)"},
	{Name: "Conn", Body: "_, err := tx.Conn(ctx); return err", Want: "tx.Conn undefined (type *idemsql.Handle has no field or method Conn)"},
	{Name: "BeginTx", Body: "_, err := tx.BeginTx(ctx, nil); return err", Want: "has no field or method BeginTx"},
	{Name: "as a *sql.Tx", Body: "var _ *sql.Tx = tx", Want: "cannot use tx (variable of type *idemsql.Handle) as *sql.Tx value"},
	{Name: "sqlc", Body: `
		_, err := New(tx).CountEffects(ctx) // sqlc's generated constructor takes a DBTX
		return err`},
}

// habitFile is the package each habit is checked in: the handler and the
// code sqlc (database/sql) generates for one query.
const habitFile = `package habit

import (
	"context"
	"database/sql"

	idemsql "github.com/idemgo/idem/stores/sql"
)

var _ *sql.Tx

func handler(ctx context.Context) error {
	tx, _ := idemsql.Tx(ctx)
	%s
	return nil
}

type DBTX interface {
	ExecContext(context.Context, string, ...interface{}) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...interface{}) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...interface{}) *sql.Row
}

func New(db DBTX) *Queries { return &Queries{db: db} }

type Queries struct{ db DBTX }

func (q *Queries) CountEffects(ctx context.Context) (int64, error) {
	row := q.db.QueryRowContext(ctx, "SELECT count(*) FROM effects")
	var count int64
	err := row.Scan(&count)
	return count, err
}
`

// TestHandleHabitsDoNotCompile: the handle has no Commit, Rollback, Conn
// or BeginTx and is no *sql.Tx, so handler code that would end the store's
// transaction, or reach around it, is a compile error that names the
// missing method, while sqlc's generated code takes the handle.
func TestHandleHabitsDoNotCompile(t *testing.T) {
	storetest.CheckHabits(t, habitFile, habits, "github.com/idemgo/idem/stores/sql")
}
