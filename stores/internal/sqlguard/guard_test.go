package sqlguard_test

import (
	"testing"

	"github.com/idemgo/idem/stores/internal/sqlguard"
	"github.com/idemgo/idem/stores/internal/sqlguard/guardtest"
)

func TestCases(t *testing.T) {
	for _, c := range guardtest.Cases {
		words, got := sqlguard.TxControl(c.Dialect, c.SQL)
		if got != c.Refused {
			t.Errorf("%s: TxControl(%q) = %v (%q), want %v", c.Dialect, c.SQL, got, words, c.Refused)
		}
		if got && words == "" && c.SQL != "" {
			t.Errorf("%s: TxControl(%q) found no words to name", c.Dialect, c.SQL)
		}
		if v := sqlguard.Inspect(c.Dialect, c.SQL); (v.Refused != "") != c.Refused {
			t.Errorf("%s: Inspect(%q) refused %q, want refused %v", c.Dialect, c.SQL, v.Refused, c.Refused)
		}
	}
}

// TestReadings shows that each reading of backslashes and quotes matters:
// a guard with only one of them misses one of these.
func TestReadings(t *testing.T) {
	pg, my := sqlguard.PostgreSQL.Readings(), sqlguard.MySQL.Readings()
	for _, c := range []struct {
		d    sqlguard.Dialect
		sql  string
		want []bool // refused under each of d.Readings()
	}{
		{sqlguard.PostgreSQL, `SELECT '\'; COMMIT; --'`, []bool{true, false}},
		{sqlguard.PostgreSQL, `SELECT 'a\''; COMMIT; --'`, []bool{false, true}},
		{sqlguard.PostgreSQL, `SELECT E'\'; COMMIT; --'`, []bool{false, false}},
		{sqlguard.PostgreSQL, "SELECT 1; COMMIT", []bool{true, true}},
		{sqlguard.MySQL, `SELECT 'a\'; COMMIT; SELECT '1'`, []bool{false, true, false, true}},
		{sqlguard.MySQL, `SELECT "a\"; COMMIT; SELECT "1"`, []bool{false, true, true, true}},
		{sqlguard.MySQL, "SELECT `a\\`; COMMIT", []bool{true, true, true, true}},
	} {
		rs := pg
		if c.d == sqlguard.MySQL {
			rs = my
		}
		for i, r := range rs {
			if got := sqlguard.Read(c.d, r, c.sql).Refused != ""; got != c.want[i] {
				t.Errorf("%s %+v: Read(%q) refused %v, want %v", c.d, r, c.sql, got, c.want[i])
			}
		}
	}
	if n := len(sqlguard.SQLite.Readings()); n != 1 {
		t.Errorf("SQLite has %d readings, want 1", n)
	}
}

