package idemsql_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idemsql "github.com/idemgo/idem/stores/sql"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

type fixture = idemsqltest.Fixture

// testCtx bounds a test's calls.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func claimReq(principal, key, body string, lease time.Duration) idemstore.ClaimRequest {
	fp := sha256.Sum256([]byte(body))
	s := idemsqltest.RandSuffix()
	return idemstore.ClaimRequest{Principal: principal, Key: key, Fingerprint: fp[:], Token: "tok-" + s,
		Nonce: "n-" + s, RequestID: "req-" + s, Lease: lease, Retention: time.Hour}
}

func leaseOf(r idemstore.ClaimRequest) idemstore.Lease {
	return idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

func created(id string) idemstore.Outcome {
	return idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"` + id + `"}`),
	}}
}

// settledKey claims key for alice and settles it with a 201.
func settledKey(t *testing.T, f *fixture, key string) idemstore.ClaimRequest {
	t.Helper()
	ctx := testCtx(t)
	req := claimReq("alice", key, "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, created(key)); err != nil {
		t.Fatal(err)
	}
	return req
}

// mustExec runs q on db with args, failing the test on an error.
func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// holdRow locks the store's row for key in another transaction that does
// not commit — a settle that has run its UPDATE and not yet committed —
// until the returned function ends it.
func holdRow(t *testing.T, f *fixture, key string) func() {
	t.Helper()
	other, err := f.DB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	q := "UPDATE " + f.Store.Table() + ` SET state = state WHERE principal = $1 AND "key" = $2`
	if f.Effects.Dialect == "mysql" {
		q = "UPDATE " + f.Store.Table() + " SET state = state WHERE principal = ? AND `key` = ?"
	}
	res, err := other.Exec(q, "alice", key)
	if n, _ := res.RowsAffected(); err != nil || n != 1 && f.Effects.Dialect != "mysql" {
		_ = other.Rollback()
		t.Fatalf("hold the row: %v (%d rows)", err, n)
	}
	var once sync.Once
	end := func() { once.Do(func() { _ = other.Rollback() }) }
	t.Cleanup(end)
	return end
}

// TestLockTimeoutBoundsWaits: a claim, a replay, a takeover, a release and
// a settle that meet a row another transaction holds (a settle not yet
// committed) answer within the store's lock timeout, with an error
// wrapping idemstore.ErrTransient, instead of waiting for that transaction;
// whatever lock_timeout or innodb_lock_wait_timeout the connection
// carries. Get does not wait at all.
func TestLockTimeoutBoundsWaits(t *testing.T) {
	const lock = time.Second
	const bound = lock + 2500*time.Millisecond
	for _, d := range []string{"pgx", "mysql"} {
		t.Run(d, func(t *testing.T) {
			f := idemsqltest.NewFixture(t, d, idemsql.WithLockTimeout(lock))
			ctx := testCtx(t)
			within := func(what string, fn func(ctx context.Context) error) {
				t.Helper()
				// The test's own bound, far past the lock timeout: without
				// the store's, the call waits for it.
				cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
				defer cancel()
				start := time.Now()
				err := fn(cctx)
				took := time.Since(start)
				if took > bound {
					t.Fatalf("%s took %v, want at most %v (lock timeout %v)", what, took, bound, lock)
				}
				if !errors.Is(err, idemstore.ErrTransient) {
					t.Fatalf("%s after %v: %v, want an error wrapping idemstore.ErrTransient", what, took, err)
				}
				t.Logf("%s answered in %v: %v", what, took.Round(time.Millisecond), err)
			}

			// A settled key: its replay meets the held row.
			settled := settledKey(t, f, "lock-"+idemsqltest.RandSuffix())
			end := holdRow(t, f, settled.Key)
			within("a replay", func(ctx context.Context) error {
				_, err := f.Store.Claim(ctx, claimReq("alice", settled.Key, "body", time.Minute))
				return err
			})
			start := time.Now()
			if rec, err := f.Store.Get(ctx, "alice", settled.Key); err != nil || rec.State != idemstore.StateCompleted {
				t.Fatalf("Get under the held row: %+v %v", rec, err)
			}
			if took := time.Since(start); took > lock/2 {
				t.Fatalf("Get waited %v for the held row", took)
			}
			end()

			// An in-progress key whose lease ran out: the claim (and its
			// takeover), the holder's release and the holder's settle
			// meet the held row.
			stale := claimReq("alice", "lock-"+idemsqltest.RandSuffix(), "body", 50*time.Millisecond)
			if _, err := f.Store.Claim(ctx, stale); err != nil {
				t.Fatal(err)
			}
			_, holderTx, err := f.Store.BeginTx(ctx, leaseOf(stale))
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			end = holdRow(t, f, stale.Key)
			within("a takeover", func(ctx context.Context) error {
				_, err := f.Store.Claim(ctx, claimReq("alice", stale.Key, "body", 50*time.Millisecond))
				return err
			})
			within("a release", func(ctx context.Context) error { return f.Store.Release(ctx, leaseOf(stale)) })
			within("a settle", func(ctx context.Context) error { return holderTx.Settle(ctx, created("h")) })
			end()
			// Nothing is stuck: the holder's key can be released now.
			if err := f.Store.Release(ctx, leaseOf(stale)); err != nil {
				t.Fatalf("release after the row was let go: %v", err)
			}
		})
	}
}

// stallProxy forwards TCP to target and, once armed by a client chunk
// containing pattern, stops passing the server's answers back on that
// connection: a COMMIT whose answer never comes (a network partition, a
// server stuck in fsync).
type stallProxy struct {
	ln      net.Listener
	target  string
	pattern []byte
	armed   atomic.Bool
	stalled atomic.Int64
}

func newStallProxy(t *testing.T, target string, pattern []byte) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, pattern: pattern}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			var stall atomic.Bool
			go func() { // client → server
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if p.armed.Load() && bytes.Contains(buf[:n], p.pattern) {
							stall.Store(true)
							p.stalled.Add(1)
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				_ = s.Close()
				_ = c.Close()
			}()
			go func() { // server → client
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !stall.Load() {
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				_, _ = io.Copy(io.Discard, s)
				_ = c.Close()
			}()
		}
	}()
	return p
}

// TestCommitBoundedBySettleContext: the store's COMMIT runs on the transaction's connection with the settle's
// context, so a COMMIT whose answer never arrives ends with the context
// (the engine's StoreTimeout), not with the TCP timeout. Not on lib/pq,
// which answers a done context with a cancel request and keeps waiting for
// the answer (see README.md, "Bounded waits").
func TestCommitBoundedBySettleContext(t *testing.T) {
	for _, d := range []string{"pgx", "mysql"} {
		t.Run(d, func(t *testing.T) {
			direct := idemsqltest.NewFixture(t, d)
			var driver, dsn string
			var proxy *stallProxy
			switch d {
			case "pgx", "pq":
				pc, err := pgx.ParseConfig(idemsqltest.PostgresDSN())
				if err != nil {
					t.Fatal(err)
				}
				proxy = newStallProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)), []byte("COMMIT"))
				host, port, _ := net.SplitHostPort(proxy.ln.Addr().String())
				driver, dsn = map[string]string{"pgx": "pgx", "pq": "postgres"}[d], fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pc.User, pc.Database)
			case "mysql":
				mc, err := mysqldriver.ParseDSN(idemsqltest.MySQLDSN())
				if err != nil {
					t.Fatal(err)
				}
				proxy = newStallProxy(t, mc.Addr, []byte("COMMIT"))
				mc.Addr = proxy.ln.Addr().String()
				driver, dsn = "mysql", mc.FormatDSN()
			}
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			store, err := idemsql.New(db, idemsql.WithTable(direct.Store.Table()))
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			req := claimReq("alice", "stall-"+idemsqltest.RandSuffix(), "body", time.Minute)
			if _, err := store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			txCtx, tx, err := store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			if err := direct.Effects.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			proxy.armed.Store(true)
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- tx.Settle(sctx, created(req.Key)) }()
			select {
			case err := <-done:
				took := time.Since(start)
				if err == nil {
					t.Fatal("settle succeeded though the COMMIT's answer never came")
				}
				if took > 3*time.Second {
					t.Fatalf("settle took %v with a 1s context", took)
				}
				if proxy.stalled.Load() == 0 {
					t.Fatal("the proxy never saw the COMMIT: the test proves nothing")
				}
				t.Logf("settle with a stalled COMMIT answered in %v: %v", took.Round(time.Millisecond), err)
			case <-time.After(15 * time.Second):
				t.Fatal("settle still waiting for the COMMIT after 15s with a 1s context")
			}
		})
	}
}

// TestClaimNeverReturnsTwoRows: on PostgreSQL a claim whose INSERT waited
// for a release (an uncommitted DELETE of the row) inserts, while its
// snapshot still shows the deleted row; the claim goes by the INSERT's
// flag, not by that row, and is the caller's own.
func TestClaimNeverReturnsTwoRows(t *testing.T) {
	f := idemsqltest.NewFixture(t, "pgx")
	ctx := testCtx(t)
	first := claimReq("alice", "two-"+idemsqltest.RandSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, first); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		other, err := f.DB.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Exec(`DELETE FROM `+f.Store.Table()+` WHERE principal = $1 AND "key" = $2`, "alice", first.Key); err != nil {
			t.Fatal(err)
		}
		next := claimReq("alice", first.Key, "body", time.Minute)
		done := make(chan struct{})
		var res idemstore.ClaimResult
		go func() {
			defer close(done)
			res, err = f.Store.Claim(ctx, next)
		}()
		time.Sleep(300 * time.Millisecond) // the claim's INSERT waits for the DELETE
		if err := other.Commit(); err != nil {
			t.Fatal(err)
		}
		<-done
		if err != nil || !res.Claimed || res.Record.LeaseToken != next.Token {
			t.Fatalf("claim after a concurrent release: %+v %v", res, err)
		}
		first = next
	}
}

// TestCheckNamesTheMissingPiece: a missing table, a missing column and a
// headers column of the old (text/jsonb) kind are reported by Check (and
// Migrate) as a *SchemaError naming it, which wraps idem.ErrMisconfigured;
// a claim on a missing table fails with idem.ErrMisconfigured too.
func TestCheckNamesTheMissingPiece(t *testing.T) {
	for _, setup := range []string{"pgx", "mysql", "sqlite"} {
		t.Run(setup, func(t *testing.T) {
			d := idemsqltest.Dialect(setup)
			db := idemsqltest.OpenDB(t, setup)
			ctx := testCtx(t)
			name := "idem_chk_" + idemsqltest.RandSuffix()
			s, err := idemsql.New(db, idemsql.WithTable(name))
			if err != nil {
				t.Fatal(err)
			}
			var se *idemsql.SchemaError
			err = s.Check(ctx)
			if !errors.As(err, &se) || se.Column != "" || !errors.Is(err, idem.ErrMisconfigured) || !strings.HasPrefix(err.Error(), "idemsql: check: ") {
				t.Fatalf("Check on a missing table = %v", err)
			}
			_, err = s.Claim(ctx, claimReq("alice", "k", "body", time.Minute))
			if !errors.Is(err, idem.ErrMisconfigured) || !strings.HasPrefix(err.Error(), "idemsql: claim: ") {
				t.Fatalf("Claim on a missing table = %v, want idem.ErrMisconfigured", err)
			}

			// The table without headers, then with old text headers, then
			// without the nonce, the lease deadline or the uncertain mark:
			// each reported by name, also when Migrate's index needs it.
			cols := map[string]string{
				"postgres": `principal text, "key" text, fingerprint bytea, state text, lease_token text, request_id text, %s status int, %s body bytea, created_at timestamptz, locked_at timestamptz, %s expires_at timestamptz %s`,
				"mysql":    "principal VARBINARY(255), `key` VARBINARY(255), fingerprint VARBINARY(255), state VARCHAR(16), lease_token VARBINARY(255), request_id VARBINARY(255), %s status INT, %s body LONGBLOB, created_at DATETIME(6), locked_at DATETIME(6), %s expires_at DATETIME(6) %s",
				"sqlite":   `principal TEXT, "key" TEXT, fingerprint BLOB, state TEXT, lease_token TEXT, request_id TEXT, %s status INTEGER, %s body BLOB, created_at INTEGER, locked_at INTEGER, %s expires_at INTEGER %s`,
			}[d]
			oldHeaders := map[string]string{"postgres": "headers jsonb,", "mysql": "headers LONGTEXT,", "sqlite": "headers TEXT,"}[d]
			headers := map[string]string{"postgres": "headers bytea,", "mysql": "headers LONGBLOB,", "sqlite": "headers BLOB,"}[d]
			nonce := map[string]string{"postgres": "nonce text,", "mysql": "nonce VARBINARY(64),", "sqlite": "nonce TEXT,"}[d]
			lease := map[string]string{"postgres": "lease_expires_at timestamptz,", "mysql": "lease_expires_at DATETIME(6),", "sqlite": "lease_expires_at INTEGER,"}[d]
			uncertain := map[string]string{"postgres": ", uncertain boolean", "mysql": ", uncertain BOOLEAN", "sqlite": ", uncertain INTEGER"}[d]
			for _, c := range []struct{ nonce, headers, lease, uncertain, column, problem string }{
				{nonce, "", lease, uncertain, "headers", "missing"}, {nonce, oldHeaders, lease, uncertain, "headers", "want"},
				{"", headers, lease, uncertain, "nonce", "missing"}, {nonce, headers, "", uncertain, "lease_expires_at", "missing"},
				{nonce, headers, lease, "", "uncertain", "missing"},
			} {
				t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + name) })
				mustExec(t, db, "DROP TABLE IF EXISTS "+name)
				mustExec(t, db, "CREATE TABLE "+name+" ("+fmt.Sprintf(cols, c.nonce, c.headers, c.lease, c.uncertain)+")")
				err := s.Migrate(ctx) // CREATE IF NOT EXISTS leaves it; the check finds it
				if !errors.As(err, &se) || se.Column != c.column || !strings.Contains(se.Problem, c.problem) || !errors.Is(err, idem.ErrMisconfigured) {
					t.Fatalf("Migrate on a table %+v = %v, want column %s %s", c, err, c.column, c.problem)
				}
				if err := s.Check(ctx); !errors.As(err, &se) || se.Column != c.column {
					t.Fatalf("Check on a table %+v = %v, want column %s", c, err, c.column)
				}
			}
			if d == "postgres" {
				// Every column, but no unique index for the claim's ON
				// CONFLICT (principal, key): Check says so before a claim
				// fails on it.
				mustExec(t, db, "DROP TABLE "+name)
				mustExec(t, db, "CREATE TABLE "+name+" ("+fmt.Sprintf(cols, nonce, headers, lease, uncertain)+")")
				if err := s.Check(ctx); !errors.As(err, &se) || se.Column != "" || !strings.Contains(se.Problem, "unique index") {
					t.Fatalf("Check on a table without a unique index on (principal, key) = %v", err)
				}
			}
			mustExec(t, db, "DROP TABLE "+name)
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate on no table: %v", err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
		})
	}
}

// TestImmuneToTheSession: the store's statements do not depend on session
// state a handler can leave on a pooled connection — PostgreSQL's
// search_path (and a TEMP table named like the store's), TimeZone,
// DateStyle, IntervalStyle and bytea_output (pgx's binary and simple
// protocols, lib/pq's text); MySQL's sql_mode, time_zone,
// sql_select_limit and USE; SQLite's TEMP tables. One connection carries
// all of it, and every store call runs on it.
func TestImmuneToTheSession(t *testing.T) {
	for _, setup := range []string{"pgx", "pgx-simple", "pq", "mysql", "sqlite"} {
		t.Run(setup, func(t *testing.T) {
			// pgx-simple: pgx's stdlib in its simple protocol, where
			// values travel as text as with lib/pq.
			simple := setup == "pgx-simple"
			if simple {
				setup = "pgx"
			}
			d := idemsqltest.Dialect(setup)
			direct := idemsqltest.NewFixture(t, setup)
			db := direct.DB
			if d != "sqlite" {
				driver, dsn := map[string]string{"pgx": "pgx", "pq": "postgres", "mysql": "mysql"}[setup], idemsqltest.PostgresDSN()
				if d == "mysql" {
					dsn = idemsqltest.MySQLDSN()
				}
				if simple {
					pc, err := pgx.ParseConfig(dsn)
					if err != nil {
						t.Fatal(err)
					}
					dsn = fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable default_query_exec_mode=simple_protocol",
						pc.Host, pc.Port, pc.User, pc.Database)
				}
				var err error
				if db, err = sql.Open(driver, dsn); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
			}
			table := direct.Store.Table()
			name := table[strings.IndexByte(table, '.')+1:]
			store, err := idemsql.New(db, idemsql.WithTable(name))
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(1)
			db.SetMaxIdleConns(1)
			var session []string
			switch d {
			case "postgres":
				session = []string{"CREATE TEMP TABLE " + name + " (x int)", "SET search_path TO pg_catalog",
					"SET TIME ZONE 'Pacific/Kiritimati'", "SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'iso_8601'",
					"SET bytea_output = 'escape'", "SET lock_timeout = '1ms'"}
			case "mysql":
				mustExec(t, db, "CREATE DATABASE IF NOT EXISTS idem_replica")
				session = []string{"USE idem_replica", "CREATE TEMPORARY TABLE IF NOT EXISTS " + name + " (x INT)",
					"SET SESSION sql_mode = 'SIMULTANEOUS_ASSIGNMENT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT'",
					"SET time_zone = '+13:00'", "SET sql_select_limit = 0"}
			case "sqlite":
				session = []string{"CREATE TEMP TABLE " + name + " (x INTEGER)"}
			}
			for _, q := range session {
				mustExec(t, db, q)
			}
			// With one pooled connection SQLite's store tx and the
			// handler's reads would wait for each other; the store only
			// needs its own connection here.
			ctx := testCtx(t)
			req := claimReq("alice", "sess-"+idemsqltest.RandSuffix(), "body", time.Minute)
			before := time.Now()
			res, err := store.Claim(ctx, req)
			if err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			if skew := res.Record.LockedAt.Sub(before); skew < -time.Minute || skew > time.Minute {
				t.Fatalf("locked_at %v is %v away from now: the session's time zone leaked in", res.Record.LockedAt, skew)
			}
			_, tx, err := store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created(req.Key)); err != nil {
				t.Fatalf("settle: %v", err)
			}
			if res, err := store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute)); err != nil || res.Claimed ||
				res.Record.State != idemstore.StateCompleted || res.Record.Response == nil {
				t.Fatalf("replay: %+v %v", res, err)
			}
			// The expired-row path, which on MySQL is the upsert.
			exp := claimReq("alice", "sess-exp-"+idemsqltest.RandSuffix(), "body", time.Minute)
			exp.Retention = 30 * time.Millisecond
			if _, err := store.Claim(ctx, exp); err != nil {
				t.Fatal(err)
			}
			_, tx, err = store.BeginTx(ctx, leaseOf(exp))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created(exp.Key)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			again := claimReq("alice", exp.Key, "other", time.Minute)
			if res, err := store.Claim(ctx, again); err != nil || !res.Claimed || res.Record.State != idemstore.StateInProgress {
				t.Fatalf("claim of an expired row: %+v %v", res, err)
			}
			if err := store.Release(ctx, leaseOf(again)); err != nil {
				t.Fatalf("release: %v", err)
			}
			// Get and ListStale return records, their times read on this
			// session too.
			if rec, err := store.Get(ctx, req.Principal, req.Key); err != nil || rec.State != idemstore.StateCompleted ||
				!rec.LockedAt.Equal(res.Record.LockedAt) {
				t.Fatalf("get: %+v %v, want the completed record locked at %v", rec, err, res.Record.LockedAt)
			}
			stale := claimReq("alice", "sess-stale-"+idemsqltest.RandSuffix(), "body", time.Millisecond)
			if _, err := store.Claim(ctx, stale); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			if recs, err := store.ListStale(ctx, 10); err != nil || !slices.ContainsFunc(recs, func(r idem.Record) bool {
				return r.Key == stale.Key && r.LockedAt.Sub(before) > -time.Minute && r.LockedAt.Sub(before) < time.Minute
			}) {
				t.Fatalf("list stale: %+v %v, want the stale claim %s", recs, err, stale.Key)
			}
			if _, err := store.PurgeExpired(ctx, 10); err != nil {
				t.Fatalf("purge: %v", err)
			}
			if rec, err := direct.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateCompleted {
				t.Fatalf("the record as seen from a clean session: %+v %v", rec, err)
			}
		})
	}
}

// TestSettleOutlivesTheHandlersStatementTimeout: a handler that runs SET
// LOCAL statement_timeout = '5ms' does not bound the settle. A trigger
// makes the settle's UPDATE take 50 ms, so the test does not depend on
// how fast the machine is: a settle that set its own statement_timeout
// inside the UPDATE (where it applies only from the next statement on)
// ran under the handler's 5 ms and was cancelled. The statement that pins
// the settle's settings runs under the handler's timeout itself, as every
// statement after a SET LOCAL does: a handler's timeout shorter than that
// one statement (microseconds) fails the settle, and nothing is stored.
func TestSettleOutlivesTheHandlersStatementTimeout(t *testing.T) {
	f := idemsqltest.NewFixture(t, "pgx")
	ctx := testCtx(t)
	fn := "idem_slow_" + idemsqltest.RandSuffix()
	for _, q := range []string{
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.05); RETURN NEW; END $$",
		"CREATE TRIGGER " + fn + " BEFORE UPDATE ON " + f.Store.Table() + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		mustExec(t, f.DB, q)
	}
	t.Cleanup(func() {
		_, _ = f.DB.Exec("DROP TRIGGER IF EXISTS " + fn + " ON " + f.Store.Table())
		_, _ = f.DB.Exec("DROP FUNCTION IF EXISTS " + fn + "()")
	})
	req := claimReq("alice", "slow-"+idemsqltest.RandSuffix(), "body", time.Minute)
	if res, err := f.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	htx, _ := idemsql.Tx(txCtx)
	if _, err := htx.ExecContext(txCtx, "SET LOCAL statement_timeout = '5ms'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, created("slow")); err != nil {
		t.Fatalf("settle after the handler's SET LOCAL statement_timeout = '5ms': %v", err)
	}
	if rec, err := f.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("after the settle: %+v %v", rec, err)
	}
}
