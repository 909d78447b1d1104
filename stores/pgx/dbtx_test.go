package idempgx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The code below is written the way sqlc (sql_package pgx/v5) generates it
// for four queries on the business table effects(id): a DBTX interface the
// constructor takes (*pgxpool.Pool, pgx.Tx, and the handle), a Queries
// struct, one method per query, and WithTx, which takes a pgx.Tx. Table
// names are the generated code's own concern, so the queries take the
// table as it is spelled in the test schema.

type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

func New(db DBTX, table pgx.Identifier) *Queries {
	return &Queries{db: db, table: table}
}

type Queries struct {
	db    DBTX
	table pgx.Identifier
}

func (q *Queries) WithTx(tx pgx.Tx) *Queries {
	return &Queries{db: tx, table: q.table}
}

// -- name: InsertEffect :exec
func (q *Queries) InsertEffect(ctx context.Context, id string) error {
	_, err := q.db.Exec(ctx, "INSERT INTO "+q.table.Sanitize()+" (id) VALUES ($1)", id)
	return err
}

// -- name: CountEffects :one
func (q *Queries) CountEffects(ctx context.Context, prefix string) (int64, error) {
	row := q.db.QueryRow(ctx, "SELECT count(*) FROM "+q.table.Sanitize()+" WHERE id LIKE $1 || '%'", prefix)
	var count int64
	err := row.Scan(&count)
	return count, err
}

// -- name: ListEffects :many
func (q *Queries) ListEffects(ctx context.Context, prefix string) ([]string, error) {
	rows, err := q.db.Query(ctx, "SELECT id FROM "+q.table.Sanitize()+" WHERE id LIKE $1 || '%' ORDER BY id", prefix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var items []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		items = append(items, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return items, nil
}

// -- name: CopyEffects :copyfrom
func (q *Queries) CopyEffects(ctx context.Context, ids []string) (int64, error) {
	rows := make([][]any, len(ids))
	for i, id := range ids {
		rows[i] = []any{id}
	}
	return q.db.CopyFrom(ctx, q.table, []string{"id"}, pgx.CopyFromRows(rows))
}

// -- name: InsertEffects :batchexec
func (q *Queries) InsertEffects(ctx context.Context, ids []string) error {
	batch := &pgx.Batch{}
	for _, id := range ids {
		batch.Queue("INSERT INTO "+q.table.Sanitize()+" (id) VALUES ($1)", id)
	}
	br := q.db.SendBatch(ctx, batch)
	for range ids {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
	}
	return br.Close()
}

// effects is the env's business table, as sqlc's queries name it.
func (e *env) effects() pgx.Identifier { return pgx.Identifier{e.Schema, "effects"} }

// TestSqlcOnTheHandle: code sqlc generates runs on the handle, every kind
// of query, in the store's transaction: nothing is visible before the
// settle and everything commits with it. WithTx, which takes a pgx.Tx,
// takes a savepoint.
func TestSqlcOnTheHandle(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	req, txCtx, stx, tx := e.begin(t, ctx)
	p := req.Key + "/"
	q := New(tx, e.effects())
	if err := q.InsertEffect(txCtx, p+"exec"); err != nil {
		t.Fatal(err)
	}
	if n, err := q.CopyEffects(txCtx, []string{p + "copy1", p + "copy2"}); err != nil || n != 2 {
		t.Fatalf("copy: %d %v", n, err)
	}
	if err := q.InsertEffects(txCtx, []string{p + "batch1", p + "batch2"}); err != nil {
		t.Fatal(err)
	}
	sp, err := tx.Begin(txCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.WithTx(sp).InsertEffect(txCtx, p+"savepoint"); err != nil {
		t.Fatal(err)
	}
	if err := sp.Commit(txCtx); err != nil {
		t.Fatal(err)
	}
	want := []string{p + "batch1", p + "batch2", p + "copy1", p + "copy2", p + "exec", p + "savepoint"}
	if ids, err := q.ListEffects(txCtx, p); err != nil || strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("in the transaction: %q %v, want %q", ids, err, want)
	}
	outside := New(e.Pool, e.effects())
	if n, err := outside.CountEffects(ctx, p); err != nil || n != 0 {
		t.Fatalf("%d rows visible before the settle (%v)", n, err)
	}
	if err := stx.Settle(ctx, okResponse("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := outside.CountEffects(ctx, p); err != nil || n != int64(len(want)) {
		t.Fatalf("%d rows committed with the settle (%v), want %d", n, err, len(want))
	}
}

// TestBeginFuncOnTheHandle: pgx.BeginFunc on the handle runs fn in a
// savepoint: a nil error releases it, an error (also after a failed
// statement, which aborts the transaction) rolls back to it, undoing fn's
// work only, and the transaction goes on and settles.
func TestBeginFuncOnTheHandle(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	req, txCtx, stx, tx := e.begin(t, ctx)
	p := req.Key + "/"
	q := New(tx, e.effects())
	if err := q.InsertEffect(txCtx, p+"outer"); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(txCtx, tx, func(sp pgx.Tx) error {
		return New(sp, e.effects()).InsertEffect(txCtx, p+"kept")
	}); err != nil {
		t.Fatalf("BeginFunc: %v", err)
	}
	errUndo := errors.New("undo")
	if err := pgx.BeginFunc(txCtx, tx, func(sp pgx.Tx) error {
		if err := New(sp, e.effects()).InsertEffect(txCtx, p+"undone"); err != nil {
			return err
		}
		return errUndo
	}); !errors.Is(err, errUndo) {
		t.Fatalf("BeginFunc with a failing fn = %v, want fn's error", err)
	}
	if err := pgx.BeginFunc(txCtx, tx, func(sp pgx.Tx) error {
		if err := New(sp, e.effects()).InsertEffect(txCtx, p+"undone too"); err != nil {
			return err
		}
		_, err := sp.Exec(txCtx, "SELECT 1/0")
		return err
	}); sqlStateOf(err) != "22012" {
		t.Fatalf("BeginFunc with a failed statement = %v, want its division_by_zero", err)
	}
	// Nested: the inner failure undoes the inner work only.
	if err := pgx.BeginFunc(txCtx, tx, func(sp pgx.Tx) error {
		if err := New(sp, e.effects()).InsertEffect(txCtx, p+"nested outer"); err != nil {
			return err
		}
		if err := pgx.BeginFunc(txCtx, sp, func(inner pgx.Tx) error {
			_ = New(inner, e.effects()).InsertEffect(txCtx, p+"nested inner")
			return errUndo
		}); !errors.Is(err, errUndo) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("nested BeginFunc: %v", err)
	}
	want := []string{p + "kept", p + "nested outer", p + "outer"}
	if ids, err := q.ListEffects(txCtx, p); err != nil || strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Fatalf("in the transaction: %q %v, want %q", ids, err, want)
	}
	if err := stx.Settle(ctx, okResponse("x")); err != nil {
		t.Fatalf("settle after the savepoints: %v", err)
	}
	if n, err := New(e.Pool, e.effects()).CountEffects(ctx, p); err != nil || n != int64(len(want)) {
		t.Fatalf("%d rows committed (%v), want %d", n, err, len(want))
	}
}
