package idemsql

import (
	"strings"
	"testing"
)

func TestFilterRefuses(t *testing.T) {
	refused := map[dialect][]string{
		dialectPostgres: {
			"COMMIT", "commit work", "END", "end transaction", "ROLLBACK", "ABORT", "COMMIT AND CHAIN",
			"ROLLBACK AND NO CHAIN", "PREPARE TRANSACTION 'x'", "BEGIN", "START TRANSACTION", "COMMIT PREPARED 'x'",
			"ROLLBACK PREPARED 'x'", "/* a */ COMMIT", "/* nested /* comment */ still */ COMMIT", "-- c\nCOMMIT",
			"  \n\tCoMmIt  ;", "SELECT 1; COMMIT", "SELECT 'a;b'; commit; SELECT 1", `SELECT '\'; COMMIT; --'`,
			`SELECT $q$x$q$; COMMIT`, `SELECT $$a$$;COMMIT`, `SELECT "a""b"; COMMIT`, "ROLLBACK WORK", "ROLLBACK TRANSACTION",
			"SELECT 1;;;COMMIT", "SELECT U&'x'; COMMIT", "SELECT E'\\\\'; COMMIT",
			// Read with standard_conforming_strings off, '\' opens a string
			// that the second quote closes; on, it is a string and a
			// COMMIT: refused whichever the session says.
			`SELECT 'a\'; COMMIT; SELECT '1'`,
		},
		dialectMySQL: {
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
			// identifier. inspect, without the session, refuses.
			`SELECT 'a\'; COMMIT; SELECT '1'`, `SELECT "a\"; COMMIT; SELECT "1"`,
		},
		dialectSQLite: {
			"COMMIT", "END", "END TRANSACTION", "ROLLBACK", "ROLLBACK TRANSACTION", "BEGIN", "BEGIN IMMEDIATE",
			"/* a */ COMMIT", "-- c\nCOMMIT", "SELECT 1; COMMIT", "SELECT [a;b]; COMMIT", "SELECT `a;b`; COMMIT",
		},
	}
	for d, qs := range refused {
		for _, q := range qs {
			if v := inspect(d, q); v.refused == "" {
				t.Errorf("%s: %q was let through", d, q)
			}
		}
	}
}

func TestFilterLetsThrough(t *testing.T) {
	allowed := map[dialect][]string{
		dialectPostgres: {
			"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", "SELECT $$;COMMIT;$$", `SELECT 1 AS "commit"`,
			`SELECT E'\';COMMIT;--'`, "SELECT 'it''s; COMMIT'", "SAVEPOINT s1", "ROLLBACK TO SAVEPOINT s1",
			"ROLLBACK TO s1", "ROLLBACK WORK TO SAVEPOINT s1", "RELEASE SAVEPOINT s1", "RELEASE s1",
			"SET LOCAL application_name = 'commit'", "SELECT $tag$ COMMIT $tag$", "SELECT a$b$c FROM t",
			"INSERT INTO t VALUES ($1, $2)", "PREPARE p AS SELECT 1", "-- COMMIT", "/* COMMIT", "SELECT 1 -- ; COMMIT",
			"DO $$ BEGIN COMMIT; END $$", "SELECT 'x' -- '\n; SELECT 1",
		},
		dialectMySQL: {
			"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", "SELECT 1 AS `commit`", "SELECT 'it''s; COMMIT'",
			"SAVEPOINT s1", "ROLLBACK TO SAVEPOINT s1", "ROLLBACK WORK TO s1", "RELEASE SAVEPOINT s1",
			"CREATE TEMPORARY TABLE t (id INT)", "CREATE OR REPLACE TEMPORARY TABLE t (id INT)", "DROP TEMPORARY TABLE t",
			"SET @x = 'autocommit'", "SET time_zone = '+13:00'", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
			"SELECT 1 /*+ MAX_EXECUTION_TIME(5) */", "SELECT 1 --1", "KILL CONNECTION_ID()",
			"LOAD DATA LOCAL INFILE 'x' INTO TABLE t", "SELECT 1 # ; COMMIT", "SET STATEMENT max_statement_time = 1 FOR SELECT 1",
		},
		dialectSQLite: {
			"SELECT 'COMMIT'", "SELECT 1 /* ; COMMIT */", `SELECT 1 AS "commit"`, "SELECT 'it''s; COMMIT'",
			"SAVEPOINT s1", "ROLLBACK TO s1", "ROLLBACK TRANSACTION TO SAVEPOINT s1", "RELEASE s1", "SELECT [commit]",
			"PRAGMA foreign_keys", "SELECT 'a\\'; SELECT 1",
		},
	}
	for d, qs := range allowed {
		for _, q := range qs {
			if v := inspect(d, q); v.refused != "" {
				t.Errorf("%s: %q refused: %s", d, q, v.refused)
			}
		}
	}
}

