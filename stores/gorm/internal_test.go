package idemgorm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
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
	db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("mysql unreachable (IDEM_MYSQL_DSN): %v", err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { _ = sqlDB.Close() })
	s, err := New(db, WithTable("idem_int_"+suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + s.Table()) })
	return s
}

func req(key, body, token string, lease, retention time.Duration) idem.ClaimRequest {
	h := sha256.Sum256([]byte(body))
	return idem.ClaimRequest{Principal: "alice", Key: key, Fingerprint: h[:], Token: token,
		RequestID: "r-" + token, Lease: lease, Retention: retention}
}

func (s *Store) upsert(t *testing.T, r idem.ClaimRequest) int64 {
	t.Helper()
	ret := r.Retention.Microseconds()
	n, err := s.exec(context.Background(), s.q.upsertMy, r.Principal, r.Key, r.Fingerprint, r.Token, r.RequestID, ret,
		r.Token, r.Fingerprint, r.RequestID, ret)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLUpsertProof states the MySQL claim statement's answers on the
// real server, with and without clientFoundRows: inserted, replaced when
// expired, and unchanged (nothing written) for every other existing row —
// settled, live in progress, stale in progress (that is takeStale's job),
// another fingerprint. And the token decides, whatever the count says.
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
			for _, r := range []idem.ClaimRequest{
				req(key, "a", "t2", time.Hour, time.Hour),       // live in progress, same body
				req(key, "b", "t3", time.Hour, time.Hour),       // another fingerprint
				req(key, "a", "t4", time.Nanosecond, time.Hour), // stale lease: not the upsert's business
			} {
				if n := s.upsert(t, r); n != unchanged {
					t.Fatalf("upsert on a live row (%s): %d rows affected, want %d", r.Token, n, unchanged)
				}
			}
			after, _ := s.Get(ctx, "alice", key)
			if after.LeaseToken != "t1" || !after.LockedAt.Equal(before.LockedAt) || after.RequestID != before.RequestID {
				t.Fatalf("the row changed: %+v → %+v", before, after)
			}
			// Claim agrees, whatever the count.
			res, err := s.Claim(ctx, req(key, "a", "t5", time.Hour, time.Hour))
			if err != nil || res.Claimed || res.Record.LeaseToken != "t1" {
				t.Fatalf("Claim on a live row: %+v %v", res, err)
			}
			time.Sleep(60 * time.Millisecond)
			res, err = s.Claim(ctx, req(key, "a", "t6", 50*time.Millisecond, time.Hour))
			if err != nil || !res.Claimed || !res.Reclaimed || res.Record.LeaseToken != "t6" {
				t.Fatalf("Claim on a stale row: %+v %v", res, err)
			}

			// Settle it, then replays change nothing.
			_, tx, err := s.BeginTx(ctx, idem.Lease{Principal: "alice", Key: key, Token: "t6"})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, idem.Outcome{State: idem.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
			if n := s.upsert(t, req(key, "a", "t7", time.Nanosecond, time.Hour)); n != unchanged {
				t.Fatalf("upsert on a settled row: %d rows affected, want %d", n, unchanged)
			}
			res, err = s.Claim(ctx, req(key, "a", "t8", time.Nanosecond, time.Hour))
			if err != nil || res.Claimed || res.Record.State != idem.StateCompleted {
				t.Fatalf("Claim on a settled row: %+v %v", res, err)
			}

			// Expired: replaced in place, all columns fresh — also a
			// completed row, whose state, status, headers and body must go.
			short := "k-" + suffix()
			if n := s.upsert(t, req(short, "a", "u1", time.Hour, 30*time.Millisecond)); n != 1 {
				t.Fatalf("insert: %d", n)
			}
			_, stx, err := s.BeginTx(ctx, idem.Lease{Principal: "alice", Key: short, Token: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := stx.Settle(ctx, idem.Outcome{State: idem.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("old")}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			if n := s.upsert(t, req(short, "other body", "u2", time.Hour, time.Hour)); n != 2 {
				t.Fatalf("upsert on an expired row: %d rows affected, want 2", n)
			}
			rec, _ := s.Get(ctx, "alice", short)
			h := sha256.Sum256([]byte("other body"))
			if rec.LeaseToken != "u2" || rec.State != idem.StateInProgress || string(rec.Fingerprint) != string(h[:]) ||
				rec.RequestID != "r-u2" || rec.Response != nil || rec.ExpiresAt.Sub(rec.LockedAt) != time.Hour ||
				!rec.CreatedAt.Equal(rec.LockedAt) {
				t.Fatalf("replaced row = %+v", rec)
			}
			// And Claim on an expired completed row claims it whole.
			time.Sleep(10 * time.Millisecond)
			exp := "k-" + suffix()
			r1 := req(exp, "a", "v1", time.Hour, 30*time.Millisecond)
			if res, err := s.Claim(ctx, r1); err != nil || !res.Claimed {
				t.Fatalf("first claim: %+v %v", res, err)
			}
			_, vtx, err := s.BeginTx(ctx, idem.Lease{Principal: "alice", Key: exp, Token: "v1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := vtx.Settle(ctx, idem.Outcome{State: idem.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("old")}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			res, err = s.Claim(ctx, req(exp, "other", "v2", time.Hour, time.Hour))
			if err != nil || !res.Claimed || res.Record.State != idem.StateInProgress || res.Record.Response != nil ||
				res.Record.LeaseToken != "v2" {
				t.Fatalf("claim of an expired completed row: %+v %v", res, err)
			}
			_, wtx, err := s.BeginTx(ctx, idem.Lease{Principal: "alice", Key: exp, Token: "v2"})
			if err != nil {
				t.Fatal(err)
			}
			if err := wtx.Settle(ctx, idem.Outcome{State: idem.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("new")}}); err != nil {
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
		if got := errors.Is(err, idem.ErrTransient); got != c.transient {
			t.Errorf("%v: transient = %v, want %v", c.err, got, c.transient)
		}
		if !errors.Is(err, c.err) || !strings.HasPrefix(err.Error(), "idemgorm: op: ") {
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
		{"idempotency_keys", dialectPostgres, true},
		{"billing.idem", dialectPostgres, true},
		{"billing.idem", dialectMySQL, true},
		{"billing.idem", dialectSQLite, false},
		{"Idem", dialectPostgres, false},
		{"idem;drop table x", dialectMySQL, false},
		{`idem"`, dialectSQLite, false},
		{"a.b.c", dialectPostgres, false},
		{"", dialectPostgres, false},
		{"9idem", dialectPostgres, false},
		{strings.Repeat("a", 49), dialectPostgres, false},
	} {
		_, err := parseTableName(c.name, c.d)
		if (err == nil) != c.ok {
			t.Errorf("parseTableName(%q, %s) = %v, want ok=%v", c.name, c.d, err, c.ok)
		}
	}
}

func TestMigrationRendering(t *testing.T) {
	for _, d := range []dialect{dialectPostgres, dialectMySQL, dialectSQLite} {
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
