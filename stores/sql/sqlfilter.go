package idemsql

import (
	"strings"
)

// The handle a handler gets refuses transaction-control statements before
// they reach the server. Deciding that needs the statement boundaries and
// the first words of each statement, which needs the dialect's quoting
// rules: a COMMIT inside a string, a quoted identifier or a comment is not
// one, and a COMMIT after a string that ends where the filter did not expect
// it is. Where a session setting changes how the server reads quotes
// (MySQL's NO_BACKSLASH_ESCAPES and ANSI_QUOTES, PostgreSQL's
// standard_conforming_strings), the query is read every way, and it is
// refused if any reading finds transaction control.

// lexMode is one reading of a query.
type lexMode struct {
	// backslash: a backslash escapes the next character in '…' strings
	// (MySQL's default; PostgreSQL with standard_conforming_strings off).
	backslash bool
	// ansiQuotes: on MySQL, "…" is an identifier instead of a string.
	ansiQuotes bool
}

// readings returns every reading of a query the server could use on d.
func (d dialect) readings() []lexMode {
	switch d {
	case dialectMySQL:
		return []lexMode{{backslash: true}, {}, {backslash: true, ansiQuotes: true}, {ansiQuotes: true}}
	case dialectPostgres:
		return []lexMode{{}, {backslash: true}}
	}
	return []lexMode{{}}
}

type tokKind uint8

const (
	tokWord   tokKind = iota + 1 // a bare word, upper-cased
	tokQuoted                    // a quoted identifier, as written between its quotes
	tokString                    // a string or dollar-quoted literal (content dropped)
	tokOther                     // a number, an operator or punctuation
)

type token struct {
	kind tokKind
	text string
}

// lex splits q into statements of tokens under one reading. Comments and
// white space are dropped, and empty statements too. Unterminated strings,
// identifiers and comments run to the end of q.
func lex(d dialect, m lexMode, q string) [][]token {
	var (
		out  [][]token
		cur  []token
		exec int // MySQL: depth of /*! … */ executable comments
	)
	end := func() {
		if len(cur) > 0 {
			out = append(out, cur)
			cur = nil
		}
	}
	n := len(q)
	for i := 0; i < n; {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == ';':
			end()
			i++
		case c == '-' && i+1 < n && q[i+1] == '-' &&
			(d != dialectMySQL || i+2 >= n || q[i+2] <= ' '):
			// MySQL needs a space or control character after "--".
			i = lineEnd(q, i)
		case c == '#' && d == dialectMySQL:
			i = lineEnd(q, i)
		case c == '/' && i+1 < n && q[i+1] == '*':
			if d == dialectMySQL {
				if j, ok := mysqlExecComment(q, i); ok {
					// Executed by the server: its content is code.
					exec++
					i = j
					continue
				}
			}
			i = blockCommentEnd(d, q, i)
		case c == '*' && exec > 0 && i+1 < n && q[i+1] == '/':
			exec--
			i += 2
		case c == '\'':
			cur = append(cur, token{kind: tokString})
			i = stringEnd(q, i, '\'', m.backslash && d != dialectSQLite)
		case c == '"':
			if d == dialectMySQL && !m.ansiQuotes {
				cur = append(cur, token{kind: tokString})
				i = stringEnd(q, i, '"', m.backslash)
				continue
			}
			j := stringEnd(q, i, '"', false)
			cur = append(cur, token{kind: tokQuoted, text: unquote(q[i:j], '"')})
			i = j
		case c == '`' && d != dialectPostgres:
			j := stringEnd(q, i, '`', false)
			cur = append(cur, token{kind: tokQuoted, text: unquote(q[i:j], '`')})
			i = j
		case c == '[' && d == dialectSQLite:
			j := strings.IndexByte(q[i+1:], ']')
			if j < 0 {
				j = n
			} else {
				j += i + 2
			}
			cur = append(cur, token{kind: tokQuoted, text: strings.Trim(q[i:j], "[]")})
			i = j
		case c == '$' && d == dialectPostgres:
			if j, ok := dollarQuoteEnd(q, i); ok {
				cur = append(cur, token{kind: tokString})
				i = j
				continue
			}
			cur = append(cur, token{kind: tokOther, text: "$"})
			i++
		case isWordByte(c):
			j := i + 1
			for j < n && (isWordByte(q[j]) || (q[j] == '$' && d != dialectSQLite)) {
				j++
			}
			w := q[i:j]
			if d == dialectPostgres && j < n {
				// E'…' always takes backslash escapes; U&'…' and U&"…"
				// quote like the plain forms.
				if (w == "E" || w == "e") && q[j] == '\'' {
					cur = append(cur, token{kind: tokString})
					i = stringEnd(q, j, '\'', true)
					continue
				}
				if (w == "U" || w == "u") && j+1 < n && q[j] == '&' && (q[j+1] == '\'' || q[j+1] == '"') {
					i = j + 1
					continue
				}
			}
			if c >= '0' && c <= '9' {
				cur = append(cur, token{kind: tokOther, text: w})
			} else {
				cur = append(cur, token{kind: tokWord, text: strings.ToUpper(w)})
			}
			i = j
		default:
			cur = append(cur, token{kind: tokOther, text: q[i : i+1]})
			i++
		}
	}
	end()
	return out
}

func isWordByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80
}

// lineEnd returns the index after the line comment starting at i.
func lineEnd(q string, i int) int {
	j := strings.IndexByte(q[i:], '\n')
	if j < 0 {
		return len(q)
	}
	return i + j + 1
}

// blockCommentEnd returns the index after the /* comment starting at i.
// PostgreSQL's block comments nest; MySQL's and SQLite's do not.
func blockCommentEnd(d dialect, q string, i int) int {
	depth := 0
	for j := i; j < len(q)-1; {
		switch {
		case q[j] == '/' && q[j+1] == '*':
			if depth == 0 || d == dialectPostgres {
				depth++
			}
			j += 2
		case q[j] == '*' && q[j+1] == '/':
			depth--
			j += 2
			if depth == 0 {
				return j
			}
		default:
			j++
		}
	}
	return len(q)
}

// mysqlExecComment reports whether a /*! or /*M! comment (whose content
// MySQL or MariaDB executes) starts at i, and the index where its code
// starts.
func mysqlExecComment(q string, i int) (int, bool) {
	j := i + 2
	if j < len(q) && (q[j] == 'M' || q[j] == 'm') && j+1 < len(q) && q[j+1] == '!' {
		j++
	}
	if j >= len(q) || q[j] != '!' {
		return 0, false
	}
	j++
	for j < len(q) && q[j] >= '0' && q[j] <= '9' {
		j++ // the version the code needs
	}
	return j, true
}

