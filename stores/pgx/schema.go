package idempgx

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the table a Store uses unless WithTable says otherwise.
// Like every name without a schema, New qualifies it with the schema the
// pool's search_path selects at that moment (current_schema(), public
// unless the DSN or the role says otherwise); from then on the store's
// statements name that schema, so a handler's SET search_path cannot move
// them.
const DefaultTable = "idempotency_keys"

// fileTable is the table name written in the embedded migration file.
const fileTable = "public.idempotency_keys"

// MigrationFile is the path, inside Migrations, of the schema for the
// default table name.
const MigrationFile = "migrations/001_idempotency_keys.sql"

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the schema as plain SQL files (MigrationFile) for the
// default table name, for users who run their own migration tool (goose,
// golang-migrate, atlas): copy the file into that tool's folder, or read it
// from here. Every statement is idempotent (IF NOT EXISTS).
var Migrations fs.FS = migrations

// maxTableLen leaves room for the index names derived from the table name
// ("<table>_lease_expires_at_idx", the longest) within PostgreSQL's 63-byte
// identifier limit, so that they are never truncated into each other.
const maxTableLen = 40

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// table is a validated, schema-qualified table name.
type table struct {
	schema, name string
}

// parseTable validates name as "table" or "schema.table", each part a plain
// SQL identifier (letters, digits, underscore; not starting with a digit).
// Names are quoted when used, so they are case-sensitive. A name without a
// schema has an empty schema, which New fills in.
func parseTable(name string) (table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return table{}, fmt.Errorf("idempgx: table name %q: at most one dot (schema.table)", name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > 63 {
			return table{}, fmt.Errorf("idempgx: table name %q: each part must match %s and be at most 63 bytes", name, identRE)
		}
	}
	t := table{name: parts[len(parts)-1]}
	if len(parts) == 2 {
		t.schema = parts[0]
	}
	if len(t.name) > maxTableLen {
		return table{}, fmt.Errorf("idempgx: table name %q: at most %d bytes (index names are derived from it)", name, maxTableLen)
	}
	return t, nil
}

// ident returns the quoted, schema-qualified table name.
func (t table) ident() string {
	return pgx.Identifier{t.schema, t.name}.Sanitize()
}

// Schema returns the SQL that creates the store's table and its indexes,
// schema-qualified, for users who run their own migration tool. It is the
// embedded migration with the name substituted and quoted, and it is
// idempotent (IF NOT EXISTS); Migrate runs the same text.
func (s *Store) Schema() string {
	ddl, err := s.table.schemaSQL()
	if err != nil {
		// The file is embedded in the binary: reading it cannot fail.
		panic(err)
	}
	return ddl
}

func (t table) schemaSQL() (string, error) {
	raw, err := migrations.ReadFile(MigrationFile)
	if err != nil {
		return "", fmt.Errorf("idempgx: read embedded schema: %w", err)
	}
	// Longer tokens first: index names contain the table name.
	const name = "idempotency_keys"
	r := strings.NewReplacer(
		name+"_lease_expires_at_idx", pgx.Identifier{t.name + "_lease_expires_at_idx"}.Sanitize(),
		name+"_expires_at_idx", pgx.Identifier{t.name + "_expires_at_idx"}.Sanitize(),
		fileTable, t.ident(),
	)
	return r.Replace(string(raw)), nil
}
