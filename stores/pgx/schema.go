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
// It is schema-qualified, like every table the store uses: the store's
// statements never depend on the session's search_path, which a handler
// can change.
const DefaultTable = DefaultSchema + ".idempotency_keys"

// DefaultSchema is the schema of a table named without one.
const DefaultSchema = "public"

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
// ("<table>_expires_at_idx") within PostgreSQL's 63-byte identifier limit,
// so that they are never truncated into each other.
const maxTableLen = 40

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// table is a validated, schema-qualified table name.
type table struct {
	schema, name string
}

// parseTable validates name as "table" or "schema.table", each part a plain
// SQL identifier (letters, digits, underscore; not starting with a digit).
// Names are quoted when used, so they are case-sensitive. A name without a
// schema is in DefaultSchema.
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
	t := table{schema: DefaultSchema, name: parts[len(parts)-1]}
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

// Schema returns the SQL that creates the table (and its indexes) under the
// given name, which may be schema-qualified ("billing.idempotency_keys";
// without a schema the table is in DefaultSchema).
// It is the embedded migration with the name substituted and quoted; it is
// idempotent. It returns an error when tableName is not a valid name (see
// WithTable).
func Schema(tableName string) (string, error) {
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	return t.schemaSQL()
}

func (t table) schemaSQL() (string, error) {
	raw, err := migrations.ReadFile(MigrationFile)
	if err != nil {
		return "", fmt.Errorf("idempgx: read embedded schema: %w", err)
	}
	// Longer tokens first: index names contain the table name.
	const name = "idempotency_keys"
	r := strings.NewReplacer(
		name+"_locked_at_idx", pgx.Identifier{t.name + "_locked_at_idx"}.Sanitize(),
		name+"_expires_at_idx", pgx.Identifier{t.name + "_expires_at_idx"}.Sanitize(),
		DefaultTable, t.ident(),
	)
	return r.Replace(string(raw)), nil
}