func TestSavepoints(t *testing.T) {
	for _, c := range []struct {
		d    sqlguard.Dialect
		q    string
		kind sqlguard.OpKind
		name string
	}{
		{sqlguard.PostgreSQL, "SAVEPOINT Sp1", sqlguard.Savepoint, "sp1"},
		{sqlguard.PostgreSQL, `SAVEPOINT "Sp1"`, sqlguard.Savepoint, "Sp1"},
		{sqlguard.PostgreSQL, `SAVEPOINT "a""b"`, sqlguard.Savepoint, `a"b`},
		{sqlguard.PostgreSQL, `SAVEPOINT U&"Sp1"`, sqlguard.Savepoint, "Sp1"},
		{sqlguard.PostgreSQL, "ROLLBACK TO SAVEPOINT sp1", sqlguard.RollbackTo, "sp1"},
		{sqlguard.PostgreSQL, "rollback transaction to sp1", sqlguard.RollbackTo, "sp1"},
		{sqlguard.PostgreSQL, "RELEASE sp1", sqlguard.Release, "sp1"},
		{sqlguard.PostgreSQL, "release savepoint SP1", sqlguard.Release, "sp1"},
		{sqlguard.MySQL, "SAVEPOINT `Sp1`", sqlguard.Savepoint, "sp1"},
		{sqlguard.MySQL, "ROLLBACK WORK TO SAVEPOINT SP1", sqlguard.RollbackTo, "sp1"},
		{sqlguard.SQLite, "ROLLBACK TO [sp1]", sqlguard.RollbackTo, "sp1"},
		{sqlguard.SQLite, `RELEASE "Sp1"`, sqlguard.Release, "sp1"},
	} {
		v := sqlguard.Inspect(c.d, c.q)
		if v.Refused != "" || len(v.Ops) != 1 || v.Ops[0].Kind != c.kind || v.Ops[0].Name != c.name || !v.Single {
			t.Errorf("%s %q: %+v, want one %d %q", c.d, c.q, v, c.kind, c.name)
		}
		if _, bad := sqlguard.TxControl(c.d, c.q); bad {
			t.Errorf("%s %q: TxControl refuses a savepoint statement", c.d, c.q)
		}
	}
	if v := sqlguard.Inspect(sqlguard.PostgreSQL, "SAVEPOINT a; SELECT 1"); v.Single || len(v.Ops) != 1 {
		t.Errorf("two statements read as %+v", v)
	}
	if v := sqlguard.Inspect(sqlguard.PostgreSQL, "SELECT 1"); !v.Single || v.Ops != nil || v.Refused != "" || v.Dirty {
		t.Errorf("SELECT 1 read as %+v", v)
	}
}

// TestAmbiguous: where the readings disagree on savepoints or statements
// but none ends the transaction, Inspect refuses (a store tracking
// savepoints could not follow them) and TxControl does not (nothing ends
// the transaction); Agreed reports the disagreement, so that a store that
// knows its session's reading can follow that one.
func TestAmbiguous(t *testing.T) {
	for _, c := range []struct {
		d sqlguard.Dialect
		q string
	}{
		{sqlguard.PostgreSQL, `SELECT '\'; SAVEPOINT x; --'`},
		{sqlguard.PostgreSQL, `SELECT '\'; SELECT 1; --'`},
		{sqlguard.MySQL, `SELECT 'a\'; RELEASE SAVEPOINT x; SELECT '1'`},
	} {
		if v := sqlguard.Inspect(c.d, c.q); v.Refused == "" {
			t.Errorf("%s: Inspect(%q) = %+v, want refused", c.d, c.q, v)
		}
		if _, bad := sqlguard.TxControl(c.d, c.q); bad {
			t.Errorf("%s: TxControl(%q) refused", c.d, c.q)
		}
		vs := sqlguard.ReadAll(c.d, c.q)
		if _, ok := sqlguard.Agreed(vs); ok {
			t.Errorf("%s: Agreed(%q) = true", c.d, c.q)
		}
		if vs[0].Refused != "" {
			t.Errorf("%s: the default reading of %q refused: %+v", c.d, c.q, vs[0])
		}
	}
	// One reading refuses, the other does not: Inspect refuses with the
	// refusing reading's reason.
	if v := sqlguard.Inspect(sqlguard.PostgreSQL, `SELECT '\'; COMMIT; --'`); v.Refused != "COMMIT ends or commits the transaction" {
		t.Errorf("Inspect refused with %q", v.Refused)
	}
	if _, ok := sqlguard.Agreed(nil); !ok {
		t.Error("no readings do not agree")
	}
}

