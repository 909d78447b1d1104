// Package guardtest holds the cases that prove sqlguard: texts with the
// verdict each dialect must reach, and the generator of random texts that
// the stores' differential tests send to a real server to check that the
// server never ends a transaction on a text the guard let through.
package guardtest

import (
	"math/rand/v2"
	"strings"

	"github.com/idemgo/idem/stores/internal/sqlguard"
)

// Case is a text and whether the guard must refuse it on Dialect.
type Case struct {
	Dialect sqlguard.Dialect
	SQL     string
	Refused bool
}

func cases(d sqlguard.Dialect, refused bool, sqls ...string) []Case {
	out := make([]Case, len(sqls))
	for i, s := range sqls {
		out[i] = Case{d, s, refused}
	}
	return out
}

// Cases are the guard's table: each text, the dialect it is read in, and
// whether it holds transaction control under some reading, which both
// sqlguard.TxControl and sqlguard.Inspect must report.
var Cases = concat(
	// PostgreSQL. The statements themselves, in any case and spelling.
	cases(sqlguard.PostgreSQL, true,
		"COMMIT", "commit", "CoMmIt", "commit work", "COMMIT TRANSACTION",
		"END", "end transaction", "END WORK",
		"ROLLBACK", "rollback work", "ROLLBACK TRANSACTION",
		"ABORT", "abort work",
		"COMMIT AND CHAIN", "COMMIT AND NO CHAIN", "ROLLBACK AND CHAIN", "ROLLBACK AND NO CHAIN",
		"PREPARE TRANSACTION 'idem'", "prepare   transaction 'x'",
		"COMMIT PREPARED 'idem'", "ROLLBACK PREPARED 'idem'",
		"BEGIN", "begin isolation level serializable", "BEGIN WORK",
		"START TRANSACTION", "start transaction read only",
		"ROLLBACK;", "ROLLBACK(",
		// After comments and white space, in multi-statement strings.
		"/* a comment */ COMMIT", "-- a line comment\nCOMMIT", "-- a line comment\rCOMMIT",
		"  \n\tCoMmIt  ;", "\vCOMMIT", "\fCOMMIT",
		"/* outer /* nested */ still a comment */ COMMIT",
		"SELECT 1; COMMIT", "SELECT 'a;b'; commit; SELECT 1",
		"SELECT 1;COMMIT", "SELECT 1;;;COMMIT", "SELECT 1 ;\n-- c\n/* d */ commit",
		"select 1 ; end", "INSERT INTO t VALUES (1); ROLLBACK; INSERT INTO t VALUES (2)",
		"COMMIT; ROLLBACK TO SAVEPOINT s",
		"SELECT 1 +-- comment ; still comment\n1; COMMIT",
		"SELECT 1 /* ; */ ; COMMIT",
		// standard_conforming_strings on: '\' is a whole string.
		`SELECT '\'; COMMIT; --'`,
		// standard_conforming_strings off: 'a\'' is one string; the
		// reading with escapes finds COMMIT.
		`SELECT 'a\''; COMMIT; --'`,
		`SELECT 'a\'; COMMIT; SELECT '1'`,
		`SELECT '\\'; COMMIT`, "SELECT E'\\\\'; COMMIT",
		`SELECT $q$x$q$; COMMIT`, `SELECT $$;$$; COMMIT`, `SELECT $$a$$;COMMIT`, "SELECT $a$ $b$ $a$; COMMIT",
		`SELECT "a;b"; COMMIT`, `SELECT "a""b"; COMMIT`,
		`SELECT B'1'; COMMIT`, `SELECT X'1F'; COMMIT`,
		// B'1' ends at its second quote (bit strings double no quotes):
		// then a plain string, which with escapes ends before COMMIT.
		`SELECT B'1''\''; COMMIT; --'`,
		`SELECT U&'\0041'; COMMIT`, "SELECT U&'x'; COMMIT",
		`SELECT 1e'\''; COMMIT; --'`, // 1 then an escape string (PostgreSQL 15)
		`SELECT 1; COMMIT /* unterminated`,
		"SELECT $1; COMMIT", "SELECT $1 $$x$$; COMMIT",
		// Quote continuation: a string, a newline, a string is one
		// literal in the first string's mode.
		"SELECT E''\n'\\'' , '\\'; COMMIT; --'",
		"SELECT 'a'\n'b'; COMMIT",
		"SELECT 'a' -- c\n'b'; COMMIT",
	),
	// PostgreSQL, harmless: transaction words inside literals,
	// identifiers, comments, or as other statements' words.
	cases(sqlguard.PostgreSQL, false,
		"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", "SELECT $$;COMMIT;$$",
		`SELECT 1 AS "commit"`, `SELECT E'\';COMMIT;--'`, "SELECT 'it''s; COMMIT'",
		"SELECT 1 -- ; COMMIT", "SELECT $tag$ ; COMMIT ; $tag$", "SELECT $tag$ COMMIT $tag$",
		"SELECT $a$ $b$ ; COMMIT $b$ $a$", "SELECT $a$ $$ ; COMMIT $$ $a$",
		"SAVEPOINT s", "ROLLBACK TO SAVEPOINT s", "rollback to s", "ROLLBACK TO s1",
		"ROLLBACK WORK TO SAVEPOINT s", "ROLLBACK TRANSACTION TO s", "RELEASE SAVEPOINT s", "RELEASE s1",
		"SAVEPOINT a; ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a",
		"SET LOCAL application_name = 'commit'", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
		"PREPARE stmt AS SELECT 1", "prepare commit_it (int) AS SELECT $1",
		"SELECT commit FROM t", "SELECT begin, \"end\" FROM t", "CREATE TABLE begin_x (id int)",
		"SELECT a$b$c FROM t; SELECT 1", "SELECT a$b$c FROM t", "SELECT x$$ FROM t",
		"INSERT INTO t VALUES ($1, $2)",
		"SELECT 'a'\n'b'", "SELECT E'a'\n'\\'; COMMIT; --'",
		`SELECT B'1''; COMMIT; --'`, // B'1' ends at the first quote, then a plain string
		"SELECT $1$$; COMMIT",       // $1, then an unterminated dollar quote: a syntax error
		"SELECT 1e5", "SELECT .5e-3", "SELECT 1..2",
		"", ";", " ;; ", "/* only a comment */", "-- only a comment", "-- COMMIT", "/* COMMIT",
		"DO $$ BEGIN COMMIT; END $$", // fails on the server inside a transaction block
		"SELECT 'unterminated; COMMIT", "SELECT $$ unterminated; COMMIT",
		"SELECT /* unterminated; COMMIT", `SELECT "unterminated; COMMIT`,
		"SELECT 1 \u00a0COMMIT",  // NBSP is not white space to PostgreSQL
		"SELECT 1; \u00a0COMMIT", // … so "\u00a0commit" is one (unknown) word
		"SELECT 1; COMMİT",       // keywords fold ASCII only
		"SELECT 1; commıt",       // … whatever Unicode's upper case of ı is
		"SELECT 'x' FROM \"t;COMMIT\"", `SELECT U&"a;COMMIT"`,
		"SELECT 'x' -- '\n; SELECT 1",
	),
	cases(sqlguard.MySQL, true,
		"COMMIT", "commit work", "ROLLBACK", "ROLLBACK WORK", "COMMIT AND CHAIN", "BEGIN", "BEGIN WORK",
		"START TRANSACTION", "START TRANSACTION READ ONLY", "SET autocommit = 1", "SET @@autocommit=1",
		"set session autocommit = ON", "SET @@session.autocommit = 1", "SET autocommit = 0", "SET @a = 1, autocommit = 1",
		"SET completion_type = 2", "XA START 'x'", "XA END 'x'", "/* a */ COMMIT", "# c\nCOMMIT", "-- c\nCOMMIT",
		"SELECT 1; COMMIT", "/*!COMMIT*/", "/*!50000 COMMIT */", "/*M!100000 COMMIT */", "SELECT 1 /*! ; COMMIT */",
		"CREATE TABLE x (id INT)", "CREATE OR REPLACE TABLE x (id INT)", "DROP TABLE IF EXISTS x", "TRUNCATE TABLE x",
		"ALTER TABLE x ADD COLUMN y INT", "LOCK TABLES x WRITE", "UNLOCK TABLES", "RENAME TABLE a TO b",
		"FLUSH TABLES", "ANALYZE TABLE x", "OPTIMIZE TABLE x", "REPAIR TABLE x", "CHECK TABLE x",
		"CREATE INDEX i ON x (y)", "DROP INDEX i ON x", "CREATE VIEW v AS SELECT 1", "CREATE USER u",
		"GRANT SELECT ON x TO u", "REVOKE SELECT ON x FROM u", "SET PASSWORD = 'x'", "CALL p()",
		"PREPARE s FROM 'COMMIT'", "EXECUTE s", "EXECUTE IMMEDIATE 'COMMIT'", "LOAD INDEX INTO CACHE x",
		"CACHE INDEX x IN y", "RESET QUERY CACHE", "INSTALL PLUGIN x SONAME 'y'", "BEGIN NOT ATOMIC SELECT 1; END",
		"IF 1 THEN COMMIT; END IF", "SET STATEMENT max_statement_time = 1 FOR COMMIT", "CREATE DATABASE d",
		"CREATE TEMPORARY TABLE x (id INT); COMMIT",
		// With backslash escapes off (NO_BACKSLASH_ESCAPES) 'a\' is a
		// whole string and the COMMIT runs; with ANSI_QUOTES "…" is an
		// identifier.
		`SELECT 'a\'; COMMIT; SELECT '1'`, `SELECT "a\"; COMMIT; SELECT "1"`,
	),
	cases(sqlguard.MySQL, false,
		"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", "SELECT 1 AS `commit`", "SELECT 'it''s; COMMIT'",
		"SAVEPOINT s1", "ROLLBACK TO SAVEPOINT s1", "ROLLBACK WORK TO s1", "RELEASE SAVEPOINT s1",
		"CREATE TEMPORARY TABLE t (id INT)", "CREATE OR REPLACE TEMPORARY TABLE t (id INT)", "DROP TEMPORARY TABLE t",
		"SET @x = 'autocommit'", "SET time_zone = '+13:00'", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
		"SELECT 1 /*+ MAX_EXECUTION_TIME(5) */", "SELECT 1 --1", "KILL CONNECTION_ID()",
		"LOAD DATA LOCAL INFILE 'x' INTO TABLE t", "SELECT 1 # ; COMMIT", "SET STATEMENT max_statement_time = 1 FOR SELECT 1",
	),
	cases(sqlguard.SQLite, true,
		"COMMIT", "END", "END TRANSACTION", "ROLLBACK", "ROLLBACK TRANSACTION", "BEGIN", "BEGIN IMMEDIATE",
		"/* a */ COMMIT", "-- c\nCOMMIT", "SELECT 1; COMMIT", "SELECT [a;b]; COMMIT", "SELECT `a;b`; COMMIT",
	),
	cases(sqlguard.SQLite, false,
		"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", `SELECT 1 AS "commit"`, "SELECT 'it''s; COMMIT'",
		"SAVEPOINT s1", "ROLLBACK TO s1", "ROLLBACK TRANSACTION TO SAVEPOINT s1", "RELEASE s1", "SELECT [commit]",
		"PRAGMA foreign_keys", "SELECT 'a\\'; SELECT 1",
	),
)

