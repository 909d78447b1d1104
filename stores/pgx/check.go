package idempgx

import (
	"context"
	"fmt"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/stores/internal/pgsql"
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
		}, pgsql.CheckSQL, s.table.Ident())
	})
	if err != nil {
		return wrap("check", err)
	}
	se := &SchemaError{Table: s.table.Ident()}
	if !found {
		se.Missing = []string{"table"}
		return se
	}
	se.Missing, se.WrongType = pgsql.Diagnose(cols, unique, privileges)
	if len(se.Missing) > 0 || len(se.WrongType) > 0 {
		return se
	}
	return nil
}
