package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// The behaviour suite: the same statements, one by one, through the
// handle idempgx gives a handler and through a plain pgx.Tx on the same
// server, with the outcomes compared: success or error (SQLSTATE, or the
// kind of client-side error), rows, command tags, and in the end what
// committed. The steps use what the two have in common (dbtx); Prepare and
// LargeObjects, which the handle does not have, run in a savepoint, which
// has them. The plain transaction ends with Commit, ours with Settle; a
// plain COMMIT answered with ROLLBACK must be a settle that stores nothing.
// The intended differences are checked separately: transaction-control
// statements answer ErrTxOwned (TestRefusedStatements), nothing
// hands out the connection (TestNoRouteToTheConnection), and Commit,
// Rollback, Conn, Prepare and LargeObjects do not compile on the handle
// (TestHandleHabitsDoNotCompile).

// dbtx is what the handle and a plain pgx.Tx have in common.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

var (
	_ dbtx = (*idempgx.Handle)(nil)
	_ dbtx = pgx.Tx(nil)
)

// behaviourStep runs one thing through tx against table tbl and describes
// what happened.
type behaviourStep func(ctx context.Context, tx dbtx, tbl string) string

// describeErr reduces err to what both transactions must agree on.
func describeErr(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &pgErr):
		return "pg " + pgErr.Code
	case errors.Is(err, pgx.ErrTxClosed):
		return "tx closed"
	case errors.Is(err, pgx.ErrNoRows):
		return "no rows"
	}
	return "client error"
}

func execStep(sql string, args ...any) behaviourStep {
	return func(ctx context.Context, tx dbtx, tbl string) string {
		tag, err := tx.Exec(ctx, strings.ReplaceAll(sql, "TBL", tbl), args...)
		return fmt.Sprintf("exec %s tag=%q", describeErr(err), tag.String())
	}
}

func queryStep(sql string, args ...any) behaviourStep {
	return func(ctx context.Context, tx dbtx, tbl string) string {
		rows, err := tx.Query(ctx, strings.ReplaceAll(sql, "TBL", tbl), args...)
		if err != nil {
			return "query " + describeErr(err)
		}
		var out []string
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				out = append(out, "values "+describeErr(err))
				break
			}
			out = append(out, fmt.Sprint(vals...))
		}
		rows.Close()
		return fmt.Sprintf("query rows=%q err=%s tag=%q", out, describeErr(rows.Err()), rows.CommandTag().String())
	}
}

func queryRowStep(sql string, args ...any) behaviourStep {
	return func(ctx context.Context, tx dbtx, tbl string) string {
		var v any
		err := tx.QueryRow(ctx, strings.ReplaceAll(sql, "TBL", tbl), args...).Scan(&v)
		return fmt.Sprintf("queryrow %v %s", v, describeErr(err))
	}
}

func batchStep(sqls ...string) behaviourStep {
	return func(ctx context.Context, tx dbtx, tbl string) string {
		b := &pgx.Batch{}
		for _, s := range sqls {
			b.Queue(strings.ReplaceAll(s, "TBL", tbl))
		}
		br := tx.SendBatch(ctx, b)
		var out []string
		for range sqls {
			tag, err := br.Exec()
			out = append(out, fmt.Sprintf("%s %q", describeErr(err), tag.String()))
		}
		return fmt.Sprintf("batch %q close=%s", out, describeErr(br.Close()))
	}
}

