package idempgx

import (
	"strings"
	"testing"
)

// lexerCases are SQL texts and whether they hold a transaction-control
// statement under either setting of standard_conforming_strings. The
// differential test in lexer_db_test.go runs every one of them against
// PostgreSQL and checks that the server never ends a transaction on a text
// marked false here.
var lexerCases = []struct {
	sql  string
	want bool
}{
	// The statements themselves, in any case and spelling.
	{"COMMIT", true}, {"commit", true}, {"CoMmIt", true}, {"commit work", true}, {"COMMIT TRANSACTION", true},
	{"END", true}, {"end transaction", true}, {"END WORK", true},
	{"ROLLBACK", true}, {"rollback work", true}, {"ROLLBACK TRANSACTION", true},
	{"ABORT", true}, {"abort work", true},
	{"COMMIT AND CHAIN", true}, {"COMMIT AND NO CHAIN", true}, {"ROLLBACK AND CHAIN", true}, {"ROLLBACK AND NO CHAIN", true},
	{"PREPARE TRANSACTION 'idem'", true}, {"prepare   transaction 'x'", true},
	{"COMMIT PREPARED 'idem'", true}, {"ROLLBACK PREPARED 'idem'", true},
	{"BEGIN", true}, {"begin isolation level serializable", true}, {"BEGIN WORK", true},
	{"START TRANSACTION", true}, {"start transaction read only", true},
	{"ROLLBACK;", true}, {"ROLLBACK(", true},

	// After comments and white space, in multi-statement strings.
	{"/* a comment */ COMMIT", true}, {"-- a line comment\nCOMMIT", true}, {"-- a line comment\rCOMMIT", true},
	{"  \n\tCoMmIt  ;", true}, {"\vCOMMIT", true}, {"\fCOMMIT", true},
	{"/* outer /* nested */ still a comment */ COMMIT", true},
	{"SELECT 1; COMMIT", true}, {"SELECT 'a;b'; commit; SELECT 1", true},
	{"SELECT 1;COMMIT", true}, {"SELECT 1;;;COMMIT", true}, {"SELECT 1 ;\n-- c\n/* d */ commit", true},
	{"select 1 ; end", true}, {"INSERT INTO t VALUES (1); ROLLBACK; INSERT INTO t VALUES (2)", true},
	{"COMMIT; ROLLBACK TO SAVEPOINT s", true},
	{"SELECT 1 +-- comment ; still comment\n1; COMMIT", true},
	{"SELECT 1 /* ; */ ; COMMIT", true},

	// standard_conforming_strings on: '\' is a whole string.
	{`SELECT '\'; COMMIT; --'`, true},
	// standard_conforming_strings off: 'a\'' is one string; the reading with
	// escapes finds COMMIT.
	{`SELECT 'a\''; COMMIT; --'`, true},
	{`SELECT '\\'; COMMIT`, true},
	{`SELECT $q$x$q$; COMMIT`, true}, {`SELECT $$;$$; COMMIT`, true}, {"SELECT $a$ $b$ $a$; COMMIT", true},
	{`SELECT "a;b"; COMMIT`, true}, {`SELECT "a""b"; COMMIT`, true},
	{`SELECT B'1'; COMMIT`, true},
	{`SELECT X'1F'; COMMIT`, true},
	{`SELECT U&'\0041'; COMMIT`, true},
	{`SELECT 1e'\''; COMMIT; --'`, true}, // 1 then an escape string (PostgreSQL 15)
	{`SELECT 1; COMMIT /* unterminated`, true},
	{"SELECT $1; COMMIT", true}, {"SELECT $1 $$x$$; COMMIT", true},

	// Quote continuation: a string, a newline, a string is one literal in
	// the first string's mode.
	{"SELECT E''\n'\\'' , '\\'; COMMIT; --'", true},
	{"SELECT 'a'\n'b'; COMMIT", true},
	{"SELECT 'a' -- c\n'b'; COMMIT", true},

	// Harmless: transaction words inside literals, identifiers, comments,
	// or as other statements' words.
	{"SELECT 'COMMIT'", false}, {"SELECT 1 /* ; COMMIT */", false}, {"SELECT $$;COMMIT;$$", false},
	{`SELECT 1 AS "commit"`, false}, {`SELECT E'\';COMMIT;--'`, false}, {"SELECT 'it''s; COMMIT'", false},
	{"SELECT 1 -- ; COMMIT", false}, {"SELECT $tag$ ; COMMIT ; $tag$", false},
	{"SELECT $a$ $b$ ; COMMIT $b$ $a$", false}, {"SELECT $a$ $$ ; COMMIT $$ $a$", false},
	{"SAVEPOINT s", false}, {"ROLLBACK TO SAVEPOINT s", false}, {"rollback to s", false},
	{"ROLLBACK WORK TO SAVEPOINT s", false}, {"ROLLBACK TRANSACTION TO s", false}, {"RELEASE SAVEPOINT s", false},
	{"SAVEPOINT a; ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a", false},
	{"SET LOCAL application_name = 'commit'", false}, {"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", false},
	{"PREPARE stmt AS SELECT 1", false}, {"prepare commit_it (int) AS SELECT $1", false},
	{"SELECT commit FROM t", false}, {"SELECT begin, \"end\" FROM t", false}, {"CREATE TABLE begin_x (id int)", false},
	{"SELECT a$b$c FROM t; SELECT 1", false}, {"SELECT x$$ FROM t", false},
	{"SELECT 'a'\n'b'", false}, {"SELECT E'a'\n'\\'; COMMIT; --'", false},
	{`SELECT B'1''; COMMIT; --'`, false}, // B'1' ends at the first quote, then a plain string
	{"SELECT $1$$; COMMIT", false},       // $1, then an unterminated dollar quote: a syntax error
	{"SELECT 1e5", false}, {"SELECT .5e-3", false}, {"SELECT 1..2", false},
	{"", false}, {";", false}, {" ;; ", false}, {"/* only a comment */", false}, {"-- only a comment", false},
	{"DO $$ BEGIN COMMIT; END $$", false}, // fails on the server inside a transaction block
	{"SELECT 'unterminated; COMMIT", false}, {"SELECT $$ unterminated; COMMIT", false},
	{"SELECT /* unterminated; COMMIT", false}, {`SELECT "unterminated; COMMIT`, false},
	{"SELECT 1 \u00a0COMMIT", false},  // NBSP is not white space to PostgreSQL
	{"SELECT 1; \u00a0COMMIT", false}, // … so "\u00a0commit" is one (unknown) word
	{"SELECT 1; COMMİT", false},       // keywords fold ASCII only
	{"SELECT 'x' FROM \"t;COMMIT\"", false}, {`SELECT U&"a;COMMIT"`, false},
}