func TestFilterSavepoints(t *testing.T) {
	for _, c := range []struct {
		d    dialect
		q    string
		kind stmtKind
		name string
	}{
		{dialectPostgres, "SAVEPOINT Sp1", stmtSavepoint, "sp1"},
		{dialectPostgres, `SAVEPOINT "Sp1"`, stmtSavepoint, "Sp1"},
		{dialectPostgres, "ROLLBACK TO SAVEPOINT sp1", stmtRollbackTo, "sp1"},
		{dialectPostgres, "rollback transaction to sp1", stmtRollbackTo, "sp1"},
		{dialectPostgres, "RELEASE sp1", stmtRelease, "sp1"},
		{dialectMySQL, "SAVEPOINT `Sp1`", stmtSavepoint, "sp1"},
		{dialectMySQL, "ROLLBACK WORK TO SAVEPOINT SP1", stmtRollbackTo, "sp1"},
		{dialectSQLite, "ROLLBACK TO [sp1]", stmtRollbackTo, "sp1"},
	} {
		v := inspect(c.d, c.q)
		if v.refused != "" || len(v.ops) != 1 || v.ops[0].kind != c.kind || v.ops[0].name != c.name || !v.single {
			t.Errorf("%s %q: %+v, want one %d %q", c.d, c.q, v, c.kind, c.name)
		}
	}
	if v := inspect(dialectPostgres, "SAVEPOINT a; SELECT 1"); v.single || len(v.ops) != 1 {
		t.Errorf("two statements read as %+v", v)
	}
}

func TestFilterDirty(t *testing.T) {
	for _, c := range []struct {
		d     dialect
		q     string
		dirty bool
	}{
		{dialectPostgres, "SET search_path TO x", true},
		{dialectPostgres, "SET LOCAL search_path TO x", false},
		{dialectPostgres, "SELECT set_config('search_path', 'x', false)", true},
		{dialectPostgres, "CREATE TEMP TABLE t (id int)", true},
		{dialectPostgres, "SELECT 1", false},
		{dialectMySQL, "SET sql_mode = ''", true},
		{dialectMySQL, "USE other", true},
		{dialectMySQL, "CREATE TEMPORARY TABLE t (id INT)", true},
		{dialectSQLite, "PRAGMA recursive_triggers = ON", true},
		{dialectSQLite, "INSERT INTO t VALUES (1)", false},
	} {
		if v := inspect(c.d, c.q); v.dirty != c.dirty {
			t.Errorf("%s %q: dirty %v, want %v", c.d, c.q, v.dirty, c.dirty)
		}
	}
}

// FuzzFilter: inspect never panics, and whatever follows a COMMIT (or
// precedes it after a statement boundary the lexer cannot miss) cannot
// hide it.
func FuzzFilter(f *testing.F) {
	for _, s := range []string{"SELECT 1", "'", "\"", "`", "$$", "$a$", "/*", "--", "#", "/*!", "E'\\'", "[", "U&'",
		"SELECT 'a\\'; COMMIT", "ROLLBACK TO s", "SET autocommit=1", "/* /* */"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		for _, d := range []dialect{dialectPostgres, dialectMySQL, dialectSQLite} {
			_ = inspect(d, q)
			for _, m := range d.readings() {
				for _, st := range lex(d, m, q) {
					for _, tok := range st {
						if tok.kind == tokWord && tok.text != strings.ToUpper(tok.text) {
							t.Fatalf("word %q not upper-cased", tok.text)
						}
					}
				}
			}
			if v := inspect(d, "COMMIT;"+q); v.refused == "" {
				t.Fatalf("%s: COMMIT;%q let through", d, q)
			}
			if v := inspect(d, "ROLLBACK;"+q); v.refused == "" {
				t.Fatalf("%s: ROLLBACK;%q let through", d, q)
			}
		}
	})
}