var behaviourSteps = map[string]behaviourStep{
	"insert":        execStep("INSERT INTO TBL (n, s) VALUES ($1, $2)", 1, "one"),
	"insert simple": execStep("INSERT INTO TBL (n, s) VALUES (2, 'two')"),
	"query all":     queryStep("SELECT n, s FROM TBL ORDER BY n"),
	"query early close": func(ctx context.Context, tx dbtx, tbl string) string {
		rows, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 1000) g")
		if err != nil {
			return "query " + describeErr(err)
		}
		rows.Next()
		var first int
		scanErr := rows.Scan(&first)
		rows.Close()
		return fmt.Sprintf("early close first=%d scan=%s err=%s", first, describeErr(scanErr), describeErr(rows.Err()))
	},
	"query row": queryRowStep("SELECT count(*) FROM TBL"),
	// Rows read to their end are closed by pgx, without Close: the
	// connection is free for the next statement.
	"query to its end, no close": func(ctx context.Context, tx dbtx, tbl string) string {
		rows, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 3) g")
		if err != nil {
			return "query " + describeErr(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+tbl+" (n, s) VALUES ($1, 'after rows')", 90+n)
		return fmt.Sprintf("rows %d err %s then exec %s", n, describeErr(rows.Err()), describeErr(err))
	},
	"query no row": queryRowStep("SELECT n FROM TBL WHERE n < 0"),
	"batch":        batchStep("INSERT INTO TBL (n, s) VALUES (3, 'three')", "SELECT 1", "UPDATE TBL SET s = s || '!' WHERE n = 3"),
	"copy from": func(ctx context.Context, tx dbtx, tbl string) string {
		n, err := tx.CopyFrom(ctx, pgx.Identifier(strings.Split(strings.ReplaceAll(tbl, `"`, ""), ".")), []string{"n", "s"},
			pgx.CopyFromRows([][]any{{10, "ten"}, {11, "eleven"}}))
		return fmt.Sprintf("copy %d %s", n, describeErr(err))
	},
	"prepare in a savepoint": func(ctx context.Context, tx dbtx, tbl string) string {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "begin " + describeErr(err)
		}
		name := "ins_" + strings.NewReplacer(`"`, "", ".", "_").Replace(tbl)
		sd, err := sp.Prepare(ctx, name, "INSERT INTO "+tbl+" (n, s) VALUES ($1, $2)")
		if err != nil {
			return "prepare " + describeErr(err)
		}
		tag, err := sp.Exec(ctx, name, 20, "twenty")
		return fmt.Sprintf("prepare params=%d exec %s %q release %s", len(sd.ParamOIDs), describeErr(err), tag.String(), describeErr(sp.Commit(ctx)))
	},
	"large objects in a savepoint": func(ctx context.Context, tx dbtx, tbl string) string {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "begin " + describeErr(err)
		}
		defer func() { _ = sp.Commit(ctx) }()
		lo := sp.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return "lo create " + describeErr(err)
		}
		obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeRead|pgx.LargeObjectModeWrite)
		if err != nil {
			return "lo open " + describeErr(err)
		}
		n, err := obj.Write([]byte("large object"))
		if err != nil {
			return "lo write " + describeErr(err)
		}
		if _, err := obj.Seek(0, io.SeekStart); err != nil {
			return "lo seek " + describeErr(err)
		}
		buf := make([]byte, 64)
		m, err := obj.Read(buf)
		if err != nil && !errors.Is(err, io.EOF) {
			return "lo read " + describeErr(err)
		}
		return fmt.Sprintf("lo wrote %d read %q close %s unlink %s", n, buf[:m], describeErr(obj.Close()), describeErr(lo.Unlink(ctx, oid)))
	},
	"nested savepoints": func(ctx context.Context, tx dbtx, tbl string) string {
		var out []string
		sp1, err := tx.Begin(ctx)
		out = append(out, "begin1 "+describeErr(err))
		if err != nil {
			return strings.Join(out, "; ")
		}
		_, err = sp1.Exec(ctx, "INSERT INTO "+tbl+" (n, s) VALUES (40, 'kept')")
		out = append(out, "insert1 "+describeErr(err))
		sp2, err := sp1.Begin(ctx)
		out = append(out, "begin2 "+describeErr(err))
		if err == nil {
			_, err = sp2.Exec(ctx, "INSERT INTO "+tbl+" (n, s) VALUES (41, 'undone')")
			out = append(out, "insert2 "+describeErr(err))
			out = append(out, "rollback2 "+describeErr(sp2.Rollback(ctx)))
			_, err = sp2.Exec(ctx, "SELECT 1")
			out = append(out, "after rollback2 "+describeErr(err))
		}
		out = append(out, "commit1 "+describeErr(sp1.Commit(ctx)), "commit1 again "+describeErr(sp1.Commit(ctx)))
		return strings.Join(out, "; ")
	},
	"savepoint recovers a failure": func(ctx context.Context, tx dbtx, tbl string) string {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "begin " + describeErr(err)
		}
		_, failErr := sp.Exec(ctx, "SELECT 1/0")
		_, abortedErr := sp.Exec(ctx, "SELECT 1")
		rbErr := sp.Rollback(ctx)
		_, afterErr := tx.Exec(ctx, "INSERT INTO "+tbl+" (n, s) VALUES (50, 'after recovery')")
		return fmt.Sprintf("fail %s aborted %s rollback %s after %s", describeErr(failErr), describeErr(abortedErr), describeErr(rbErr), describeErr(afterErr))
	},
	"named args":      execStep("INSERT INTO TBL (n, s) VALUES (@n, @s)", pgx.NamedArgs{"n": 60, "s": "sixty"}),
	"exec mode":       execStep("INSERT INTO TBL (n, s) VALUES ($1, $2)", pgx.QueryExecModeSimpleProtocol, 61, "sixty-one"),
	"multi statement": execStep("INSERT INTO TBL (n, s) VALUES (70, 'a'); INSERT INTO TBL (n, s) VALUES (71, 'b')"),
}

