package idemsql

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// oddMySQLMode is a sql_mode a handler (or a DSN) may set: MariaDB's
// SIMULTANEOUS_ASSIGNMENT changes what ON DUPLICATE KEY UPDATE assignments
// see; the others change how quotes read.
const oddMySQLMode = "SIMULTANEOUS_ASSIGNMENT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,STRICT_TRANS_TABLES"

func mysqlTestDSN() string {
	if dsn := os.Getenv("IDEM_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"
}

func suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// mysqlStore opens MySQL with the DSN changed by edit, and a store on a
// fresh table.
func mysqlStore(t *testing.T, edit func(*mysqldriver.Config)) *Store {
	t.Helper()
	cfg, err := mysqldriver.ParseDSN(mysqlTestDSN())
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("mysql unreachable (IDEM_MYSQL_DSN): %v", err)
	}
	sqlDB := db
	t.Cleanup(func() { _ = sqlDB.Close() })
	s, err := New(db, WithTable("idem_int_"+suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + s.Table()) })
	return s
}

func req(key, body, token string, lease, retention time.Duration) idemstore.ClaimRequest {
	h := sha256.Sum256([]byte(body))
	return idemstore.ClaimRequest{Principal: "alice", Key: key, Fingerprint: h[:], Token: token, Nonce: "n-" + token,
		RequestID: "r-" + token, Lease: lease, Retention: retention}
}

