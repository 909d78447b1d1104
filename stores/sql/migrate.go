package idemsql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Schema returns the SQL that creates the store's table and its indexes
// for its dialect and table name, the table qualified as the store names
// it. On PostgreSQL it is the schema idempgx creates (pgsql.Migrations);
// on MySQL and SQLite the embedded migrations/<dialect>.sql, with the
// table, its indexes and its constraints renamed when WithTable chose
// another name. It is idempotent (CREATE … IF NOT EXISTS); feed it to
// goose, golang-migrate, atlas or your own tool, or call Migrate.
func (s *Store) Schema() string {
	if s.dialect == dialectPostgres {
		return s.qtable.pg().SchemaSQL()
	}
	b, err := migrations.ReadFile("migrations/" + s.dialect.String() + ".sql")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	t := s.qtable
	if s.dialect == dialectSQLite {
		t = s.table // SQLite refuses a qualified table in CREATE INDEX … ON
	}
	return renderMigration(string(b), s.dialect, t)
}

// defaultNameRE matches the default table name and the names derived from
// it (indexes, constraints) in the migration files.
var defaultNameRE = regexp.MustCompile(`\b` + DefaultTable + `(_[a-z0-9_]+)?\b`)

func renderMigration(sqlText string, d dialect, t tableName) string {
	return defaultNameRE.ReplaceAllStringFunc(sqlText, func(m string) string {
		suffix := strings.TrimPrefix(m, DefaultTable)
		if suffix == "" {
			return d.qualified(t)
		}
		// Index and constraint names are not schema-qualified: they live
		// in the table's schema.
		return d.quote(t.name + suffix)
	})
}

// Migrate creates the store's table and indexes if they do not exist
// (Schema), then checks the table (Check). It is idempotent. On
// PostgreSQL it runs in one transaction under the advisory lock idempgx's
// Migrate takes for the same table, so instances starting together, with
// either store, do not trip over each other. A table made
// by an earlier version of the store, which lacks a column an index needs,
// is reported as Check reports it: a *SchemaError naming the column.
func (s *Store) Migrate(ctx context.Context) error {
	pool, err := s.pool()
	if err != nil {
		return s.wrap("migrate", err)
	}
	if err := s.migrate(ctx, pool); err != nil {
		if cerr := s.Check(ctx); isMisconfigured(err) && cerr != nil {
			return cerr
		}
		return err
	}
	return s.Check(ctx)
}

// migrate runs the statements of Schema; on PostgreSQL in one transaction
// under an advisory lock, which it has ended when it returns.
func (s *Store) migrate(ctx context.Context, pool *sql.DB) error {
	stmts := splitStatements(s.Schema())
	if s.dialect != dialectPostgres {
		for _, st := range stmts {
			if _, err := pool.ExecContext(ctx, st); err != nil {
				return s.wrap("migrate "+s.Table(), err)
			}
		}
		return nil
	}
	tx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap("migrate", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, pgsql.MigrateLockSQL, s.qtable.pg().MigrateLockKey()); err != nil {
		return s.wrap("migrate: advisory lock", err)
	}
	for _, st := range stmts {
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return s.wrap("migrate "+s.Table(), err)
		}
	}
	return s.wrap("migrate", tx.Commit())
}

// SchemaError is the error Check returns (wrapped) when the store's table
// is missing, lacks a column, has a column of the wrong kind, or refuses
// the store's statements. errors.Is(err, idem.ErrMisconfigured) holds for
// it.
type SchemaError struct {
	// Table is the qualified table name.
	Table string
	// Column is the column at fault, "" when the problem is the table.
	Column string
	// Problem says what is wrong.
	Problem string
}

// Error implements error.
func (e *SchemaError) Error() string {
	if e.Column == "" {
		return fmt.Sprintf("table %s: %s", e.Table, e.Problem)
	}
	return fmt.Sprintf("table %s, column %s: %s", e.Table, e.Column, e.Problem)
}

// Unwrap makes errors.Is(err, idem.ErrMisconfigured) hold.
func (e *SchemaError) Unwrap() error { return idem.ErrMisconfigured }

// storeColumns are the columns the store reads and writes; binary ones
// must hold any bytes (headers became binary with idemstore.EncodeHeader).
var storeColumns = []struct {
	name   string
	binary bool
}{
	{"principal", false}, {"key", false}, {"fingerprint", true}, {"state", false}, {"lease_token", false},
	{"request_id", false}, {"nonce", false}, {"status", false}, {"headers", true}, {"body", true},
	{"created_at", false}, {"locked_at", false}, {"lease_expires_at", false}, {"expires_at", false}, {"uncertain", false},
}