// failures are first statements that fail in each of the ways a statement
// can: at parse, at describe (a missing table), at bind (an argument the
// server cannot read), at execution, and before anything is sent (an
// argument pgx cannot encode, which aborts nothing, in either
// transaction).
var failures = map[string]behaviourStep{
	"parse error":          execStep("SELEC 1"),
	"missing table":        execStep("INSERT INTO idem_no_such_table VALUES (1)"),
	"missing table query":  queryStep("SELECT * FROM idem_no_such_table"),
	"bind error":           execStep("SELECT $1::int", "not a number"),
	"bind error query row": queryRowStep("SELECT $1::int", "not a number"),
	"execution error":      execStep("SELECT 1/0"),
	"execution error rows": queryStep("SELECT 1/(g - 3) FROM generate_series(1, 5) g"),
	"execution error batch": batchStep("INSERT INTO TBL (n, s) VALUES (80, 'in batch')", "SELECT 1/0",
		"INSERT INTO TBL (n, s) VALUES (81, 'after')"),
	"client encode error": execStep("SELECT $1::int", make(chan int)),
}

type behaviourScenario struct {
	name  string
	steps []string // keys of behaviourSteps or failures
}

func behaviourScenarios() []behaviourScenario {
	var out []behaviourScenario
	for name := range behaviourSteps {
		out = append(out, behaviourScenario{name: name, steps: []string{name, "query all"}})
	}
	out = append(out, behaviourScenario{name: "everything", steps: []string{"insert", "insert simple", "query all",
		"query early close", "query row", "query no row", "batch", "copy from", "prepare in a savepoint",
		"large objects in a savepoint", "nested savepoints", "savepoint recovers a failure", "named args", "exec mode", "multi statement", "query all"}})
	for name := range failures {
		// The failure first, then a further statement, then the commit.
		out = append(out, behaviourScenario{name: "first: " + name, steps: []string{name, "insert", "query row"}})
		out = append(out, behaviourScenario{name: "after a write: " + name, steps: []string{"insert", name, "insert simple"}})
	}
	return out
}

// runPlain runs the steps in a plain pgx transaction and commits.
func runPlain(ctx context.Context, t *testing.T, pool *pgxpool.Pool, tbl string, steps []string) (got []string, commit string) {
	t.Helper()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range steps {
		got = append(got, lookupStep(s)(ctx, tx, tbl))
	}
	switch err := tx.Commit(ctx); {
	case err == nil:
		return got, "committed"
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return got, "rolled back"
	default:
		return got, "commit error " + describeErr(err)
	}
}

// runOurs runs the steps through idempgx's handle and settles.
func runOurs(ctx context.Context, t *testing.T, e *env, tbl string, steps []string) (got []string, commit string) {
	t.Helper()
	_, txCtx, stx, tx := e.begin(t, ctx)
	for _, s := range steps {
		got = append(got, lookupStep(s)(txCtx, tx, tbl))
	}
	switch err := stx.Settle(ctx, okResponse("ok")); {
	case err == nil:
		return got, "committed"
	case errors.Is(err, idemstore.ErrTxAborted):
		return got, "rolled back"
	default:
		return got, "commit error " + describeErr(err) + ": " + err.Error()
	}
}

func lookupStep(name string) behaviourStep {
	if s, ok := behaviourSteps[name]; ok {
		return s
	}
	return failures[name]
}