func TestDirty(t *testing.T) {
	for _, c := range []struct {
		d     sqlguard.Dialect
		q     string
		dirty bool
	}{
		{sqlguard.PostgreSQL, "SET search_path TO x", true},
		{sqlguard.PostgreSQL, "SET LOCAL search_path TO x", false},
		{sqlguard.PostgreSQL, "SET CONSTRAINTS ALL DEFERRED", false},
		{sqlguard.PostgreSQL, "SELECT set_config('search_path', 'x', false)", true},
		{sqlguard.PostgreSQL, "CREATE TEMP TABLE t (id int)", true},
		{sqlguard.PostgreSQL, "LISTEN x", true},
		{sqlguard.PostgreSQL, "SELECT 1", false},
		{sqlguard.PostgreSQL, "SELECT 1; SET x.y = 1", true},
		{sqlguard.MySQL, "SET sql_mode = ''", true},
		{sqlguard.MySQL, "USE other", true},
		{sqlguard.MySQL, "CREATE TEMPORARY TABLE t (id INT)", true},
		{sqlguard.SQLite, "PRAGMA recursive_triggers = ON", true},
		{sqlguard.SQLite, "INSERT INTO t VALUES (1)", false},
	} {
		if v := sqlguard.Inspect(c.d, c.q); v.Dirty != c.dirty {
			t.Errorf("%s %q: dirty %v, want %v", c.d, c.q, v.Dirty, c.dirty)
		}
	}
	// A refused query keeps what the statements before it left behind.
	if v := sqlguard.Inspect(sqlguard.PostgreSQL, "SET search_path TO x; COMMIT"); v.Refused == "" || !v.Dirty {
		t.Errorf("SET; COMMIT read as %+v", v)
	}
}

func TestRefusalText(t *testing.T) {
	for _, c := range []struct {
		d           sqlguard.Dialect
		q           string
		words, text string
	}{
		{sqlguard.PostgreSQL, "Rollback And Chain", "rollback and chain", "ROLLBACK ends or commits the transaction"},
		{sqlguard.PostgreSQL, "SELECT 1; commit work", "commit work", "COMMIT ends or commits the transaction"},
		{sqlguard.PostgreSQL, "ROLLBACK(", "rollback", "ROLLBACK ends or commits the transaction"},
		{sqlguard.MySQL, "SET @a = 1, AutoCommit = 1", "set", "SET autocommit ends or commits the transaction, or changes how the store's COMMIT ends it"},
	} {
		words, _ := sqlguard.TxControl(c.d, c.q)
		if words != c.words {
			t.Errorf("%s: TxControl(%q) words %q, want %q", c.d, c.q, words, c.words)
		}
		if v := sqlguard.Inspect(c.d, c.q); v.Refused != c.text {
			t.Errorf("%s: Inspect(%q) refused %q, want %q", c.d, c.q, v.Refused, c.text)
		}
	}
}

func TestMentionsQuoting(t *testing.T) {
	for q, want := range map[string]bool{
		"SET SESSION sql_mode = 'ANSI_QUOTES'": true, "set standard_conforming_strings = off": true,
		"SELECT set_config('standard_conforming_strings', 'off', false)": true, "SELECT 1": false,
	} {
		if got := sqlguard.MentionsQuoting(q); got != want {
			t.Errorf("MentionsQuoting(%q) = %v, want %v", q, got, want)
		}
	}
}

func TestDialectString(t *testing.T) {
	for d, want := range map[sqlguard.Dialect]string{sqlguard.PostgreSQL: "postgres", sqlguard.MySQL: "mysql",
		sqlguard.SQLite: "sqlite", 9: "Dialect(9)"} {
		if got := d.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", d, got, want)
		}
	}
}

// BenchmarkTxControl is what the pgx handle pays per statement a handler
// sends: a typical single INSERT, and a text with literals and comments.
func BenchmarkTxControl(b *testing.B) {
	for name, q := range map[string]string{
		"insert":  "INSERT INTO payments (id, account, amount, currency, description) VALUES ($1, $2, $3, $4, $5)",
		"literal": "SELECT 'a;b', $$COMMIT$$ /* ; */ FROM t WHERE x = E'\\'' -- c\n AND y = 1",
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, bad := sqlguard.TxControl(sqlguard.PostgreSQL, q); bad {
					b.Fatal("refused")
				}
			}
		})
	}
}
