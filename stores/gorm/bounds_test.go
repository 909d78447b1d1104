package idemgorm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
)

// holdRow locks the store's row for key in another transaction that does
// not commit — a settle that has run its UPDATE and not yet committed —
// until the returned function ends it.
func holdRow(t *testing.T, f *fixture, key string) func() {
	t.Helper()
	other := f.DB.Begin()
	if other.Error != nil {
		t.Fatal(other.Error)
	}
	k := `"key"`
	if f.Dialect == "mysql" {
		k = "`key`"
	}
	res := other.Exec("UPDATE "+f.Store.Table()+" SET state = state WHERE principal = ? AND "+k+" = ?", "alice", key)
	if res.Error != nil || res.RowsAffected != 1 && f.Dialect != "mysql" {
		_ = other.Rollback()
		t.Fatalf("hold the row: %v (%d rows)", res.Error, res.RowsAffected)
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
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d, idemgorm.WithLockTimeout(lock))
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
			settled := claimReq("alice", "lock-"+randSuffix(), "body", time.Minute)
			if _, err := f.Store.Claim(ctx, settled); err != nil {
				t.Fatal(err)
			}
			_, tx, err := f.Store.BeginTx(ctx, leaseOf(settled))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created("s")); err != nil {
				t.Fatal(err)
			}
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
			stale := claimReq("alice", "lock-"+randSuffix(), "body", 50*time.Millisecond)
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

