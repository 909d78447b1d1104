package pgsql

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
)

// DefaultTable is the table a store uses unless configured otherwise.
const DefaultTable = "idempotency_keys"

// MigrationFile is the path, inside Migrations, of the schema for the
// default table name.
const MigrationFile = "migrations/001_idempotency_keys.sql"

// fileTable is the table name written in the migration file.
const fileTable = "public.idempotency_keys"

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the schema as plain SQL files (MigrationFile) for the
// default table name, public.idempotency_keys. Every statement is
// idempotent (IF NOT EXISTS).
var Migrations fs.FS = migrations

// MaxTableLen bounds the table part of a name: it leaves room for the
// index names derived from it ("<table>_lease_expires_at_idx", the
// longest) within PostgreSQL's 63-byte identifier limit, so that they are
// never truncated into each other.
const MaxTableLen = 40

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Table is a validated table name, "table" or "schema.table". Its parts
// are quoted when used, so they are case-sensitive.
type Table struct {
	// Schema is "" for a name given without one; a store fills it in
	// (CurrentSchemaSQL) before it builds its statements.
	Schema, Name string
}

// ParseTable validates name as "table" or "schema.table", each part a
// plain SQL identifier (letters, digits, underscore; not starting with a
// digit) of at most 63 bytes, the table part at most MaxTableLen. Its
// errors name the problem without a package prefix: the store adds its
// own.
func ParseTable(name string) (Table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table name %q: at most one dot (schema.table)", name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > 63 {
			return Table{}, fmt.Errorf("table name %q: each part must match %s and be at most 63 bytes", name, identRE)
		}
	}
	t := Table{Name: parts[len(parts)-1]}
	if len(parts) == 2 {
		t.Schema = parts[0]
	}
	if len(t.Name) > MaxTableLen {
		return Table{}, fmt.Errorf("table name %q: at most %d bytes (index names are derived from it)", name, MaxTableLen)
	}
	return t, nil
}

// quoteIdent quotes an identifier; identRE vouches for its characters,
// and doubling quotes keeps it right for any other.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Ident returns the quoted table name, schema-qualified when it has a
// schema, ready to put into SQL.
func (t Table) Ident() string {
	if t.Schema == "" {
		return quoteIdent(t.Name)
	}
	return quoteIdent(t.Schema) + "." + quoteIdent(t.Name)
}

// CurrentSchemaSQL returns the schema the session's search_path selects
// (NULL when it names none): what a store qualifies a table named without
// a schema with, once, so that a handler's SET search_path cannot move
// its statements.
const CurrentSchemaSQL = "SELECT pg_catalog.current_schema()"

// MigrateLockSQL runs first in Migrate's transaction: it resolves the DDL's
// functions and operators from pg_catalog whatever the session's
// search_path says, and serialises concurrent migrations with a
// transaction-scoped advisory lock on $1 (MigrateLockKey).
const MigrateLockSQL = "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true), " +
	"pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1, 0))"

// MigrateLockKey is MigrateLockSQL's argument for t: the same for every
// store of the table, whichever package runs the migration.
func (t Table) MigrateLockKey() string { return "idempgx:" + t.Ident() }

// SchemaSQL returns the SQL that creates t and its indexes: the embedded
// migration with the names substituted and quoted. It is idempotent (IF
// NOT EXISTS).
func (t Table) SchemaSQL() string {
	raw, err := migrations.ReadFile(MigrationFile)
	if err != nil {
		// The file is embedded in the binary: reading it cannot fail.
		panic(fmt.Sprintf("pgsql: read embedded schema: %v", err))
	}
	// Longer tokens first: index names contain the table name.
	r := strings.NewReplacer(
		DefaultTable+"_lease_expires_at_idx", quoteIdent(t.Name+"_lease_expires_at_idx"),
		DefaultTable+"_expires_at_idx", quoteIdent(t.Name+"_expires_at_idx"),
		fileTable, t.Ident(),
	)
	return r.Replace(string(raw))
}
