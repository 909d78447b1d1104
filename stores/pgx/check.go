package idempgx

import (
	"context"
	"fmt"
	"slices"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"
)

// SchemaError is the error Check (and Migrate, which ends with Check)
// returns when the store's table is not usable: it names the table and
// what is missing or of the wrong type. errors.Is(err, idem.ErrMisconfigured)
// holds for it.
type SchemaError struct {
	// Table is the quoted, schema-qualified table name.
	Table string
	// Missing lists what does not exist or cannot be used: "table",
	// "column <name>", "unique index on (principal, key)", "privilege
	// <name>".
	Missing []string
	// WrongType lists columns of a type the store cannot use, as
	// "<column>: <found>, want <wanted>".
	WrongType []string
}

// Error implements error.
func (e *SchemaError) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		parts = append(parts, "missing "+strings.Join(e.Missing, ", "))
	}
	if len(e.WrongType) > 0 {
		parts = append(parts, "wrong type: "+strings.Join(e.WrongType, "; "))
	}
	return fmt.Sprintf("idempgx: table %s is not usable: %s (run Migrate, or create it with Schema)", e.Table, strings.Join(parts, "; "))
}

// Unwrap makes errors.Is(err, idem.ErrMisconfigured) hold.
func (e *SchemaError) Unwrap() error { return idem.ErrMisconfigured }

// columnTypes are the columns the store reads and writes, with the types
// (pg_type names) it can use for each.
var columnTypes = []struct {
	name  string
	types []string
}{
	{"principal", textTypes}, {"key", textTypes}, {"fingerprint", []string{"bytea"}},
	{"state", textTypes}, {"lease_token", textTypes}, {"request_id", textTypes}, {"nonce", textTypes},
	{"created_at", []string{"timestamptz"}}, {"locked_at", []string{"timestamptz"}},
	{"lease_expires_at", []string{"timestamptz"}}, {"expires_at", []string{"timestamptz"}},
	{"uncertain", []string{"bool"}}, {"status", []string{"int4", "int8"}},
	{"headers", []string{"bytea"}}, {"body", []string{"bytea"}},
}

var textTypes = []string{"text", "varchar"}

// checkSQL reads, for the table named by $1 (quoted and qualified), its
// columns and their types, whether a unique index usable by ON CONFLICT
// (principal, key) exists, and which of the privileges the store needs the
// current user lacks. It returns no row when the table does not exist.
const checkSQL = `SELECT
	(SELECT pg_catalog.array_agg(a.attname::text || ':' || t.typname::text ORDER BY a.attnum)
		FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
	EXISTS (SELECT 1 FROM pg_catalog.pg_index i
		WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
			AND i.indnkeyatts = 2 AND i.indexprs IS NULL
			AND (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attname)
				FROM pg_catalog.pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum = ANY (i.indkey::int2[]))
				= ARRAY['key', 'principal']),
	ARRAY(SELECT p FROM pg_catalog.unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p
		WHERE NOT pg_catalog.has_table_privilege(c.oid, p))
FROM pg_catalog.pg_class c
WHERE c.oid = pg_catalog.to_regclass($1) AND c.relkind IN ('r', 'p')`

// Check verifies that the store's table exists with every column the store
// uses, of a usable type, with the unique index its claim relies on, and
// that the current user may read and write it. It returns a *SchemaError
// naming what is missing, an error wrapping idem.ErrMisconfigured when the
// database refuses to say (a schema the user may not use), or a transient
// error when the database is unreachable. Call it at start-up, so that a
// misconfigured deployment fails before it takes traffic; Migrate calls it
// after creating the table.
func (s *Store) Check(ctx context.Context) error {
	var (
		cols       []string
		unique     bool
		privileges []string
		found      bool
	)
	err := s.onConn(ctx, func() error {
		found = false
		return s.query(ctx, func(rows pgx.Rows) error {
			found = true
			return rows.Scan(&cols, &unique, &privileges)
		}, checkSQL, s.table.ident())
	})
	if err != nil {
		return wrap("check", err)
	}
	se := &SchemaError{Table: s.table.ident()}
	if !found {
		se.Missing = []string{"table"}
		return se
	}
	have := make(map[string]string, len(cols))
	for _, c := range cols {
		name, typ, _ := strings.Cut(c, ":")
		have[name] = typ
	}
	for _, want := range columnTypes {
		typ, ok := have[want.name]
		switch {
		case !ok:
			se.Missing = append(se.Missing, "column "+want.name)
		case !slices.Contains(want.types, typ):
			se.WrongType = append(se.WrongType, fmt.Sprintf("%s: %s, want %s", want.name, typ, strings.Join(want.types, " or ")))
		}
	}
	if !unique {
		se.Missing = append(se.Missing, "unique index on (principal, key)")
	}
	for _, p := range privileges {
		se.Missing = append(se.Missing, "privilege "+p)
	}
	if len(se.Missing) > 0 || len(se.WrongType) > 0 {
		return se
	}
	return nil
}