func (s *Store) upsert(t *testing.T, r idemstore.ClaimRequest) int64 {
	t.Helper()
	n, err := s.exec(context.Background(), s.q.upsertMy, upsertMyArgs(r)...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLUpsertProof states the MySQL claim statement's answers on the
// real server, with and without clientFoundRows: inserted, replaced when
// expired (its lease deadline and its uncertain mark included), and
// unchanged (nothing written) for every other existing row — settled, live
// in progress, stale or kept in progress (that is takeStale's job), another
// fingerprint. And the token decides, whatever the count says.
//
// It runs under the default sql_mode and under one with MariaDB's
// SIMULTANEOUS_ASSIGNMENT (assignments see the old row, not the values
// assigned to their left), ANSI_QUOTES and NO_BACKSLASH_ESCAPES, with an
// odd time_zone.
func TestMySQLUpsertProof(t *testing.T) {
	for _, c := range []struct {
		foundRows bool
		mode      string
	}{{false, ""}, {true, ""}, {false, oddMySQLMode}, {true, oddMySQLMode}} {
		foundRows := c.foundRows
		t.Run(fmt.Sprintf("clientFoundRows=%v/sql_mode=%q", foundRows, c.mode), func(t *testing.T) {
			s := mysqlStore(t, func(cfg *mysqldriver.Config) {
				cfg.ClientFoundRows = foundRows
				if c.mode != "" {
					cfg.Params = map[string]string{"sql_mode": "'" + c.mode + "'", "time_zone": "'+13:00'"}
				}
			})
			ctx := context.Background()
			unchanged := int64(0)
			if foundRows {
				unchanged = 1 // the driver reports the duplicate row as "found"
			}
			key := "k-" + suffix()

			if n := s.upsert(t, req(key, "a", "t1", time.Hour, time.Hour)); n != 1 {
				t.Fatalf("insert: %d rows affected, want 1", n)
			}
			before, _ := s.Get(ctx, "alice", key)
			upserts := func(what string) {
				t.Helper()
				for _, r := range []idemstore.ClaimRequest{
					req(key, "a", "t2", time.Hour, time.Hour),       // same body
					req(key, "b", "t3", time.Hour, time.Hour),       // another fingerprint
					req(key, "a", "t4", time.Nanosecond, time.Hour), // a short lease asked for: the row's own decides
				} {
					if n := s.upsert(t, r); n != unchanged {
						t.Fatalf("upsert on a %s row (%s): %d rows affected, want %d", what, r.Token, n, unchanged)
					}
				}
				after, _ := s.Get(ctx, "alice", key)
				if after.LeaseToken != before.LeaseToken || !after.LockedAt.Equal(before.LockedAt) || after.RequestID != before.RequestID ||
					!after.LeaseExpiresAt.Equal(before.LeaseExpiresAt) || after.Uncertain != before.Uncertain {
					t.Fatalf("the %s row changed: %+v → %+v", what, before, after)
				}
			}
			upserts("live")
			// Claim agrees, whatever the count.
			res, err := s.Claim(ctx, req(key, "a", "t5", time.Nanosecond, time.Hour))
			if err != nil || res.Claimed || res.Record.LeaseToken != "t1" {
				t.Fatalf("Claim on a live row: %+v %v", res, err)
			}
			// Its lease ends: still not the upsert's business.
			if _, err := s.exec(ctx, "UPDATE "+s.dialect.qualified(s.qtable)+" SET lease_expires_at = UTC_TIMESTAMP(6) WHERE `key` = ?", key); err != nil {
				t.Fatal(err)
			}
			before, _ = s.Get(ctx, "alice", key)
			upserts("stale")
			// Kept: uncertain, its lease ended; still untouched by the upsert,
			// and taken over only by a claim that asks for it.
			if err := s.Keep(ctx, idemstore.Lease{Principal: "alice", Key: key, Token: "t1"}); err != nil {
				t.Fatal(err)
			}
			before, _ = s.Get(ctx, "alice", key)
			if !before.Uncertain {
				t.Fatalf("kept row = %+v, want uncertain", before)
			}
			upserts("kept")
			if res, err := s.Claim(ctx, req(key, "a", "t5", time.Hour, time.Hour)); err != nil || res.Claimed {
				t.Fatalf("Claim on a kept row without TakeOverUncertain: %+v %v", res, err)
			}
			ask := req(key, "a", "t6", time.Hour, time.Hour)
			ask.TakeOverUncertain = true
			res, err = s.Claim(ctx, ask)
			if err != nil || !res.Claimed || !res.Reclaimed || res.Record.LeaseToken != "t6" || !res.Record.Uncertain ||
				res.Record.Nonce != "n-t1" || res.Record.LeaseExpiresAt.Sub(res.Record.LockedAt) != time.Hour {
				t.Fatalf("Claim on a kept row with TakeOverUncertain: %+v %v", res, err)
			}

			// Settle it, then replays change nothing.
			_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: key, Token: "t6"})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
			if n := s.upsert(t, req(key, "a", "t7", time.Nanosecond, time.Hour)); n != unchanged {
				t.Fatalf("upsert on a settled row: %d rows affected, want %d", n, unchanged)
			}
			res, err = s.Claim(ctx, req(key, "a", "t8", time.Nanosecond, time.Hour))
			if err != nil || res.Claimed || res.Record.State != idemstore.StateCompleted {
				t.Fatalf("Claim on a settled row: %+v %v", res, err)
			}

			// Expired: replaced in place, all columns fresh — also a
			// completed row, whose state, status, headers and body must go.
			short := "k-" + suffix()
			if n := s.upsert(t, req(short, "a", "u1", time.Hour, 30*time.Millisecond)); n != 1 {
				t.Fatalf("insert: %d", n)
			}
			_, stx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: short, Token: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := stx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("old")}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			if n := s.upsert(t, req(short, "other body", "u2", time.Hour, time.Hour)); n != 2 {
				t.Fatalf("upsert on an expired row: %d rows affected, want 2", n)
			}
			rec, _ := s.Get(ctx, "alice", short)
			h := sha256.Sum256([]byte("other body"))
			if rec.LeaseToken != "u2" || rec.State != idemstore.StateInProgress || string(rec.Fingerprint) != string(h[:]) ||
				rec.RequestID != "r-u2" || rec.Nonce != "n-u2" || rec.Response != nil || rec.ExpiresAt.Sub(rec.LockedAt) != time.Hour ||
				rec.LeaseExpiresAt.Sub(rec.LockedAt) != time.Hour || !rec.CreatedAt.Equal(rec.LockedAt) || rec.Uncertain {
				t.Fatalf("replaced row = %+v", rec)
			}
			// An expired kept row: replaced whole, no longer uncertain, with
			// the new lease. The lease deadline and the mark are assigned
			// before expires_at, so under the default sql_mode too their
			// condition reads the old expires_at.
			kept := "k-" + suffix()
			if n := s.upsert(t, req(kept, "a", "x1", time.Hour, 30*time.Millisecond)); n != 1 {
				t.Fatalf("insert: %d", n)
			}
			if err := s.Keep(ctx, idemstore.Lease{Principal: "alice", Key: kept, Token: "x1"}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			if n := s.upsert(t, req(kept, "a", "x2", 2*time.Hour, time.Hour)); n != 2 {
				t.Fatalf("upsert on an expired kept row: %d rows affected, want 2", n)
			}
			rec, _ = s.Get(ctx, "alice", kept)
			if rec.LeaseToken != "x2" || rec.Uncertain || rec.Nonce != "n-x2" || rec.LeaseExpiresAt.Sub(rec.LockedAt) != 2*time.Hour ||
				rec.ExpiresAt.Sub(rec.LockedAt) != time.Hour {
				t.Fatalf("replaced kept row = %+v, want x2's, not uncertain, a lease of 2h and a retention of 1h", rec)
			}
			// And Claim on an expired completed row claims it whole.
			time.Sleep(10 * time.Millisecond)
			exp := "k-" + suffix()
			r1 := req(exp, "a", "v1", time.Hour, 30*time.Millisecond)
			if res, err := s.Claim(ctx, r1); err != nil || !res.Claimed {
				t.Fatalf("first claim: %+v %v", res, err)
			}
			_, vtx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: exp, Token: "v1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := vtx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("old")}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			res, err = s.Claim(ctx, req(exp, "other", "v2", time.Hour, time.Hour))
			if err != nil || !res.Claimed || res.Record.State != idemstore.StateInProgress || res.Record.Response != nil ||
				res.Record.LeaseToken != "v2" {
				t.Fatalf("claim of an expired completed row: %+v %v", res, err)
			}
			_, wtx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: exp, Token: "v2"})
			if err != nil {
				t.Fatal(err)
			}
			if err := wtx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("new")}}); err != nil {
				t.Fatalf("settle after claiming an expired row: %v", err)
			}
		})
	}
}