func TestBehaviourSameAsPgxTx(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			cfg := idempgxtest.PoolConfig(t, 4)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool := idempgxtest.OpenPool(t, cfg)
			e := newEnv(t, pool)
			for _, sc := range behaviourScenarios() {
				plainTbl := e.Schema + ".plain_" + randHex(4)
				oursTbl := e.Schema + ".ours_" + randHex(4)
				for _, tbl := range []string{plainTbl, oursTbl} {
					if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl+" (n int NOT NULL, s text NOT NULL)"); err != nil {
						t.Fatal(err)
					}
				}
				plain, plainCommit := runPlain(ctx, t, pool, plainTbl, sc.steps)
				ours, oursCommit := runOurs(ctx, t, e, oursTbl, sc.steps)
				for i := range sc.steps {
					if plain[i] != ours[i] {
						t.Errorf("%s, step %d (%s):\n  pgx.Tx:  %s\n  idempgx: %s", sc.name, i, sc.steps[i], plain[i], ours[i])
					}
				}
				if plainCommit != oursCommit {
					t.Errorf("%s: pgx.Tx %s, idempgx %s", sc.name, plainCommit, oursCommit)
				}
				var plainRows, oursRows string
				for tbl, dst := range map[string]*string{plainTbl: &plainRows, oursTbl: &oursRows} {
					if err := pool.QueryRow(ctx, "SELECT coalesce(string_agg(n || ':' || s, ',' ORDER BY n, s), '') FROM "+tbl).Scan(dst); err != nil {
						t.Fatal(err)
					}
				}
				if plainRows != oursRows {
					t.Errorf("%s: committed rows differ:\n  pgx.Tx:  %s\n  idempgx: %s", sc.name, plainRows, oursRows)
				}
				if testing.Verbose() {
					t.Logf("%s: %s, rows %q, same in both", sc.name, plainCommit, plainRows)
				}
			}
		})
	}
}

// TestNoRouteToTheConnection: nothing the handle hands out leads to the
// connection. pgx.Tx and pgx.Rows must have a Conn method; a savepoint's,
// and that of the rows of Query, of a batch's Query and of a savepoint's
// Query, return nil, where pgx's return the connection.
func TestNoRouteToTheConnection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 2, nil))
	_, txCtx, stx, tx := e.begin(t, ctx)
	sp, err := tx.Begin(txCtx)
	if err != nil {
		t.Fatal(err)
	}
	if c := sp.Conn(); c != nil {
		t.Fatal("a savepoint's Conn returned the connection")
	}
	nested, err := sp.Begin(txCtx)
	if err != nil {
		t.Fatal(err)
	}
	if c := nested.Conn(); c != nil {
		t.Fatal("a nested savepoint's Conn returned the connection")
	}
	for _, q := range []struct {
		name  string
		query func() (pgx.Rows, error)
	}{
		{"Query", func() (pgx.Rows, error) { return tx.Query(txCtx, "SELECT 1") }},
		{"savepoint Query", func() (pgx.Rows, error) { return sp.Query(txCtx, "SELECT 1") }},
		{"a failed Query", func() (pgx.Rows, error) { return tx.Query(txCtx, "SELECT 1 FROM idem_no_such_table") }},
		{"a batch's Query", func() (pgx.Rows, error) {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			br := tx.SendBatch(txCtx, b)
			defer func() { _ = br.Close() }()
			r, err := br.Query()
			if err == nil {
				for r.Next() {
				}
			}
			return r, err
		}},
	} {
		name := q.name
		rows, err := q.query()
		if rows == nil {
			t.Fatalf("%s: no rows (%v)", name, err)
		}
		if c := rows.Conn(); c != nil {
			t.Fatalf("%s: the rows' Conn returned the connection", name)
		}
		rows.Close()
		if name == "a failed Query" {
			// Recover the transaction for the next query.
			if err := nested.Rollback(txCtx); err != nil {
				t.Fatal(err)
			}
			if nested, err = sp.Begin(txCtx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// What the rows do is pgx's: they scan as pgx's rows do.
	n, err := pgx.CollectOneRow(mustQuery(t, tx, txCtx, "SELECT 41 + 1"), pgx.RowTo[int])
	if err != nil || n != 42 {
		t.Fatalf("CollectOneRow through the handle = %d, %v", n, err)
	}
	if err := stx.Settle(ctx, okResponse("x")); err != nil {
		t.Fatal(err)
	}
}

func mustQuery(t *testing.T, tx *idempgx.Handle, ctx context.Context, sql string) pgx.Rows {
	t.Helper()
	rows, err := tx.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// rewriteTo is a QueryRewriter that turns any statement into sql.
type rewriteTo string

func (r rewriteTo) RewriteQuery(_ context.Context, _ *pgx.Conn, _ string, args []any) (string, []any, error) {
	return string(r), args, nil
}