func TestTxControlStatement(t *testing.T) {
	for _, tc := range lexerCases {
		words, got := txControlStatement(tc.sql)
		if got != tc.want {
			t.Errorf("txControlStatement(%q) = %v (%q), want %v", tc.sql, got, words, tc.want)
		}
	}
}

// TestTxControlReadings shows that each reading of backslashes matters: a
// lexer with only one of them misses one of these.
func TestTxControlReadings(t *testing.T) {
	for _, tc := range []struct {
		sql     string
		on, off bool // found with standard_conforming_strings on / off
	}{
		{`SELECT '\'; COMMIT; --'`, true, false},
		{`SELECT 'a\''; COMMIT; --'`, false, true},
		{`SELECT E'\'; COMMIT; --'`, false, false},
		{"SELECT 1; COMMIT", true, true},
	} {
		_, on := scanTxControl(tc.sql, false)
		_, off := scanTxControl(tc.sql, true)
		if on != tc.on || off != tc.off {
			t.Errorf("%q: found with standard_conforming_strings on %v, off %v; want %v, %v", tc.sql, on, off, tc.on, tc.off)
		}
	}
}

func TestScanStatementsWords(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want string // statements' first words, "|" between statements, "∅" for a token that is not a word
	}{
		{"SELECT 1; COMMIT", "select ∅|commit"},
		{"rollback work to sp", "rollback work to"},
		{"/*x*/ Prepare TRANSACTION 'g'", "prepare transaction ∅"},
		{`"q" x; $$a$$; 'b'`, "∅|∅|∅"},
		{"a_b$c d; E'x' y; U&'z'", "a_b$c d|∅|∅"},
		{";;  ; ", ""},
	} {
		var stmts []string
		scanStatements(tc.sql, false, func(w []string) bool {
			ws := make([]string, len(w))
			for i, x := range w {
				ws[i] = x
				if x == "" {
					ws[i] = "∅"
				}
			}
			stmts = append(stmts, strings.Join(ws, " "))
			return true
		})
		if got := strings.Join(stmts, "|"); got != tc.want {
			t.Errorf("scanStatements(%q) = %q, want %q", tc.sql, got, tc.want)
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

// FuzzTxControl checks properties of the lexer on arbitrary text: it never
// panics; a transaction-control statement first is always found; and text
// that one reading closes cleanly (no open literal or comment) cannot hide
// a COMMIT that follows it on its own line.
func FuzzTxControl(f *testing.F) {
	for _, tc := range lexerCases {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		_, found := txControlStatement(sql)
		if _, ok := txControlStatement("COMMIT;" + sql); !ok {
			t.Fatalf("COMMIT;%q not found", sql)
		}
		for _, backslash := range []bool{false, true} {
			open := scanStatements(sql, backslash, func([]string) bool { return true })
			if open {
				continue
			}
			if _, ok := scanTxControl(sql+"\n;COMMIT", backslash); !ok {
				t.Fatalf("%q closes cleanly (backslash escapes %v) but hides the COMMIT after it", sql, backslash)
			}
		}
		if found {
			// A found statement stays found whatever follows it on a new
			// line, unless it is a ROLLBACK or PREPARE whose next words
			// decide.
			if _, ok := txControlStatement(sql + "\n;SELECT 1"); !ok {
				t.Fatalf("%q found, but not with a statement after it", sql)
			}
		}
	})
}
