package pgsql

import (
	"fmt"
	"strings"
)

// This file holds the one-statement forms of the statement set, for a
// driver that cannot pipeline (database/sql): each is one of New's
// statements with its prelude run inside it, as a CTE the statement reads
// from, so that it costs one round trip in its own implicit transaction.
// The prelude's set_config calls run before the statement's first row is
// produced, so the lock timeout, synchronous_commit and the text formats
// hold for its lock waits, its commit and its output; the statement
// timeout and search_path pinned with them apply from the next statement
// on, which is why the statements name the table with its schema, and the
// claim names its functions and operators with theirs too.

// OneClaim returns the claim, Claim and ClaimRead, as one statement that
// runs prelude (ClaimPrelude, or DurablePrelude for a durable claim) first
// and takes Claim's parameters. It returns one row: a boolean, true when
// it inserted the row, followed by ClaimRead's columns (RecordCols and
// now()). The row's values are read from the statement's snapshot, which
// does not hold the row the INSERT inserted: when it inserted, they are
// NULL, or the values of a row that was deleted after the snapshot was
// taken (the INSERT waited for that DELETE), and the caller, whose values
// the inserted row holds, takes only now(). When it did not insert they
// are the row the INSERT met, or NULL when that row committed after the
// snapshot was taken (the INSERT waited for it): run the claim again.
//
// The one statement costs the server more than the pipelined pair; the
// row by a LEFT JOIN from the one row of the flag, an EXISTS over the
// INSERT, costs it less than a UNION ALL of the INSERT's RETURNING and the
// read (bench/pgbench/callgrind.sh).
func (s Statements) OneClaim(prelude string) string {
	insert, values, ok := strings.Cut(s.Claim, "\nVALUES (")
	values, conflict, ok2 := strings.Cut(values, ")\nON CONFLICT ")
	read, ok3 := strings.CutPrefix(s.ClaimRead, "SELECT ")
	read, from, ok4 := strings.Cut(read, " FROM ")
	table, where, ok5 := strings.Cut(from, " WHERE ")
	if !ok || !ok2 || !ok3 || !ok4 || !ok5 {
		panic("pgsql: OneClaim: the claim's statements lost their shape")
	}
	return fmt.Sprintf(`WITH cfg AS (%s),
ins AS (%s
SELECT %s FROM cfg
ON CONFLICT %s
RETURNING 1)
SELECT one.inserted, %s
FROM (SELECT EXISTS (SELECT FROM ins) AS inserted) AS one LEFT JOIN %s ON %s`, prelude, insert, values, conflict, read, table, where)
}

// OneUpdate returns update, one of the UPDATE statements (Takeover,
// Replace, Reuse, Release, Keep), as one statement that runs prelude first
// and takes update's parameters and returns what it returns.
func OneUpdate(prelude, update string) string {
	set, where, ok := strings.Cut(update, "\nWHERE ")
	if !ok || !strings.HasPrefix(set, "UPDATE ") {
		panic("pgsql: OneUpdate: not one of the store's UPDATE statements")
	}
	return "WITH cfg AS (" + prelude + ")\n" + set + "\nFROM cfg\nWHERE " + where
}

// OneSelect returns query, one of the record-returning SELECT statements
// (Get, ListStale), as one statement that runs prelude first and takes
// query's parameters: the prelude's CTE is joined to the table, so every
// row the statement returns is produced, and its values put into text,
// after the prelude ran.
func OneSelect(prelude, query string) string {
	sel, from, ok := strings.Cut(query, " FROM ")
	if !ok || !strings.HasPrefix(sel, "SELECT ") {
		panic("pgsql: OneSelect: not one of the store's SELECT statements")
	}
	return "WITH cfg AS (" + prelude + ")\n" + sel + " FROM cfg, " + from
}

// OneSettle returns Settle as one statement that runs prelude first, as a
// CTE the fenced UPDATE reads from, and takes Settle's parameters. The
// UPDATE produces its row only after the prelude ran, so a setting the
// prelude makes (synchronous_commit, say) holds for the UPDATE and for
// the rest of the transaction, its COMMIT included; a statement timeout
// set there would apply from the next statement on only.
func (s Statements) OneSettle(prelude string) string {
	set, where, ok := strings.Cut(s.Settle, "\n\tWHERE ")
	rest, ok2 := strings.CutPrefix(set, "WITH u AS (\n\tUPDATE ")
	if !ok || !ok2 {
		panic("pgsql: OneSettle: the settle lost its shape")
	}
	return "WITH cfg AS (" + prelude + "),\nu AS (\n\tUPDATE " + rest + "\n\tFROM cfg\n\tWHERE " + where
}
