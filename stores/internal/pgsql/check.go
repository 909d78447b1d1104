package pgsql

import (
	"fmt"
	"slices"
	"strings"
)

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

// CheckSQL reads, for the table named by $1 (quoted and qualified), its
// columns and their types, whether a unique index usable by ON CONFLICT
// (principal, key) exists, and which of the privileges the store needs the
// current user lacks. It returns no row when the table does not exist.
const CheckSQL = `SELECT
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

// Diagnose turns CheckSQL's answer (cols, unique and privileges, its
// three columns) into what is missing from the table ("column <name>",
// "unique index on (principal, key)", "privilege <name>") and which
// columns have a type the store cannot use ("<column>: <found>, want
// <wanted>"). Both are empty for a usable table. A store reports a table
// for which CheckSQL returned no row as missing "table".
func Diagnose(cols []string, unique bool, privileges []string) (missing, wrongType []string) {
	have := make(map[string]string, len(cols))
	for _, c := range cols {
		name, typ, _ := strings.Cut(c, ":")
		have[name] = typ
	}
	for _, want := range columnTypes {
		typ, ok := have[want.name]
		switch {
		case !ok:
			missing = append(missing, "column "+want.name)
		case !slices.Contains(want.types, typ):
			wrongType = append(wrongType, fmt.Sprintf("%s: %s, want %s", want.name, typ, strings.Join(want.types, " or ")))
		}
	}
	if !unique {
		missing = append(missing, "unique index on (principal, key)")
	}
	for _, p := range privileges {
		missing = append(missing, "privilege "+p)
	}
	return missing, wrongType
}
