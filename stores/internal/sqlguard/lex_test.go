package sqlguard

import (
	"strings"
	"testing"
)

// words renders the statements of q under r: each token a word in lower
// case or "∅" for any other token, "|" between statements.
func words(d Dialect, r Reading, q string) string {
	var stmts []string
	sc := newScanner(d, r, q, nil, 0)
	for sc.next() {
		ws := make([]string, len(sc.st))
		for i, t := range sc.st {
			ws[i] = "∅"
			if t.kind == tokWord {
				ws[i] = lowerASCII(t.text)
			}
		}
		stmts = append(stmts, strings.Join(ws, " "))
	}
	return strings.Join(stmts, "|")
}

// open reports whether q ends inside a literal or comment under r.
func open(d Dialect, r Reading, q string) bool {
	sc := newScanner(d, r, q, nil, 0)
	for sc.next() {
	}
	return sc.open()
}

func TestStatements(t *testing.T) {
	for _, c := range []struct {
		d    Dialect
		sql  string
		want string
	}{
		{PostgreSQL, "SELECT 1; COMMIT", "select ∅|commit"},
		{PostgreSQL, "rollback work to sp", "rollback work to sp"},
		{PostgreSQL, "/*x*/ Prepare TRANSACTION 'g'", "prepare transaction ∅"},
		{PostgreSQL, `"q" x; $$a$$; 'b'`, "∅ x|∅|∅"},
		{PostgreSQL, "a_b$c d; E'x' y; U&'z'", "a_b$c d|∅ y|∅"},
		{PostgreSQL, "SELECT $1$$; COMMIT", "select ∅ ∅"},
		{PostgreSQL, "SELECT 1e'x'", "select ∅ ∅"},
		{PostgreSQL, ";;  ; ", ""},
		{MySQL, "SELECT `a;b`, \"c;d\" # x ; y\n; COMMIT", "select ∅ ∅ ∅|commit"},
		{MySQL, "SELECT 1 --1; COMMIT", "select ∅ ∅ ∅ ∅|commit"},
		{MySQL, "/*!50000 COMMIT */ x", "commit x"},
		{MySQL, "SELECT 1a$b", "select ∅"},
		{SQLite, "SELECT [a;b] FROM x$y", "select ∅ from x ∅ y"},
		{SQLite, "SELECT 'a\\'; COMMIT", "select ∅|commit"},
	} {
		if got := words(c.d, c.d.Readings()[0], c.sql); got != c.want {
			t.Errorf("%s: statements(%q) = %q, want %q", c.d, c.sql, got, c.want)
		}
	}
}

func TestOpen(t *testing.T) {
	for _, c := range []struct {
		d    Dialect
		sql  string
		open bool
	}{
		{PostgreSQL, "SELECT 'a", true}, {PostgreSQL, "SELECT $x$ a", true}, {PostgreSQL, "/* /* */", true},
		{PostgreSQL, `SELECT "a`, true}, {PostgreSQL, "SELECT 'a' -- x", false}, {PostgreSQL, "/* /* */ */", false},
		{MySQL, "/* /* */", false}, {MySQL, "SELECT `a", true}, {SQLite, "SELECT [a", true},
	} {
		if got := open(c.d, c.d.Readings()[0], c.sql); got != c.open {
			t.Errorf("%s: %q open %v, want %v", c.d, c.sql, got, c.open)
		}
	}
}

func TestLowerASCII(t *testing.T) {
	for in, want := range map[string]string{"COMMIT": "commit", "commit": "commit", "CoMmİt": "commİt", "": ""} {
		if got := lowerASCII(in); got != want {
			t.Errorf("lowerASCII(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzGuard checks properties of the guard on arbitrary text, in every
// dialect: it never panics; transaction control first is always found
// (TxControl and Inspect); text that one reading closes cleanly (no open
// literal or comment) cannot hide a COMMIT that follows it on its own
// line; a refused text stays refused whatever follows it on a new line;
// and Inspect refuses whatever TxControl does.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"SELECT 1", "'", "\"", "`", "$$", "$a$", "/*", "--", "-- ", "#", "/*!", "/*M!", "*/", "E'\\'",
		"[", "U&'", "U&\"", "B'", "/* /* */", "SELECT 'a\\'; COMMIT", "SELECT E''\n'\\'' , '\\'; COMMIT; --'",
		"SELECT 'a' -- c\n'b'; COMMIT", "ROLLBACK TO s", "SET autocommit=1", "SET STATEMENT x = 1 FOR COMMIT",
		"SELECT $1$$; COMMIT", "SELECT 1e'\\''; COMMIT; --'", "SAVEPOINT \"a\"\"b\""} {
		f.Add(s)
	}
	dialects := []Dialect{PostgreSQL, MySQL, SQLite}
	f.Fuzz(func(t *testing.T, q string) {
		for _, d := range dialects {
			_, found := TxControl(d, q)
			v := Inspect(d, q)
			if found && v.Refused == "" {
				t.Fatalf("%s: %q: TxControl refuses, Inspect lets it through", d, q)
			}
			for _, prefix := range []string{"COMMIT;", "ROLLBACK;"} {
				if _, ok := TxControl(d, prefix+q); !ok {
					t.Fatalf("%s: %s%q not found", d, prefix, q)
				}
				if v := Inspect(d, prefix+q); v.Refused == "" {
					t.Fatalf("%s: %s%q let through", d, prefix, q)
				}
			}
			for _, r := range d.Readings() {
				if open(d, r, q) {
					continue
				}
				if v := Read(d, r, q+"\n;COMMIT"); v.Refused == "" {
					t.Fatalf("%s: %q closes cleanly (%+v) but hides the COMMIT after it", d, q, r)
				}
			}
			if found {
				if _, ok := TxControl(d, q+"\n;SELECT 1"); !ok {
					t.Fatalf("%s: %q found, but not with a statement after it", d, q)
				}
			}
		}
	})
}