// TestCommitBoundedBySettleContext: GORM's Commit takes no context; the
// store's COMMIT runs on the transaction's connection with the settle's
// context, so a COMMIT whose answer never arrives ends with the context
// (the engine's StoreTimeout), not with the TCP timeout.
func TestCommitBoundedBySettleContext(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			direct := newFixture(t, d)
			table := strings.TrimPrefix(direct.Store.Table(), direct.Store.Table()[:strings.IndexByte(direct.Store.Table(), '.')+1])
			var dial gorm.Dialector
			var proxy *stallProxy
			switch d {
			case "postgres":
				pc, err := pgx.ParseConfig(pgDSN())
				if err != nil {
					t.Fatal(err)
				}
				proxy = newStallProxy(t, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)), []byte("COMMIT"))
				host, port, _ := net.SplitHostPort(proxy.ln.Addr().String())
				dial = postgres.Open(fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pc.User, pc.Database))
			case "mysql":
				mc, err := mysqldriver.ParseDSN(idemgormtest.MySQLDSN())
				if err != nil {
					t.Fatal(err)
				}
				proxy = newStallProxy(t, mc.Addr, []byte("COMMIT"))
				mc.Addr = proxy.ln.Addr().String()
				dial = mysql.Open(mc.FormatDSN())
			}
			db, err := gorm.Open(dial, gormConfig())
			if err != nil {
				t.Fatal(err)
			}
			sqlDB, _ := db.DB()
			t.Cleanup(func() { _ = sqlDB.Close() })
			store, err := idemgorm.New(db, idemgorm.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			req := claimReq("alice", "stall-"+randSuffix(), "body", time.Minute)
			if _, err := store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			txCtx, tx, err := store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			through := &fixture{DB: db, Store: store, Dialect: d, Effects: direct.Effects}
			if err := through.WriteEffect(txCtx, req.Key); err != nil {
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
// snapshot still shows the deleted row; NOT EXISTS (SELECT 1 FROM ins)
// keeps the statement from answering both rows, and the claim is the
// caller's own.
func TestClaimNeverReturnsTwoRows(t *testing.T) {
	f := newFixture(t, "postgres")
	ctx := testCtx(t)
	first := claimReq("alice", "two-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, first); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		other := f.DB.Begin()
		if err := other.Exec(`DELETE FROM `+f.Store.Table()+` WHERE principal = ? AND "key" = ?`, "alice", first.Key).Error; err != nil {
			t.Fatal(err)
		}
		next := claimReq("alice", first.Key, "body", time.Minute)
		done := make(chan struct{})
		var res idemstore.ClaimResult
		var err error
		go func() {
			defer close(done)
			res, err = f.Store.Claim(ctx, next)
		}()
		time.Sleep(300 * time.Millisecond) // the claim's INSERT waits for the DELETE
		if err := other.Commit().Error; err != nil {
			t.Fatal(err)
		}
		<-done
		if err != nil || !res.Claimed || res.Record.LeaseToken != next.Token {
			t.Fatalf("claim after a concurrent release: %+v %v", res, err)
		}
		first = next
	}
}

// TestSweepersTogether: several sweepers at once purge every expired row:
// none stops early because another took its rows.
func TestSweepersTogether(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			const rows = 300
			for i := range rows {
				r := claimReq("alice", fmt.Sprintf("sweep-%d-%s", i, randSuffix()), "body", time.Minute)
				r.Retention = time.Millisecond
				if _, err := f.Store.Claim(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(20 * time.Millisecond)
			var wg sync.WaitGroup
			var purged atomic.Int64
			for range 4 {
				wg.Go(func() {
					sw := idem.Sweeper{Store: f.Store, BatchSize: 7, MaxBatches: 1000}
					res, err := sw.Sweep(ctx)
					if err != nil {
						t.Error(err)
					}
					purged.Add(int64(res.Purged))
				})
			}
			wg.Wait()
			var left int64
			if err := f.DB.Raw("SELECT COUNT(*) FROM " + f.Store.Table()).Scan(&left).Error; err != nil {
				t.Fatal(err)
			}
			if left != 0 || purged.Load() != rows {
				t.Fatalf("%d rows left, %d purged, want 0 and %d", left, purged.Load(), rows)
			}
		})
	}
}

// TestCheckNamesTheMissingPiece: a missing table, a missing column and a
// headers column of the old (text/jsonb) kind are reported by Check (and
// Migrate) as a *SchemaError naming it, which wraps idem.ErrMisconfigured;
// a claim on a missing table fails with idem.ErrMisconfigured too.
func TestCheckNamesTheMissingPiece(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			db := openDB(t, d)
			ctx := testCtx(t)
			name := "idem_chk_" + randSuffix()
			s, err := idemgorm.New(db, idemgorm.WithTable(name))
			if err != nil {
				t.Fatal(err)
			}
			var se *idemgorm.SchemaError
			err = s.Check(ctx)
			if !errors.As(err, &se) || se.Column != "" || !errors.Is(err, idem.ErrMisconfigured) || !strings.HasPrefix(err.Error(), "idemgorm: check: ") {
				t.Fatalf("Check on a missing table = %v", err)
			}
			_, err = s.Claim(ctx, claimReq("alice", "k", "body", time.Minute))
			if !errors.Is(err, idem.ErrMisconfigured) || !strings.HasPrefix(err.Error(), "idemgorm: claim: ") {
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
				{nonce, "", lease, uncertain, "headers", "missing"}, {nonce, oldHeaders, lease, uncertain, "headers", "binary"},
				{"", headers, lease, uncertain, "nonce", "missing"}, {nonce, headers, "", uncertain, "lease_expires_at", "missing"},
				{nonce, headers, lease, "", "uncertain", "missing"},
			} {
				t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + name) })
				if err := db.Exec("DROP TABLE IF EXISTS " + name).Error; err != nil {
					t.Fatal(err)
				}
				if err := db.Exec("CREATE TABLE " + name + " (" + fmt.Sprintf(cols, c.nonce, c.headers, c.lease, c.uncertain) + ")").Error; err != nil {
					t.Fatal(err)
				}
				err := s.Migrate(ctx) // CREATE IF NOT EXISTS leaves it; the check finds it
				if !errors.As(err, &se) || se.Column != c.column || !strings.Contains(se.Problem, c.problem) || !errors.Is(err, idem.ErrMisconfigured) {
					t.Fatalf("Migrate on a table %+v = %v, want column %s %s", c, err, c.column, c.problem)
				}
				if err := s.Check(ctx); !errors.As(err, &se) || se.Column != c.column {
					t.Fatalf("Check on a table %+v = %v, want column %s", c, err, c.column)
				}
			}
			if err := db.Exec("DROP TABLE " + name).Error; err != nil {
				t.Fatal(err)
			}
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
// DateStyle and IntervalStyle; MySQL's sql_mode, time_zone,
// sql_select_limit and USE; SQLite's TEMP tables. One connection carries
// all of it, and every store call runs on it.
func TestImmuneToTheSession(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			direct := newFixture(t, d)
			var db *gorm.DB
			switch d {
			case "sqlite":
				db = direct.DB
			case "postgres":
				var err error
				db, err = gorm.Open(postgres.Open(pgDSN()), gormConfig())
				if err != nil {
					t.Fatal(err)
				}
			case "mysql":
				var err error
				db, err = gorm.Open(mysql.Open(idemgormtest.MySQLDSN()), gormConfig())
				if err != nil {
					t.Fatal(err)
				}
			}
			sqlDB, _ := db.DB()
			if d != "sqlite" {
				t.Cleanup(func() { _ = sqlDB.Close() })
			}
			table := direct.Store.Table()
			name := table[strings.IndexByte(table, '.')+1:]
			store, err := idemgorm.New(db, idemgorm.WithTable(name))
			if err != nil {
				t.Fatal(err)
			}
			sqlDB.SetMaxOpenConns(1)
			sqlDB.SetMaxIdleConns(1)
			var session []string
			switch d {
			case "postgres":
				session = []string{"CREATE TEMP TABLE " + name + " (x int)", "SET search_path TO pg_catalog",
					"SET TIME ZONE 'Pacific/Kiritimati'", "SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'iso_8601'",
					"SET lock_timeout = '1ms'"}
			case "mysql":
				if err := db.Exec("CREATE DATABASE IF NOT EXISTS idem_replica").Error; err != nil {
					t.Fatal(err)
				}
				session = []string{"USE idem_replica", "CREATE TEMPORARY TABLE IF NOT EXISTS " + name + " (x INT)",
					"SET SESSION sql_mode = 'SIMULTANEOUS_ASSIGNMENT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT'",
					"SET time_zone = '+13:00'", "SET sql_select_limit = 0"}
			case "sqlite":
				session = []string{"CREATE TEMP TABLE " + name + " (x INTEGER)"}
			}
			for _, q := range session {
				if err := db.Exec(q).Error; err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			// With one pooled connection SQLite's store tx and the
			// handler's reads would wait for each other; the store only
			// needs its own connection here.
			ctx := testCtx(t)
			req := claimReq("alice", "sess-"+randSuffix(), "body", time.Minute)
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
			exp := claimReq("alice", "sess-exp-"+randSuffix(), "body", time.Minute)
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
			if _, err := store.ListStale(ctx, 10); err != nil {
				t.Fatalf("list stale: %v", err)
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
// LOCAL statement_timeout = '1ms' does not bound the settle. A trigger
// makes the settle's UPDATE take 20 ms, so the test does not depend on
// how fast the machine is: a settle that set its own statement_timeout
// inside the UPDATE (where it applies only from the next statement on)
// ran under the handler's 1 ms and was cancelled.
func TestSettleOutlivesTheHandlersStatementTimeout(t *testing.T) {
	f := newFixture(t, "postgres")
	ctx := testCtx(t)
	fn := "idem_slow_" + randSuffix()
	for _, q := range []string{
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$",
		"CREATE TRIGGER " + fn + " BEFORE UPDATE ON " + f.Store.Table() + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		if err := f.DB.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_ = f.DB.Exec("DROP TRIGGER IF EXISTS " + fn + " ON " + f.Store.Table()).Error
		_ = f.DB.Exec("DROP FUNCTION IF EXISTS " + fn + "()").Error
	})
	req := claimReq("alice", "slow-"+randSuffix(), "body", time.Minute)
	if res, err := f.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	htx, _ := idemgorm.Tx(txCtx)
	if err := htx.Exec("SET LOCAL statement_timeout = '1ms'").Error; err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, created("slow")); err != nil {
		t.Fatalf("settle after the handler's SET LOCAL statement_timeout = '1ms': %v", err)
	}
	if rec, err := f.Store.Get(ctx, "alice", req.Key); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("after the settle: %+v %v", rec, err)
	}
}