// Check verifies that the store's table exists with every column the store
// uses (the binary ones binary), and that the store's statements may read
// and write it, without changing anything. It returns an error wrapping a
// *SchemaError, and idem.ErrMisconfigured, that names the missing piece.
// Migrate calls it; call it at start-up when your own tool migrates.
func (s *Store) Check(ctx context.Context) error {
	pool, err := s.pool()
	if err != nil {
		return s.wrap("check", err)
	}
	fail := func(column, problem string) error {
		return idemstore.WrapStoreError("idemsql", "check", idemstore.ClassOther, &SchemaError{Table: s.Table(), Column: column, Problem: problem})
	}
	if s.dialect == dialectPostgres {
		return s.checkPostgres(ctx, pool, fail)
	}
	var rows *sql.Rows
	switch s.dialect {
	case dialectMySQL:
		rows, err = pool.QueryContext(ctx, "SELECT column_name, data_type FROM information_schema.columns"+
			" WHERE table_schema = ? AND table_name = ? LIMIT 1000", s.qtable.schema, s.qtable.name)
	default:
		rows, err = pool.QueryContext(ctx, "SELECT name, type FROM pragma_table_info(?, 'main')", s.qtable.name)
	}
	if err != nil {
		return s.wrap("check", err)
	}
	types := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			_ = rows.Close()
			return s.wrap("check", err)
		}
		types[strings.ToLower(name)] = strings.ToLower(typ)
	}
	if err := rows.Err(); err != nil {
		return s.wrap("check", err)
	}
	_ = rows.Close()
	if len(types) == 0 {
		return fail("", "does not exist, or this database user cannot see it: run Migrate or feed Schema() to your migration tool")
	}
	for _, c := range storeColumns {
		typ, ok := types[c.name]
		if !ok {
			return fail(c.name, "is missing: the table predates this version of the store, or was made by hand")
		}
		if c.binary && !strings.Contains(typ, "bytea") && !strings.Contains(typ, "blob") && !strings.Contains(typ, "binary") {
			return fail(c.name, fmt.Sprintf("is %s, want a binary type (bytea, LONGBLOB, BLOB): headers are stored byte-exact since idemstore.EncodeHeader", typ))
		}
	}
	// The statements the store runs, matching nothing: the database checks
	// the names and the privileges without changing a row.
	T := s.dialect.qualified(s.qtable)
	K := s.dialect.quote("key")
	probes := []string{"SELECT " + s.q.cols + " FROM " + T + " WHERE 1 = 0 LIMIT 1"}
	if s.dialect == dialectMySQL {
		probes = append(probes,
			"UPDATE "+T+" SET state = state, headers = headers, body = body, status = status,"+
				" lease_expires_at = lease_expires_at, uncertain = uncertain WHERE 1 = 0",
			"DELETE FROM "+T+" WHERE 1 = 0",
			"INSERT INTO "+T+" (principal, "+K+", fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at)"+
				" SELECT principal, "+K+", fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at FROM "+T+" WHERE 1 = 0")
	}
	for _, p := range probes {
		if _, err := pool.ExecContext(ctx, p); err != nil {
			if isMisconfigured(err) {
				return fail("", fmt.Sprintf("the store's statements are refused: %v", err))
			}
			return s.wrap("check", err)
		}
	}
	return nil
}

// checkPostgres is Check on PostgreSQL: idempgx's check (pgsql.CheckSQL,
// pgsql.Diagnose), which also finds a missing unique index on (principal,
// key) and a privilege the user lacks. The first problem is reported, a
// column's before the table's.
func (s *Store) checkPostgres(ctx context.Context, pool *sql.DB, fail func(column, problem string) error) error {
	var (
		cols, privileges []string
		unique           bool
	)
	err := pool.QueryRowContext(ctx, pgsql.CheckSQL, s.qtable.pg().Ident()).Scan(pgTextArray(&cols), &unique, pgTextArray(&privileges))
	if errors.Is(err, sql.ErrNoRows) {
		return fail("", "does not exist, or this database user cannot see it: run Migrate or feed Schema() to your migration tool")
	}
	if err != nil {
		return s.wrap("check", err)
	}
	missing, wrongType := pgsql.Diagnose(cols, unique, privileges)
	for _, m := range missing {
		if col, ok := strings.CutPrefix(m, "column "); ok {
			return fail(col, "is missing: the table predates this version of the store, or was made by hand")
		}
	}
	if len(wrongType) > 0 {
		col, problem, _ := strings.Cut(wrongType[0], ": ")
		return fail(col, "is "+problem)
	}
	if len(missing) > 0 {
		return fail("", "lacks the "+missing[0])
	}
	return nil
}

// textArray scans a PostgreSQL text[] that a driver returns in its text
// form (pgx's stdlib and lib/pq both do) into a []string.
type textArray struct{ dst *[]string }

func pgTextArray(dst *[]string) textArray { return textArray{dst} }

func (a textArray) Scan(src any) error {
	var s string
	switch x := src.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	case nil:
		*a.dst = nil
		return nil
	default:
		return fmt.Errorf("idemsql: cannot scan %T into a text array", src)
	}
	v, err := pgsql.ParseTextArray(s)
	if err != nil {
		return err
	}
	*a.dst = v
	return nil
}

// splitStatements splits a migration file into statements: comment lines
// are dropped and a statement ends with a semicolon at the end of a line.
func splitStatements(sqlText string) []string {
	var (
		out []string
		cur strings.Builder
	)
	for line := range strings.SplitSeq(sqlText, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
