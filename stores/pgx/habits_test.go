package idempgx_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// habit is handler code written against idempgx.Tx.
type habit struct {
	name string
	body string // the handler's body; tx is the handle, ctx its context
	// want is what the only type error must say; "" when the code must
	// compile.
	want string
}

// habits are the pgx idioms that would end the store's transaction, which
// must not compile on the handle, and the code that must: sqlc's generated
// code, river's executor interface, scany's querier, pgx.BeginFunc and
// nested savepoints.
var habits = []habit{
	{"defer Rollback", "defer tx.Rollback(ctx)", "tx.Rollback undefined (type *idempgx.Handle has no field or method Rollback)"},
	{"defer Rollback in a closure", "defer func() { _ = tx.Rollback(ctx) }()", "has no field or method Rollback"},
	{"Commit", "return tx.Commit(ctx)", "tx.Commit undefined (type *idempgx.Handle has no field or method Commit)"},
	{"Conn", `_, err := tx.Conn().Exec(ctx, "COMMIT"); return err`, "tx.Conn undefined (type *idempgx.Handle has no field or method Conn)"},
	{"Prepare", `_, err := tx.Prepare(ctx, "s", "SELECT 1"); return err`, "has no field or method Prepare"},
	{"LargeObjects", "_ = tx.LargeObjects()", "has no field or method LargeObjects"},
	{"as a pgx.Tx", "var _ pgx.Tx = tx", "*idempgx.Handle does not implement pgx.Tx (missing method Commit)"},
	{"sqlc, river, scany, BeginFunc", `
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
		})`, ""},
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
// querier and pgx.BeginFunc take the handle. Each habit is type-checked with go/types
// against the package as it is built now (go list -export), so the test
// fails as soon as the handle grows one of those methods.
func TestHandleHabitsDoNotCompile(t *testing.T) {
	exports := exportData(t, "github.com/idemgo/idem/stores/pgx", "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgconn")
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(file)
	})
	for _, h := range habits {
		t.Run(h.name, func(t *testing.T) {
			f, err := parser.ParseFile(fset, "habit.go", fmt.Sprintf(habitFile, h.body), parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("the habit does not parse: %v", err)
			}
			var errs []string
			conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err.Error()) }}
			_, _ = conf.Check("habit", fset, []*ast.File{f}, nil)
			switch {
			case h.want == "" && len(errs) > 0:
				t.Fatalf("does not compile:\n%s\n%s", h.body, strings.Join(errs, "\n"))
			case h.want != "" && len(errs) == 0:
				t.Fatalf("compiles, and must not:\n%s", h.body)
			case h.want != "" && (len(errs) != 1 || !strings.Contains(errs[0], h.want)):
				t.Fatalf("fails to compile with\n%s\nwant exactly one error, saying %q", strings.Join(errs, "\n"), h.want)
			}
			if len(errs) > 0 && testing.Verbose() {
				t.Log(errs[0])
			}
		})
	}
}

// exportData builds pkgs and their dependencies as the go command does
// (go list -export, from the build cache when nothing changed) and returns
// each package's export data file by import path.
func exportData(t *testing.T, pkgs ...string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}}={{.Export}}{{end}}"}, pkgs...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, file, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			exports[path] = file
		}
	}
	for _, p := range pkgs {
		if exports[p] == "" {
			t.Fatalf("go list -export gave no export data for %s", p)
		}
	}
	return exports
}
