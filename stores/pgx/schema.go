package idempgx

import (
	"fmt"
	"io/fs"

	"github.com/idemgo/idem/stores/internal/pgsql"
)

// DefaultTable is the table a Store uses unless WithTable says otherwise.
// Like every name without a schema, New qualifies it with the schema the
// pool's search_path selects at that moment (current_schema(), public
// unless the DSN or the role says otherwise); from then on the store's
// statements name that schema, so a handler's SET search_path cannot move
// them.
const DefaultTable = pgsql.DefaultTable

// MigrationFile is the path, inside Migrations, of the schema for the
// default table name.
const MigrationFile = pgsql.MigrationFile

// Migrations holds the schema as plain SQL files (MigrationFile) for the
// default table name, for users who run their own migration tool (goose,
// golang-migrate, atlas): copy the file into that tool's folder, or read it
// from here. Every statement is idempotent (IF NOT EXISTS).
var Migrations fs.FS = pgsql.Migrations

// parseTable validates name as "table" or "schema.table" (pgsql.ParseTable).
func parseTable(name string) (pgsql.Table, error) {
	t, err := pgsql.ParseTable(name)
	if err != nil {
		return pgsql.Table{}, fmt.Errorf("idempgx: %w", err)
	}
	return t, nil
}

// Schema returns the SQL that creates the store's table and its indexes,
// schema-qualified, for users who run their own migration tool. It is the
// embedded migration with the name substituted and quoted, and it is
// idempotent (IF NOT EXISTS); Migrate runs the same text.
func (s *Store) Schema() string { return s.table.SchemaSQL() }