func concat(parts ...[]Case) []Case {
	var out []Case
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Of returns the texts of Cases for dialect d.
func Of(d sqlguard.Dialect) []string {
	var out []string
	for _, c := range Cases {
		if c.Dialect == d {
			out = append(out, c.SQL)
		}
	}
	return out
}

// fragments are pieces chosen to confuse a lexer: quotes, escapes,
// comments, dollar quotes, prefixes, and the words that matter.
var fragments = []string{"SELECT 1", "'", "''", "E'", "e'", "\\", "\\'", "--", "-- ", "\n", "\r", " ", "/*", "*/",
	"$$", "$a$", "$1", ";", "COMMIT", "commit", "ROLLBACK", "BEGIN", "TO s", "SAVEPOINT s", "AND CHAIN", "END",
	"\"", "`", "#", "/*!", "[", "]", "B'", "X'", "U&'", "N'", "1e", "1", ".", "a", "x$", "\t", "\f", "-", "*", "/",
	"(", ")"}

// Texts returns the Cases of d followed by n random concatenations of
// 2 to 10 fragments, drawn from seed: the corpus of a differential test.
func Texts(d sqlguard.Dialect, n int, seed uint64) []string {
	out := Of(d)
	rng := rand.New(rand.NewPCG(seed, 17))
	for range n {
		var b strings.Builder
		for range 2 + rng.IntN(9) {
			b.WriteString(fragments[rng.IntN(len(fragments))])
		}
		out = append(out, b.String())
	}
	return out
}