type pgErr string

func (e pgErr) Error() string    { return "pg " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

type liteErr int

func (e liteErr) Error() string { return fmt.Sprintf("sqlite %d", int(e)) }
func (e liteErr) Code() int     { return int(e) }

func TestTransientMapping(t *testing.T) {
	for _, c := range []struct {
		err       error
		transient bool
	}{
		{pgErr("40001"), true},
		{pgErr("40P01"), true},
		{pgErr("55P03"), true},
		{pgErr("23505"), false},
		{&mysqldriver.MySQLError{Number: 1213}, true},
		{&mysqldriver.MySQLError{Number: 1205}, true},
		{&mysqldriver.MySQLError{Number: 1062}, false},
		{liteErr(5), true},
		{liteErr(5 | 2<<8), true}, // SQLITE_BUSY_SNAPSHOT
		{liteErr(6), true},
		{liteErr(19), false},
		{errors.New("database is locked"), true},
		{errors.New("connection refused"), false},
	} {
		err := (&Store{}).wrap("op", c.err)
		if got := errors.Is(err, idemstore.ErrTransient); got != c.transient {
			t.Errorf("%v: transient = %v, want %v", c.err, got, c.transient)
		}
		if !errors.Is(err, c.err) || !strings.HasPrefix(err.Error(), "idemsql: op: ") {
			t.Errorf("%v: wrapped as %q, lost the cause or the context", c.err, err)
		}
	}
	if (&Store{}).wrap("op", nil) != nil {
		t.Error("wrap(nil) != nil")
	}
}

func TestTableNames(t *testing.T) {
	for _, c := range []struct {
		name string
		d    dialect
		ok   bool
	}{
		// PostgreSQL's are pgsql.ParseTable's (TestParseTable there).
		{"Billing.Idem", dialectPostgres, true},
		{strings.Repeat("a", pgsql.MaxTableLen+1), dialectPostgres, false},
		{"idempotency_keys", dialectMySQL, true},
		{"billing.idem", dialectMySQL, true},
		{"billing.idem", dialectSQLite, false},
		{"Idem", dialectMySQL, false},
		{"idem;drop table x", dialectMySQL, false},
		{`idem"`, dialectSQLite, false},
		{"a.b.c", dialectMySQL, false},
		{"", dialectSQLite, false},
		{"9idem", dialectMySQL, false},
		{strings.Repeat("a", 49), dialectMySQL, false},
	} {
		_, err := parseTableName(c.name, c.d)
		if (err == nil) != c.ok {
			t.Errorf("parseTableName(%q, %s) = %v, want ok=%v", c.name, c.d, err, c.ok)
		}
	}
}

func TestMigrationRendering(t *testing.T) {
	for _, d := range []dialect{dialectMySQL, dialectSQLite} {
		b, err := migrations.ReadFile("migrations/" + d.String() + ".sql")
		if err != nil {
			t.Fatal(err)
		}
		raw := string(b)
		tbl := tableName{name: "pay_idem"}
		if d != dialectSQLite {
			tbl.schema = "billing"
		}
		out := renderMigration(raw, d, tbl)
		if strings.Contains(out, DefaultTable) {
			t.Errorf("%s: default name left in the rendered migration:\n%s", d, out)
		}
		if !strings.Contains(out, d.qualified(tbl)) || !strings.Contains(out, d.quote("pay_idem_expires_idx")) {
			t.Errorf("%s: rendered migration lacks the table or index name:\n%s", d, out)
		}
		if n := len(splitStatements(out)); n < 1 || (d != dialectMySQL && n != 3) {
			t.Errorf("%s: %d statements", d, n)
		}
	}
}

// TestMySQLPurgeFillsItsBatch: a row the purge picked that is no longer
// expired when its DELETE runs (re-claimed meanwhile, or deleted by another
// purger) does not make PurgeExpired return a short batch while expired
// rows remain: the sweeper, which stops at the first short batch, would
// stop early.
func TestMySQLPurgeFillsItsBatch(t *testing.T) {
	s := mysqlStore(t, func(*mysqldriver.Config) {})
	ctx := context.Background()
	for i := range 30 {
		if _, err := s.Claim(ctx, req(fmt.Sprintf("p-%02d", i), "a", "t"+suffix(), time.Hour, time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	stolen := 0
	purgeTestHook = func(picked []any) {
		if stolen > 0 {
			return
		}
		// Another request claims the first picked key again: it is no
		// longer expired when the DELETE re-checks.
		key := string(picked[1].([]byte))
		if res, err := s.Claim(ctx, req(key, "a", "again-"+suffix(), time.Hour, time.Hour)); err != nil || !res.Claimed {
			t.Errorf("re-claim %s: %+v %v", key, res, err)
		}
		stolen++
	}
	t.Cleanup(func() { purgeTestHook = nil })
	n, err := s.PurgeExpired(ctx, 10)
	if err != nil || n != 10 || stolen != 1 {
		t.Fatalf("PurgeExpired(10) = %d, %v (stolen %d), want a full batch of 10 while 19 expired rows remain", n, err, stolen)
	}
}

// TestMySQLSessionTimeoutPath runs the path the store takes on MySQL
// (which has no SET STATEMENT) on MariaDB: the session's
// innodb_lock_wait_timeout is set before each writing statement.
func TestMySQLSessionTimeoutPath(t *testing.T) {
	s := mysqlStore(t, func(*mysqldriver.Config) {})
	s.maria = false
	s.lock = time.Second
	s.q = buildQueries(s.dialect, s.qtable, false, false, s.lock)
	if strings.Contains(s.q.upsertMy, "SET STATEMENT") {
		t.Fatal("the MySQL path still uses SET STATEMENT")
	}
	ctx := context.Background()
	r := req("m-"+suffix(), "a", "t1", time.Minute, time.Hour)
	if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	pool, err := s.pool()
	if err != nil {
		t.Fatal(err)
	}
	other, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	if _, err := other.ExecContext(ctx, "UPDATE "+s.dialect.qualified(s.qtable)+" SET state = state WHERE principal = ? AND `key` = ?", r.Principal, r.Key); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Release(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
	if took := time.Since(start); !errors.Is(err, idemstore.ErrTransient) || took > 3500*time.Millisecond {
		t.Fatalf("release under a held row: %v after %v, want a transient error within the 1s lock timeout", err, took)
	}
	_ = other.Rollback()
	_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
		t.Fatalf("settle: %v", err)
	}
}

// captureLogger is a slog.Handler that keeps every line at every level.
type captureLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *captureLogger) Enabled(context.Context, slog.Level) bool { return true }
func (l *captureLogger) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (l *captureLogger) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *captureLogger) WithGroup(string) slog.Handler      { return l }

func (l *captureLogger) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// runRequests claims n fresh keys on s and settles each.
func runRequests(t *testing.T, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		r := req("log-"+suffix(), "a", "t-"+suffix(), time.Minute, time.Hour)
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMySQLNoLogOnNormalRequests: the store's statements (the marker table
// created on each new connection among them, which fails once with 1146
// by design) never reach the store's logger, even at Info.
func TestMySQLNoLogOnNormalRequests(t *testing.T) {
	capture := &captureLogger{}
	db, err := sql.Open("mysql", mysqlTestDSN())
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := db
	sqlDB.SetMaxIdleConns(0) // every request on a new connection
	t.Cleanup(func() { _ = sqlDB.Close() })
	s, err := New(db, WithTable("idem_log_"+suffix()), WithLogger(slog.New(capture)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + s.Table()) })
	runRequests(t, s, 5)
	if lines := capture.all(); len(lines) != 0 {
		t.Fatalf("the store logged on normal requests:\n%s", strings.Join(lines, "\n"))
	}
	if !s.Guarded() {
		t.Fatal("root lost the marker guard")
	}
}

// TestMySQLMarkerRefusedSaysSoOnce: a database user without CREATE
// TEMPORARY TABLES cannot have the marker: the store goes on unguarded,
// says so once in the log, and Guarded reports it.
func TestMySQLMarkerRefusedSaysSoOnce(t *testing.T) {
	root, err := sql.Open("mysql", mysqlTestDSN())
	if err != nil {
		t.Fatal(err)
	}
	rootDB := root
	t.Cleanup(func() { _ = rootDB.Close() })
	cfg, err := mysqldriver.ParseDSN(mysqlTestDSN())
	if err != nil {
		t.Fatal(err)
	}
	table := "idem_nt_" + suffix()
	for _, q := range []string{
		"CREATE USER IF NOT EXISTS 'idem_notemp'@'%'",
		"CREATE USER IF NOT EXISTS 'idem_notemp'@'localhost'",
		"CREATE TABLE " + table + " (x INT)", // placeholder so GRANT names an existing table
	} {
		if err := execErr(root, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP TABLE IF EXISTS " + table) })
	if err := execErr(root, "DROP TABLE "+table); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"%", "localhost"} {
		if err := execErr(root, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP ON `%s`.* TO 'idem_notemp'@'%s'", cfg.DBName, host)); err != nil {
			t.Fatal(err)
		}
		if err := execErr(root, fmt.Sprintf("REVOKE CREATE TEMPORARY TABLES ON `%s`.* FROM 'idem_notemp'@'%s'", cfg.DBName, host)); err != nil &&
			!strings.Contains(err.Error(), "1141") {
			t.Fatal(err)
		}
	}
	cfg.User, cfg.Passwd = "idem_notemp", ""
	capture := &captureLogger{}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := db
	sqlDB.SetMaxIdleConns(0)
	t.Cleanup(func() { _ = sqlDB.Close() })
	s, err := New(db, WithTable(table), WithLogger(slog.New(capture)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	runRequests(t, s, 4)
	if s.Guarded() {
		t.Fatal("Guarded with the marker refused")
	}
	var warns []string
	for _, l := range capture.all() {
		if strings.Contains(l, "marker") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.HasPrefix(warns[0], "WARN ") {
		t.Fatalf("the store said %d times that the marker is off (want once, as a warning):\n%s", len(warns), strings.Join(capture.all(), "\n"))
	}
}

func TestMariaReturning(t *testing.T) {
	for _, c := range []struct {
		version string
		want    bool
	}{
		{"10.11.6-MariaDB-0+deb12u1", true},
		{"10.5.0-MariaDB", true},
		{"11.4.2-MariaDB", true},
		{"10.4.32-MariaDB", false},
		{"5.5.5-10.11.6-MariaDB", false}, // the old handshake prefix: not trusted
		{"garbage", false},
	} {
		if got := mariaReturning(c.version); got != c.want {
			t.Errorf("mariaReturning(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}

// TestMariaDBClaimReturning runs the one-statement claim of MariaDB 10.5+
// (the upsert returning its row) beside the two-statement one (the upsert,
// then a SELECT) on the same rows: a fresh key, a live one, a settled one
// and an expired one. Both must return the same claim and the same record.
func TestMariaDBClaimReturning(t *testing.T) {
	s := mysqlStore(t, func(*mysqldriver.Config) {})
	if !s.maria || s.q.upsertMyRet == "" {
		t.Skip("not MariaDB 10.5+")
	}
	oneStmt := s.q.upsertMyRet
	ctx := context.Background()
	check := func(name string, r idemstore.ClaimRequest, claimed bool, token string) idemstore.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, r)
		if err != nil || res.Claimed != claimed || res.Record.LeaseToken != token {
			t.Fatalf("%s: %+v %v, want claimed %v with token %s", name, res, err, claimed, token)
		}
		got, err := s.Get(ctx, r.Principal, r.Key)
		if err != nil || got.LeaseToken != res.Record.LeaseToken || !got.ExpiresAt.Equal(res.Record.ExpiresAt) ||
			!got.LeaseExpiresAt.Equal(res.Record.LeaseExpiresAt) || got.Uncertain != res.Record.Uncertain ||
			!got.CreatedAt.Equal(res.Record.CreatedAt) || got.State != res.Record.State || got.Nonce != res.Record.Nonce {
			t.Fatalf("%s: the claim answered %+v, the table holds %+v (%v)", name, res.Record, got, err)
		}
		if res.Now.Before(res.Record.CreatedAt) {
			t.Fatalf("%s: now %v before created_at %v", name, res.Now, res.Record.CreatedAt)
		}
		return res
	}
	for _, q := range []string{oneStmt, ""} {
		s.q.upsertMyRet = q
		key := "rt-" + suffix()
		check("fresh", req(key, "a", "t1", time.Hour, time.Hour), true, "t1")
		check("live", req(key, "a", "t2", time.Hour, time.Hour), false, "t1")
		_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: key, Token: "t1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
			t.Fatal(err)
		}
		if res := check("settled", req(key, "a", "t3", time.Hour, time.Hour), false, "t1"); res.Record.State != idemstore.StateCompleted {
			t.Fatalf("settled: state %s", res.Record.State)
		}
		short := "rt-" + suffix()
		check("short", req(short, "a", "u1", time.Hour, 20*time.Millisecond), true, "u1")
		time.Sleep(40 * time.Millisecond)
		check("expired", req(short, "b", "u2", time.Hour, time.Hour), true, "u2")
	}
}

// TestMySQLMarkerToken settles under lease tokens that a quoted literal
// would have to escape, with and without NO_BACKSLASH_ESCAPES: the marker,
// written as a hex literal, must hold the token byte for byte, or the
// settle's marker check matches nothing.
func TestMySQLMarkerToken(t *testing.T) {
	for _, mode := range []string{"", oddMySQLMode} {
		s := mysqlStore(t, func(cfg *mysqldriver.Config) {
			if mode != "" {
				cfg.Params = map[string]string{"sql_mode": "'" + mode + "'"}
			}
		})
		if !s.Guarded() {
			t.Skip("no marker: the server refused the temporary table")
		}
		ctx := context.Background()
		for _, token := range []string{"plain", `it's`, `back\slash`, `x'; DROP TABLE t; --`, "ünï\x00"} {
			key := "mk-" + suffix()
			if res, err := s.Claim(ctx, req(key, "a", token, time.Hour, time.Hour)); err != nil || !res.Claimed {
				t.Fatalf("sql_mode %q, token %q: claim %+v %v", mode, token, res, err)
			}
			_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: "alice", Key: key, Token: token})
			if err != nil {
				t.Fatalf("sql_mode %q, token %q: %v", mode, token, err)
			}
			if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
				t.Fatalf("sql_mode %q, token %q: settle: %v", mode, token, err)
			}
		}
	}
}

// sqliteStore opens a fresh SQLite file and a migrated store on it.
func sqliteStore(t *testing.T) *Store {
	t.Helper()
	db, err := sql.Open("sqlite", SQLiteDSN(t.TempDir()+"/idem.db", 0))
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := db
	t.Cleanup(func() { _ = sqlDB.Close() })
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSQLiteClaimRecord checks the record a SQLite claim builds from its
// INSERT's answer (the clock and the token) against the row the table
// holds, column by column, for several leases and retentions.
func TestSQLiteClaimRecord(t *testing.T) {
	s := sqliteStore(t)
	ctx := context.Background()
	for i, retention := range []time.Duration{time.Millisecond, 1234567 * time.Microsecond, 24 * time.Hour, 400 * 24 * time.Hour} {
		r := req(fmt.Sprint("lite-", i), fmt.Sprint("body ", i), fmt.Sprint("t", i), retention/2, retention)
		res, err := s.Claim(ctx, r)
		if err != nil || !res.Claimed {
			t.Fatalf("retention %v: %+v %v", retention, res, err)
		}
		got, err := s.Get(ctx, r.Principal, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		want := res.Record
		if got.Principal != want.Principal || got.Key != want.Key || string(got.Fingerprint) != string(want.Fingerprint) ||
			got.State != want.State || got.LeaseToken != want.LeaseToken || got.RequestID != want.RequestID ||
			got.Nonce != want.Nonce || !got.CreatedAt.Equal(want.CreatedAt) || !got.LockedAt.Equal(want.LockedAt) ||
			!got.ExpiresAt.Equal(want.ExpiresAt) || !got.LeaseExpiresAt.Equal(want.LeaseExpiresAt) ||
			got.Uncertain || want.Uncertain || got.Response != nil || want.Response != nil {
			t.Fatalf("retention %v: the claim answered\n%+v\nthe table holds\n%+v", retention, want, got)
		}
		if !res.Now.Equal(got.CreatedAt) {
			t.Fatalf("retention %v: now %v, created_at %v", retention, res.Now, got.CreatedAt)
		}
	}
}

// TestTakeoverRechecksWhatKeepChanges: Keep changes the uncertain mark and
// the lease deadline under the holder's token, so a Keep that lands
// between Claim's read of a stale record and its takeover leaves the
// token and the fingerprint the takeover is fenced by as they were. Only
// the takeover's own re-check of the mark keeps a claim without
// TakeOverUncertain from taking the kept record over: here the read and
// the takeover are run apart, with the Keep between them, on every dialect.
// The takeover re-checks the lease deadline the same way.
func TestTakeoverRechecksWhatKeepChanges(t *testing.T) {
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			var s *Store
			switch d {
			case "postgres":
				s, _ = pgStore(t, 4)
			case "mysql":
				s = mysqlStore(t, func(*mysqldriver.Config) {})
			default:
				s = sqliteStore(t)
			}
			ctx := context.Background()
			held := req("race-"+suffix(), "a", "t1", 20*time.Millisecond, time.Hour)
			if res, err := s.Claim(ctx, held); err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			time.Sleep(40 * time.Millisecond)
			seen, ok, err := s.queryRow(ctx, true, s.q.selectNow, held.Principal, held.Key)
			if err != nil || !ok || seen.rec.Uncertain || seen.now.Before(seen.rec.LeaseExpiresAt) {
				t.Fatalf("the read: %+v %v %v, want a stale record, not uncertain", seen, ok, err)
			}
			if err := s.Keep(ctx, idemstore.Lease{Principal: held.Principal, Key: held.Key, Token: held.Token}); err != nil {
				t.Fatal(err)
			}
			next := req(held.Key, "a", "t2", time.Hour, time.Hour)
			takeover := func(takeOverUncertain bool) bool {
				t.Helper()
				next.TakeOverUncertain = takeOverUncertain
				query, args := s.takeoverStmt(takeStale, next, seen.rec.LeaseToken)
				_, ok, err := s.takeover(ctx, query, args, next)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			if takeover(false) {
				t.Fatal("a takeover without TakeOverUncertain, read before the Keep, took the kept record over")
			}
			if rec, err := s.Get(ctx, held.Principal, held.Key); err != nil || rec.LeaseToken != "t1" || !rec.Uncertain {
				t.Fatalf("after the refused takeover: %+v %v, want t1's, uncertain", rec, err)
			}
			if !takeover(true) {
				t.Fatal("a takeover with TakeOverUncertain did not take the kept record over")
			}
			if rec, err := s.Get(ctx, held.Principal, held.Key); err != nil || rec.LeaseToken != "t2" || !rec.Uncertain || rec.Nonce != "n-t1" {
				t.Fatalf("after the takeover: %+v %v, want t2's, uncertain, with t1's nonce", rec, err)
			}
			// And the lease deadline is the statement's own condition too: the
			// record it now holds has an hour left, whatever the claim asks.
			next = req(held.Key, "a", "t3", time.Nanosecond, time.Hour)
			seen.rec.LeaseToken = "t2"
			if takeover(true) {
				t.Fatal("a takeover of a record whose lease has an hour left took it over")
			}
		})
	}
}

// execErr runs q on db and returns its error.
func execErr(db *sql.DB, q string, args ...any) error {
	_, err := db.Exec(q, args...)
	return err
}
