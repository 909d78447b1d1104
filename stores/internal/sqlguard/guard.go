// Package sqlguard decides, before a statement reaches the database,
// whether SQL text a handler sends through the store's sealed handle may
// run inside the store's transaction. It refuses transaction control
// (COMMIT, ROLLBACK, BEGIN, PREPARE TRANSACTION … and, on MySQL and
// MariaDB, every statement that commits implicitly), finds the savepoint
// statements a handle must track, and marks statements that leave session
// state behind on a pooled connection, for PostgreSQL, MySQL/MariaDB and
// SQLite.
//
// It is a lexer, not a parser. It splits the text into statements on
// every ';' the server's own lexer would see outside a string, a quoted
// identifier, a dollar quote or a comment, and classifies each statement
// by its words. It errs on one side only: a ';' the grammar would not
// treat as a separator (inside parentheses, or inside a PostgreSQL
// BEGIN ATOMIC function body) can only add statement starts, so a false
// alarm is possible and a missed statement is not. A CREATE FUNCTION …
// BEGIN ATOMIC body with more than one statement is refused (its "END"
// looks like a statement); the AS $$ … $$ form is not.
//
// Where a session setting changes how the server reads quotes
// (PostgreSQL's standard_conforming_strings, MySQL's NO_BACKSLASH_ESCAPES
// and ANSI_QUOTES), the text is read every way the dialect allows
// (Dialect.Readings). TxControl and Inspect refuse what any reading
// refuses; a store that can ask its session which reading holds uses Read
// and Agreed, as Inspect's documentation shows.
//
// How a store uses it: before it sends any text a handler gave its handle
// (Exec, Query, Prepare, each text of a batch, and a batch's texts joined
// as the driver would join them into one simple-protocol query), it asks
// the guard. A store that tracks nothing else refuses on TxControl, as the
// pgx store does. A store that tracks savepoints, to let a failed
// statement be rolled back to one, follows Inspect's Verdict.Ops after the
// statement succeeded, and closes a connection instead of pooling it once
// a Verdict was Dirty.
//
// TxControl and ReadAll remember their verdict per statement text, in a
// bounded cache that no text can make answer for another (see cache.go):
// a handler's statements are lexed once, not on every call.
//
// The package imports no driver. Package guardtest holds its case table
// and the random texts a store's differential test sends to a real server
// (the pgx store's TestSQLGuardAgreesWithServer is one): whenever the
// server ended the transaction on a text, the guard must have refused it.
package sqlguard

import (
	"fmt"
	"strings"
)

// Dialect is the SQL flavour a query is read in.
type Dialect uint8

// The dialects the guard reads.
const (
	PostgreSQL Dialect = iota + 1
	MySQL              // MySQL and MariaDB
	SQLite
)

// String returns "postgres", "mysql" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", uint8(d))
}

// Reading is one way a session can read quotes.
type Reading struct {
	// Backslash: a backslash escapes the next character in '…' strings
	// (MySQL's default; PostgreSQL with standard_conforming_strings off).
	Backslash bool
	// ANSIQuotes: on MySQL, "…" is an identifier instead of a string.
	ANSIQuotes bool
}

var (
	readingsPG    = []Reading{{}, {Backslash: true}}
	readingsMySQL = []Reading{{Backslash: true}, {}, {Backslash: true, ANSIQuotes: true}, {ANSIQuotes: true}}
	readingsLite  = []Reading{{}}
)

// Readings returns every reading a session of d can use, the server's
// default first. The slice is shared: do not modify it.
func (d Dialect) Readings() []Reading {
	switch d {
	case PostgreSQL:
		return readingsPG
	case MySQL:
		return readingsMySQL
	}
	return readingsLite
}

// OpKind is the kind of a savepoint statement.
type OpKind uint8

// The savepoint statements.
const (
	Savepoint  OpKind = iota + 1 // SAVEPOINT name
	RollbackTo                   // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name
	Release                      // RELEASE [SAVEPOINT] name
)

// SavepointOp is one savepoint statement: its kind and the savepoint's
// name as the server compares it (unquoted names folded to lower case;
// on PostgreSQL a quoted name as written).
type SavepointOp struct {
	Kind OpKind
	Name string
}

// Verdict is the guard's answer for a whole query.
type Verdict struct {
	// Refused says why the query must not run; "" when it may.
	Refused string
	// Ops are the query's savepoint statements, in order; nil when it has
	// none.
	Ops []SavepointOp
	// Single: the query is at most one statement.
	Single bool
	// Dirty: the query may change session state that outlives the
	// transaction (SET, USE, PRAGMA, a temporary table, a prepared
	// statement, set_config(…, false)): a store should close the
	// connection afterwards instead of pooling it.
	Dirty bool
}

// TxControl reports whether q holds a statement that begins, ends or
// prepares a transaction (on MySQL, also one that commits implicitly)
// under any reading of d, and returns that statement's first words, in
// lower case, for an error message. Savepoint statements are not
// transaction control. It is the check for a store that tracks nothing
// else, and the one to run on every text the server may see as one
// query: a batch sent as one simple-protocol string must be checked
// joined, not only piece by piece.
func TxControl(d Dialect, q string) (string, bool) {
	if !d.known() {
		return txControl(d, q)
	}
	c := &txControlCache[d]
	if v, ok := c.get(q); ok {
		return v.words, v.refused
	}
	words, refused := txControl(d, q)
	c.put(q, txControlVerdict{words, refused})
	return words, refused
}

