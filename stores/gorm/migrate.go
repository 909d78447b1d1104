package idemgorm

import (
	"context"
	"embed"
	"fmt"
	"regexp"
	"strings"

	"gorm.io/gorm"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migration returns the schema for dialect ("postgres", "mysql" or
// "sqlite") as SQL for the default table name, DefaultTable: the file
// migrations/<dialect>.sql, for feeding to goose, golang-migrate, atlas or
// any other migration tool.
func Migration(dialect string) (string, error) {
	d, err := dialectOf(dialect)
	if err != nil {
		return "", err
	}
	b, err := migrations.ReadFile("migrations/" + d.String() + ".sql")
	if err != nil {
		return "", fmt.Errorf("idemgorm: migration for %s: %w", d, err)
	}
	return string(b), nil
}

// Migration returns the schema SQL for this store's dialect and table
// name: the embedded file with the table, its indexes and its constraints
// renamed when WithTable chose another name.
func (s *Store) Migration() string {
	b, err := migrations.ReadFile("migrations/" + s.dialect.String() + ".sql")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	return renderMigration(string(b), s.dialect, s.table)
}

// defaultNameRE matches the default table name and the names derived from
// it (indexes, constraints) in the migration files.
var defaultNameRE = regexp.MustCompile(`\b` + DefaultTable + `(_[a-z0-9_]+)?\b`)

func renderMigration(sqlText string, d dialect, t tableName) string {
	if t.schema == "" && t.name == DefaultTable {
		return sqlText
	}
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

// Migrate creates the store's table and indexes if they do not exist, from
// the embedded migration for its dialect. It is idempotent. On PostgreSQL it
// runs in one transaction under an advisory lock, so instances starting
// together do not trip over each other.
func (s *Store) Migrate(ctx context.Context) error {
	stmts := splitStatements(s.Migration())
	run := func(db *gorm.DB) error {
		for _, st := range stmts {
			if err := db.Exec(st).Error; err != nil {
				return fmt.Errorf("idemgorm: migrate %s: %w", s.Table(), err)
			}
		}
		return nil
	}
	db := s.db.WithContext(ctx)
	if s.dialect != dialectPostgres {
		return run(db)
	}
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(hashtext(?))", "idemgorm:migrate:"+s.Table()).Error; err != nil {
			return fmt.Errorf("idemgorm: migrate: advisory lock: %w", err)
		}
		return run(tx)
	})
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
