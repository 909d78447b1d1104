package sqlguard

import "strings"

// refused is classify's kind for a statement that must not run.
const refused OpKind = 0xff

// classify decides one statement: refused, a savepoint statement with the
// savepoint's name, or 0 for a statement that runs as it is.
func classify(d Dialect, st []token) (OpKind, string) {
	w := func(i int) token {
		if i < len(st) {
			return st[i]
		}
		return token{}
	}
	switch first := w(0); {
	case first.is("SAVEPOINT"):
		return Savepoint, savepointName(d, w(1))
	case first.is("RELEASE"):
		i := 1
		if w(i).is("SAVEPOINT") {
			i++
		}
		return Release, savepointName(d, w(i))
	case first.is("ROLLBACK"):
		// ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name stays inside
		// the transaction; every other ROLLBACK (plain, AND CHAIN,
		// PREPARED) ends one.
		i := 1
		if w(i).is("WORK") || w(i).is("TRANSACTION") {
			i++
		}
		if !w(i).is("TO") {
			return refused, ""
		}
		i++
		if w(i).is("SAVEPOINT") {
			i++
		}
		return RollbackTo, savepointName(d, w(i))
	case first.is("COMMIT"), first.is("BEGIN"), first.is("END"):
		return refused, ""
	}
	switch d {
	case PostgreSQL:
		switch {
		case w(0).is("ABORT"), w(0).is("START"):
			return refused, ""
		case w(0).is("PREPARE") && w(1).is("TRANSACTION"):
			// PREPARE TRANSACTION 'gid' ends the transaction; PREPARE name
			// AS … only plans a statement.
			return refused, ""
		}
	case MySQL:
		if mysqlRefuses(st, w) {
			return refused, ""
		}
	}
	return 0, ""
}

// savepointName is the name a savepoint statement names in t, as the
// server compares it.
func savepointName(d Dialect, t token) string {
	switch t.kind {
	case tokWord:
		return lowerASCII(t.text)
	case tokQuoted:
		name := unquote(t.text)
		if d == PostgreSQL {
			return name
		}
		return lowerASCII(name)
	}
	return ""
}

// unquote returns the identifier between the quotes of s ("…", `…`,
// […], or U&"…"), undoubling doubled quotes.
func unquote(s string) string {
	if strings.HasPrefix(s, "U&") || strings.HasPrefix(s, "u&") {
		s = s[2:]
	}
	if s == "" {
		return ""
	}
	open, end := s[0], s[0]
	if open == '[' {
		end = ']'
	}
	s = s[1:]
	if strings.HasSuffix(s, string(end)) {
		s = s[:len(s)-1]
	}
	if open == '[' {
		return s
	}
	return strings.ReplaceAll(s, string([]byte{open, open}), string(open))
}

// mysqlImplicitCommit lists the first words of MySQL and MariaDB statements
// that end or implicitly commit the transaction, or may (a stored procedure
// or a prepared statement can hold a COMMIT the guard cannot see; a
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

func mysqlRefuses(st []token, w func(int) token) bool {
	first := w(0)
	switch {
	case mysqlImplicitCommit[upperASCII(first)]:
		return true
	case first.is("LOAD") && w(1).is("INDEX"):
		return true
	case first.is("CREATE"):
		// Only CREATE [OR REPLACE] TEMPORARY TABLE leaves the transaction
		// open.
		i := 1
		if w(i).is("OR") && w(i+1).is("REPLACE") {
			i += 2
		}
		return !(w(i).is("TEMPORARY") && w(i+1).is("TABLE"))
	case first.is("DROP"):
		return !(w(1).is("TEMPORARY") && w(2).is("TABLE"))
	case first.is("SET"):
		switch {
		case w(1).is("PASSWORD"), w(1).is("DEFAULT") && w(2).is("ROLE"):
			return true
		case w(1).is("STATEMENT"):
			// MariaDB: SET STATEMENT var = value, … FOR statement. A
			// savepoint statement under it is not worth following.
			for i := 2; i < len(st); i++ {
				if st[i].is("FOR") {
					if k, _ := classify(MySQL, st[i+1:]); k != 0 {
						return true
					}
					break
				}
			}
		}
		for _, t := range st {
			if t.is("AUTOCOMMIT") || t.is("COMPLETION_TYPE") {
				return true
			}
		}
	}
	return false
}

// upperASCII returns t's text in upper case (ASCII letters only) when it
// is a bare word, and "" otherwise.
func upperASCII(t token) string {
	if t.kind != tokWord {
		return ""
	}
	for i := 0; i < len(t.text); i++ {
		if c := t.text[i]; c >= 'a' && c <= 'z' {
			b := []byte(t.text)
			for j := i; j < len(b); j++ {
				if b[j] >= 'a' && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return t.text
}

// sessionWords start statements that change session state beyond the
// transaction.
var sessionWords = map[string]bool{
	"SET": true, "RESET": true, "USE": true, "PRAGMA": true, "ATTACH": true, "DETACH": true,
	"LISTEN": true, "UNLISTEN": true, "LOAD": true, "DECLARE": true, "PREPARE": true, "DEALLOCATE": true,
}

// dirties reports whether st may leave session state behind on the
// connection: a session setting, a temporary table, a cursor or a prepared
// statement that outlive the transaction.
func dirties(d Dialect, st []token) bool {
	first := st[0]
	if first.kind != tokWord {
		return false
	}
	second := token{}
	if len(st) > 1 {
		second = st[1]
	}
	switch {
	case first.is("SET") && d == PostgreSQL && (second.is("LOCAL") || second.is("CONSTRAINTS")):
		return false
	case sessionWords[upperASCII(first)]:
		return true
	case first.is("CREATE"):
		for _, t := range st[1:min(len(st), 4)] {
			if t.is("TEMP") || t.is("TEMPORARY") {
				return true
			}
		}
	case first.is("SELECT") && d == PostgreSQL:
		for _, t := range st {
			if t.is("SET_CONFIG") {
				return true
			}
		}
	}
	return false
}