// txControl is TxControl without the cache.
func txControl(d Dialect, q string) (string, bool) {
	// Only MySQL's SET and SET STATEMENT need more than a statement's
	// first five words to classify it.
	limit := 8
	if d == MySQL {
		limit = 0
	}
	var buf [8]token
	for _, r := range d.Readings() {
		sc := newScanner(d, r, q, buf[:], limit)
		for sc.next() {
			if k, _ := classify(d, sc.st); k == refused {
				return firstWords(sc.st), true
			}
		}
	}
	return "", false
}

// Inspect reads q every way d allows and decides whether it may run: it
// is refused when any reading refuses it, and also when the readings
// disagree on its statements or savepoints (a store that tracks
// savepoints could not tell which to follow). A store that can ask its
// session how it reads quotes may settle a disagreement instead:
//
//	vs := sqlguard.ReadAll(d, q)
//	v, ok := sqlguard.Agreed(vs)
//	if !ok && !sqlguard.MentionsQuoting(q) {
//		v = vs[index of the session's reading in d.Readings()]
//	} else if !ok {
//		v = sqlguard.Inspect(d, q)
//	}
func Inspect(d Dialect, q string) Verdict {
	vs := ReadAll(d, q)
	if v, ok := Agreed(vs); ok {
		return v
	}
	for _, v := range vs {
		if v.Refused != "" {
			return v
		}
	}
	return Verdict{Refused: "the statement reads differently under different session settings (quoting), and one reading touches savepoints or splits it differently"}
}

// ReadAll returns the verdict of each of d's readings of q, in the order
// of d.Readings().
func ReadAll(d Dialect, q string) []Verdict {
	if !d.known() {
		return readAll(d, q)
	}
	c := &readAllCache[d]
	if vs, ok := c.get(q); ok {
		return cloneVerdicts(vs)
	}
	vs := readAll(d, q)
	c.put(q, cloneVerdicts(vs))
	return vs
}

// readAll is ReadAll without the cache.
func readAll(d Dialect, q string) []Verdict {
	rs := d.Readings()
	out := make([]Verdict, len(rs))
	for i, r := range rs {
		out[i] = Read(d, r, q)
	}
	return out
}

// Read decides q under one reading r of d.
func Read(d Dialect, r Reading, q string) Verdict {
	var (
		v   Verdict
		n   int
		buf [32]token
	)
	sc := newScanner(d, r, q, buf[:], 0)
	for sc.next() {
		n++
		if dirties(d, sc.st) {
			v.Dirty = true
		}
		kind, name := classify(d, sc.st)
		switch kind {
		case refused:
			return Verdict{Refused: refusal(d, sc.st), Dirty: v.Dirty}
		case Savepoint, RollbackTo, Release:
			v.Ops = append(v.Ops, SavepointOp{Kind: kind, Name: name})
		}
	}
	v.Single = n <= 1
	return v
}

// Agreed returns the common verdict of the readings vs, and whether they
// agree: all refuse, or none does and they see the same statements and
// savepoints. The common verdict is Dirty when any reading is.
func Agreed(vs []Verdict) (Verdict, bool) {
	if len(vs) == 0 {
		return Verdict{Single: true}, true
	}
	v := vs[0]
	for _, w := range vs[1:] {
		if (v.Refused == "") != (w.Refused == "") {
			return Verdict{}, false
		}
		if v.Refused == "" && (!sameOps(v.Ops, w.Ops) || v.Single != w.Single) {
			return Verdict{}, false
		}
		v.Dirty = v.Dirty || w.Dirty
	}
	return v, true
}

// MentionsQuoting reports whether q may change how the session reads
// quotes (sql_mode, standard_conforming_strings) on its way, so that the
// session's reading before q says nothing about the rest of q.
func MentionsQuoting(q string) bool {
	u := strings.ToUpper(q)
	return strings.Contains(u, "SQL_MODE") || strings.Contains(u, "STANDARD_CONFORMING_STRINGS")
}

func sameOps(a, b []SavepointOp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// firstWords returns up to three leading words of st in lower case,
// stopping at the first token that is not a bare word.
func firstWords(st []token) string {
	var b strings.Builder
	for i, t := range st {
		if i == 3 || t.kind != tokWord {
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(lowerASCII(t.text))
	}
	return b.String()
}

// refusal is the Verdict.Refused text for a refused statement st.
func refusal(d Dialect, st []token) string {
	if d == MySQL && st[0].is("SET") {
		for _, t := range st {
			if t.is("AUTOCOMMIT") || t.is("COMPLETION_TYPE") {
				return "SET " + lowerASCII(t.text) + " ends or commits the transaction, or changes how the store's COMMIT ends it"
			}
		}
	}
	return upperASCII(st[0]) + " ends or commits the transaction"
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