// stringEnd returns the index after the quoted run that starts at i with
// quote q[i]: a doubled quote stays inside, and so does an escaped one when
// backslash is set.
func stringEnd(q string, i int, quote byte, backslash bool) int {
	for j := i + 1; j < len(q); j++ {
		switch q[j] {
		case '\\':
			if backslash {
				j++
			}
		case quote:
			if j+1 < len(q) && q[j+1] == quote {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(q)
}

// unquote returns the identifier between the quotes of s, undoubling
// doubled quotes.
func unquote(s string, quote byte) string {
	if len(s) >= 2 && s[len(s)-1] == quote {
		s = s[1 : len(s)-1]
	} else if len(s) >= 1 {
		s = s[1:]
	}
	return strings.ReplaceAll(s, string([]byte{quote, quote}), string(quote))
}

// dollarQuoteEnd reports whether a PostgreSQL dollar quote ($$ or $tag$)
// starts at i and returns the index after its end.
func dollarQuoteEnd(q string, i int) (int, bool) {
	j := i + 1
	for j < len(q) && q[j] != '$' {
		c := q[j]
		if !(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80 || (j > i+1 && c >= '0' && c <= '9')) {
			return 0, false // $1, or a lone $
		}
		j++
	}
	if j >= len(q) {
		return 0, false
	}
	tag := q[i : j+1]
	k := strings.Index(q[j+1:], tag)
	if k < 0 {
		return len(q), true
	}
	return j + 1 + k + len(tag), true
}

// stmtKind is what the filter makes of one statement.
type stmtKind uint8

const (
	stmtPlain      stmtKind = iota // runs as it is
	stmtRefused                    // transaction control, or an implicit commit
	stmtSavepoint                  // SAVEPOINT name
	stmtRollbackTo                 // ROLLBACK TO [SAVEPOINT] name
	stmtRelease                    // RELEASE [SAVEPOINT] name
)

// verdict is the filter's answer for a whole query.
type verdict struct {
	refused string // why, when a statement is refused
	// ops are the savepoint statements of the query, in order, when every
	// reading agrees on them; nil when the query has none.
	ops []savepointOp
	// single: the query is one statement.
	single bool
	// dirty: the query changes state of the connection's session that
	// outlives the transaction (SET, USE, PRAGMA, a temporary table…): the
	// store closes the connection afterwards instead of pooling it.
	dirty bool
}

type savepointOp struct {
	kind stmtKind
	name string
}

// inspect reads q every way the server could and decides whether it may
// run through the handler's handle: it is refused when any reading finds
// transaction control, or when the readings disagree on the statements or
// their savepoints. (storeTx.inspect settles a disagreement by asking the
// session how it reads quotes.)
func inspect(d dialect, q string) verdict {
	vs := readAll(d, q)
	if v, ok := agreed(vs); ok {
		return v
	}
	return verdict{refused: "the statement reads differently under different session settings (quoting), and one reading ends the transaction or touches savepoints"}
}

// readAll returns the verdict of each of d's readings of q, in the order
// of d.readings().
func readAll(d dialect, q string) []verdict {
	modes := d.readings()
	out := make([]verdict, len(modes))
	for r, m := range modes {
		out[r] = readOne(d, m, q)
	}
	return out
}

// readOne decides q under one reading.
func readOne(d dialect, m lexMode, q string) verdict {
	var v verdict
	stmts := lex(d, m, q)
	for _, st := range stmts {
		if dirtiesSession(d, st) {
			v.dirty = true
		}
		kind, name, why := classify(d, st)
		switch kind {
		case stmtRefused:
			return verdict{refused: why, dirty: v.dirty}
		case stmtSavepoint, stmtRollbackTo, stmtRelease:
			v.ops = append(v.ops, savepointOp{kind: kind, name: name})
		}
	}
	v.single = len(stmts) <= 1
	return v
}

// agreed returns the common verdict of the readings, and whether they
// agree (all refuse, or none does and they see the same statements and
// savepoints).
func agreed(vs []verdict) (verdict, bool) {
	v := vs[0]
	for _, w := range vs[1:] {
		if (v.refused == "") != (w.refused == "") {
			return verdict{}, false
		}
		if v.refused == "" && (!sameOps(v.ops, w.ops) || v.single != w.single) {
			return verdict{}, false
		}
		v.dirty = v.dirty || w.dirty
	}
	return v, true
}

// mentionsQuoting reports whether q may change how the session reads
// quotes (sql_mode, standard_conforming_strings) on its way.
func mentionsQuoting(q string) bool {
	u := strings.ToUpper(q)
	return strings.Contains(u, "SQL_MODE") || strings.Contains(u, "STANDARD_CONFORMING_STRINGS")
}

func sameOps(a, b []savepointOp) bool {
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

// sessionWords start statements that change session state beyond the
// transaction.
var sessionWords = map[string]bool{
	"SET": true, "RESET": true, "USE": true, "PRAGMA": true, "ATTACH": true, "DETACH": true,
	"LISTEN": true, "UNLISTEN": true, "LOAD": true, "DECLARE": true, "PREPARE": true, "DEALLOCATE": true,
}

// dirtiesSession reports whether st may leave session state behind on the
// connection: a session setting, a temporary table, a cursor or a prepared
// statement that outlive the transaction.
func dirtiesSession(d dialect, st []token) bool {
	if len(st) == 0 || st[0].kind != tokWord {
		return false
	}
	w1 := ""
	if len(st) > 1 && st[1].kind == tokWord {
		w1 = st[1].text
	}
	switch first := st[0].text; {
	case first == "SET" && d == dialectPostgres && (w1 == "LOCAL" || w1 == "CONSTRAINTS"):
		return false
	case sessionWords[first]:
		return true
	case first == "CREATE":
		for _, t := range st[1:min(len(st), 4)] {
			if t.kind == tokWord && (t.text == "TEMP" || t.text == "TEMPORARY") {
				return true
			}
		}
	case first == "SELECT" && d == dialectPostgres:
		for _, t := range st {
			if t.kind == tokWord && t.text == "SET_CONFIG" {
				return true
			}
		}
	}
	return false
}

// classify decides one statement.
func classify(d dialect, st []token) (kind stmtKind, name, why string) {
	w := func(i int) string {
		if i < len(st) && st[i].kind == tokWord {
			return st[i].text
		}
		return ""
	}
	refuse := func() (stmtKind, string, string) {
		return stmtRefused, "", w(0) + " ends or commits the transaction"
	}
	spName := func(i int) string {
		if i >= len(st) {
			return ""
		}
		switch st[i].kind {
		case tokWord:
			return strings.ToLower(st[i].text)
		case tokQuoted:
			if d == dialectPostgres {
				return st[i].text
			}
			return strings.ToLower(st[i].text)
		}
		return ""
	}
	// ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name
	rollbackTo := func() (stmtKind, string, string) {
		i := 1
		if x := w(i); x == "WORK" || x == "TRANSACTION" {
			i++
		}
		if w(i) != "TO" {
			return refuse()
		}
		i++
		if w(i) == "SAVEPOINT" {
			i++
		}
		return stmtRollbackTo, spName(i), ""
	}
	release := func() (stmtKind, string, string) {
		i := 1
		if w(i) == "SAVEPOINT" {
			i++
		}
		return stmtRelease, spName(i), ""
	}
	switch w(0) {
	case "SAVEPOINT":
		return stmtSavepoint, spName(1), ""
	case "RELEASE":
		return release()
	case "ROLLBACK":
		return rollbackTo()
	case "COMMIT", "BEGIN", "END":
		return refuse()
	}
	switch d {
	case dialectPostgres:
		switch w(0) {
		case "ABORT", "START":
			return refuse()
		case "PREPARE":
			if w(1) == "TRANSACTION" {
				return refuse()
			}
		}
	case dialectMySQL:
		return classifyMySQL(st, w, refuse)
	}
	return stmtPlain, "", ""
}

// mysqlImplicitCommit lists the first words of MySQL and MariaDB statements
// that end or implicitly commit the transaction, or may (a stored procedure
// or a prepared statement can hold a COMMIT the handle cannot see; a
// compound statement can hold any statement).
var mysqlImplicitCommit = map[string]bool{
	"START": true, "STOP": true, "XA": true, "LOCK": true, "UNLOCK": true,
	"ALTER": true, "RENAME": true, "TRUNCATE": true, "GRANT": true, "REVOKE": true,
	"ANALYZE": true, "CACHE": true, "CHECK": true, "FLUSH": true, "OPTIMIZE": true,
	"REPAIR": true, "RESET": true, "INSTALL": true, "UNINSTALL": true, "CHANGE": true,
	"PREPARE": true, "EXECUTE": true, "CALL": true, "SHUTDOWN": true, "RESTART": true,
	"BACKUP": true, "IF": true, "CASE": true, "LOOP": true, "WHILE": true, "REPEAT": true,
	"DECLARE": true, "FOR": true, "ABORT": true,
}

func classifyMySQL(st []token, w func(int) string, refuse func() (stmtKind, string, string)) (stmtKind, string, string) {
	first := w(0)
	switch {
	case mysqlImplicitCommit[first]:
		return refuse()
	case first == "LOAD" && w(1) == "INDEX":
		return refuse()
	case first == "CREATE":
		// Only CREATE [OR REPLACE] TEMPORARY TABLE leaves the transaction
		// open.
		i := 1
		if w(i) == "OR" && w(i+1) == "REPLACE" {
			i += 2
		}
		if w(i) == "TEMPORARY" && w(i+1) == "TABLE" {
			return stmtPlain, "", ""
		}
		return refuse()
	case first == "DROP":
		if w(1) == "TEMPORARY" && w(2) == "TABLE" {
			return stmtPlain, "", ""
		}
		return refuse()
	case first == "SET":
		switch {
		case w(1) == "PASSWORD", w(1) == "DEFAULT" && w(2) == "ROLE":
			return refuse()
		case w(1) == "STATEMENT":
			// MariaDB: SET STATEMENT var = value, … FOR statement.
			for i := 2; i < len(st); i++ {
				if st[i].kind == tokWord && st[i].text == "FOR" {
					kind, name, why := classify(dialectMySQL, st[i+1:])
					if kind != stmtPlain {
						// A savepoint statement under SET STATEMENT is
						// not worth following.
						return stmtRefused, name, why + " (under SET STATEMENT)"
					}
					break
				}
			}
		}
		for _, t := range st {
			if t.kind == tokWord && (t.text == "AUTOCOMMIT" || t.text == "COMPLETION_TYPE") {
				return stmtRefused, "", "SET " + strings.ToLower(t.text) + " ends or commits the transaction, or changes how the store's COMMIT ends it"
			}
		}
	}
	return stmtPlain, "", ""
}
