package idemgorm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
)

func fp(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func claimReq(principal, key, body string, lease time.Duration) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{
		Principal: principal, Key: key, Fingerprint: fp(body), Token: "tok-" + randSuffix() + randSuffix(), Nonce: "n-" + randSuffix(),
		RequestID: "req-" + randSuffix(), Lease: lease, Retention: time.Hour,
	}
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

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// contentionRounds is how many rounds TestExactlyOnceUnderContention runs
// per dialect: IDEM_GORM_ROUNDS, else 1,000 on the servers and 150 on
// SQLite, whose single writer serialises every write and whose pure-Go
// engine is slow under -race (measured: 150–210 ms a round with -race on
// a loaded 2-core machine, 25–40 ms without).
func contentionRounds(dialect string) int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_GORM_ROUNDS")); err == nil && n > 0 {
		return n
	}
	if dialect == "sqlite" {
		return 150
	}
	return 1000
}

// TestExactlyOnceUnderContention: rounds of 16 goroutines claim one fresh
// key at once; each winner writes a business row in the shared transaction
// and settles. Every key ends with exactly one winner, one business row and
// a completed record.
func TestExactlyOnceUnderContention(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			t.Parallel() // each dialect is its own server, each fixture its own table
			f := newFixture(t, d)
			ctx := testCtx(t)
			const goroutines = 16
			rounds := contentionRounds(d)
			var transient atomic.Int64
			start := time.Now()
			keys := make([]string, 0, rounds)
			for round := range rounds {
				key := fmt.Sprintf("race-%d-%s", round, randSuffix())
				keys = append(keys, key)
				var (
					wg      sync.WaitGroup
					winners atomic.Int64
					gate    = make(chan struct{})
					errs    = make(chan error, goroutines)
				)
				for range goroutines {
					wg.Go(func() {
						// A long lease: this test is about the claim, not
						// about takeovers of slow winners.
						req := claimReq("alice", key, "same body", time.Minute)
						<-gate
						res, err := f.Store.Claim(ctx, req)
						if errors.Is(err, idemstore.ErrTransient) {
							transient.Add(1)
							return
						}
						if err != nil {
							errs <- err
							return
						}
						if !res.Claimed {
							if res.Record.Principal != "alice" || res.Record.Key != key {
								errs <- fmt.Errorf("loser got record %s/%s", res.Record.Principal, res.Record.Key)
							}
							return
						}
						winners.Add(1)
						txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
						if err != nil {
							errs <- err
							return
						}
						defer func() { _ = tx.Rollback(ctx) }()
						if err := f.WriteEffect(txCtx, key); err != nil {
							errs <- err
							return
						}
						errs <- tx.Settle(ctx, created(key))
					})
				}
				close(gate)
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
				}
				if w := winners.Load(); w != 1 {
					t.Fatalf("round %d: %d winners, want exactly 1 (%d transient errors so far)", round, w, transient.Load())
				}
			}
			elapsed := time.Since(start)

			var rows, distinct int64
			if err := f.DB.Raw("SELECT COUNT(*), COUNT(DISTINCT id) FROM "+f.Effects).Row().Scan(&rows, &distinct); err != nil {
				t.Fatal(err)
			}
			if rows != int64(len(keys)) || distinct != int64(len(keys)) {
				t.Fatalf("%d business rows (%d distinct) for %d keys, want one each", rows, distinct, len(keys))
			}
			for _, k := range keys {
				rec, err := f.Store.Get(ctx, "alice", k)
				if err != nil || rec.State != idemstore.StateCompleted {
					t.Fatalf("key %s: %v %v, want completed", k, rec.State, err)
				}
			}
			t.Logf("%s: %d rounds × %d goroutines in %v (%v/round): business rows == keys == %d; %d transient claim errors",
				d, rounds, goroutines, elapsed.Round(time.Millisecond), (elapsed / time.Duration(rounds)).Round(time.Microsecond),
				len(keys), transient.Load())
		})
	}
}

// TestFence: a holder's lease expires and another request takes the key
// over; the old holder's settle is refused with ErrLeaseLost and its
// business row is rolled back, while the new holder's stands.
//
// On PostgreSQL and MySQL the old holder's transaction is open, with its
// business row written, while the takeover happens. On SQLite that cannot
// be: the open transaction holds the database's only write lock, and the
// takeover (a write) waits for it. There the old holder begins and writes
// after the takeover — a holder that was stuck before its first write.
func TestFence(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			const lease = 300 * time.Millisecond
			old := claimReq("alice", "fence-"+randSuffix(), "body", lease)
			if res, err := f.Store.Claim(ctx, old); err != nil || !res.Claimed {
				t.Fatalf("first claim: %+v %v", res, err)
			}
			begin := func() (context.Context, idemstore.Tx) {
				txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(old))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback(ctx) })
				if err := f.WriteEffect(txCtx, "old"); err != nil {
					t.Fatal(err)
				}
				return txCtx, tx
			}
			var oldTx idemstore.Tx
			if d != "sqlite" {
				_, oldTx = begin()
			}

			time.Sleep(lease + 100*time.Millisecond)
			fresh := claimReq("alice", old.Key, "body", lease)
			res, err := f.Store.Claim(ctx, fresh)
			if err != nil || !res.Claimed || !res.Reclaimed || res.Record.LeaseToken != fresh.Token {
				t.Fatalf("takeover: %+v %v", res, err)
			}
			if oldTx == nil {
				_, oldTx = begin()
			}

			if err := oldTx.Settle(ctx, created("old")); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("old holder's settle = %v, want ErrLeaseLost", err)
			}
			if n, err := f.CountEffects(ctx, "old"); err != nil || n != 0 {
				t.Fatalf("old holder's business rows = %d (%v), want 0: rolled back", n, err)
			}
			if err := f.Store.Release(ctx, leaseOf(old)); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("old holder's release = %v, want ErrLeaseLost", err)
			}

			txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(fresh))
			if err != nil {
				t.Fatal(err)
			}
			if err := f.WriteEffect(txCtx, "new"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created("new")); err != nil {
				t.Fatalf("new holder's settle: %v", err)
			}
			if n, _ := f.CountEffects(ctx, "new"); n != 1 {
				t.Fatalf("new holder's business rows = %d, want 1", n)
			}
			rec, err := f.Store.Get(ctx, "alice", old.Key)
			if err != nil || rec.State != idemstore.StateCompleted || rec.LeaseToken != fresh.Token ||
				!bytes.Equal(rec.Response.Body, created("new").Response.Body) {
				t.Fatalf("final record %+v %v, want the new holder's", rec, err)
			}
		})
	}
}

// TestReplayReturnsStoredRecord: replays and live conflicts return the
// stored record and change nothing, on every dialect.
func TestReplayReturnsStoredRecord(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			req := claimReq("alice", "replay-"+randSuffix(), "body", time.Minute)
			if _, err := f.Store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			_, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Settle(ctx, created("r")); err != nil {
				t.Fatal(err)
			}
			before, err := f.Store.Get(ctx, "alice", req.Key)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				body := "body"
				if i%2 == 1 {
					body = "another body" // a 422 to be: must not write either
				}
				res, err := f.Store.Claim(ctx, claimReq("alice", req.Key, body, time.Nanosecond))
				if err != nil || res.Claimed {
					t.Fatalf("replay %d: %+v %v", i, res, err)
				}
				if res.Record.State != idemstore.StateCompleted || res.Record.Response == nil ||
					res.Record.Response.Status != http.StatusCreated || res.Record.LeaseToken != req.Token {
					t.Fatalf("replay %d returned %+v", i, res.Record)
				}
			}
			after, err := f.Store.Get(ctx, "alice", req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if !sameRecord(before, after) {
				t.Fatalf("replays changed the record:\n%+v\n%+v", before, after)
			}
		})
	}
}

// TestClaimBounds: the store refuses what its table cannot hold before it
// writes anything, and cuts the request id at a character boundary. On
// PostgreSQL, whose table has no CHECK constraints (each would be parsed on
// every write), these are the only bounds.
func TestClaimBounds(t *testing.T) {
	atLimit := strings.Repeat("r", idemstore.MaxRequestIDLength)
	long := strings.Repeat("x", 256)
	cases := map[string]struct {
		edit   func(*idemstore.ClaimRequest)
		stored string // the request id stored; "" when the claim is refused
	}{
		"request id at the limit": {func(r *idemstore.ClaimRequest) { r.RequestID = atLimit }, atLimit},
		"request id over it":      {func(r *idemstore.ClaimRequest) { r.RequestID = atLimit[:254] + "ü" }, atLimit[:254]},
		"principal over 255":      {func(r *idemstore.ClaimRequest) { r.Principal = long }, ""},
		"key over 255":            {func(r *idemstore.ClaimRequest) { r.Key = long }, ""},
		"fingerprint over 255":    {func(r *idemstore.ClaimRequest) { r.Fingerprint = []byte(long) }, ""},
		"token over 255":          {func(r *idemstore.ClaimRequest) { r.Token = long }, ""},
		"nonce over 64":           {func(r *idemstore.ClaimRequest) { r.Nonce = long[:65] }, ""},
	}
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			for name, tc := range cases {
				req := claimReq("alice", "bounds-"+randSuffix(), "body", time.Minute)
				tc.edit(&req)
				_, err := f.Store.Claim(ctx, req)
				rec, gerr := f.Store.Get(ctx, req.Principal, req.Key)
				switch {
				case gerr != nil && !errors.Is(gerr, idemstore.ErrNotFound):
					t.Fatalf("%s: get: %v", name, gerr)
				case tc.stored == "" && (err == nil || gerr == nil):
					t.Errorf("%s: claim answered %v, get %v: want a refusal that writes nothing", name, err, gerr)
				case tc.stored != "" && (err != nil || gerr != nil || rec.RequestID != tc.stored):
					t.Errorf("%s: claim %v, request id stored as %d bytes, want %d", name, err, len(rec.RequestID), len(tc.stored))
				}
			}
		})
	}
}

// TestReplayWritesNothingPostgres: the row's system columns prove that no
// replay locked or rewrote it (ON CONFLICT … DO UPDATE … WHERE false would
// set xmax to its own transaction id on every replay).
func TestReplayWritesNothingPostgres(t *testing.T) {
	f := newFixture(t, "postgres")
	ctx := testCtx(t)
	req := claimReq("alice", "pgreplay-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, created("r")); err != nil {
		t.Fatal(err)
	}
	sys := func() string {
		var ctid, xmin, xmax string
		err := f.DB.Raw(`SELECT ctid::text, xmin::text, xmax::text FROM `+f.Store.Table()+` WHERE principal = ? AND "key" = ?`,
			"alice", req.Key).Row().Scan(&ctid, &xmin, &xmax)
		if err != nil {
			t.Fatal(err)
		}
		return ctid + " " + xmin + " " + xmax
	}
	before := sys()
	for range 50 {
		if res, err := f.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute)); err != nil || res.Claimed {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	if after := sys(); after != before {
		t.Fatalf("replays touched the row: (ctid xmin xmax) %s → %s", before, after)
	}
	t.Logf("50 replays: row (ctid xmin xmax) stayed %s", before)
}

// TestReplayWritesNothingSQLite: PRAGMA data_version, read on a connection
// of its own, changes whenever another connection commits a write. Replays
// must leave it alone.
func TestReplayWritesNothingSQLite(t *testing.T) {
	f := newFixture(t, "sqlite")
	ctx := testCtx(t)
	req := claimReq("alice", "litereplay-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, created("r")); err != nil {
		t.Fatal(err)
	}
	sqlDB, err := f.DB.DB()
	if err != nil {
		t.Fatal(err)
	}
	observer, err := sqlDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	version := func() int64 {
		var v int64
		if err := observer.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := version()
	for range 50 {
		if res, err := f.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute)); err != nil || res.Claimed {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	if after := version(); after != before {
		t.Fatalf("replays committed writes: data_version %d → %d", before, after)
	}
	// The observer does see a real write.
	if _, err := f.Store.Claim(ctx, claimReq("alice", "other-"+randSuffix(), "body", time.Minute)); err != nil {
		t.Fatal(err)
	}
	if after := version(); after == before {
		t.Fatal("data_version did not move for a real claim: the check proves nothing")
	}
}

// TestSQLiteInterruptedTransaction: SQLite rolls a transaction back by
// itself when a write in it is interrupted (the driver interrupts on a
// cancelled context), and then runs later statements in autocommit mode.
// A handler that swallows that error must not get its outcome committed on
// its own: Settle fails and nothing is stored. MySQL does the same after a
// deadlock (1213); TestMySQLDeadlockedTransaction is its twin.
func TestSQLiteInterruptedTransaction(t *testing.T) {
	f := newFixture(t, "sqlite")
	ctx := testCtx(t)
	req := claimReq("alice", "interrupt-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := f.WriteEffect(txCtx, "before"); err != nil {
		t.Fatal(err)
	}
	db, _ := idemgorm.Tx(txCtx)
	qctx, cancel := context.WithTimeout(txCtx, 50*time.Millisecond)
	defer cancel()
	err = db.WithContext(qctx).Exec(`INSERT INTO ` + f.Effects + ` (id)
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000)
		SELECT 'bulk' FROM n`).Error
	if err == nil {
		t.Fatal("the long INSERT was not interrupted")
	}
	// The handler swallows the error and writes once more.
	_ = f.WriteEffect(txCtx, "after")
	settleErr := tx.Settle(ctx, created("x"))
	if !errors.Is(settleErr, idemgorm.ErrTxEnded) {
		t.Fatalf("Settle after SQLite ended the transaction = %v, want ErrTxEnded", settleErr)
	}
	rec, err := f.Store.Get(ctx, "alice", req.Key)
	if err != nil || rec.State != idemstore.StateInProgress || rec.Response != nil {
		t.Fatalf("record %+v %v, want still in progress and nothing stored", rec, err)
	}
	if n, _ := f.CountEffects(ctx, "before"); n != 0 {
		t.Fatalf("%d rows of the rolled-back transaction exist", n)
	}
	// What the handler wrote after swallowing the error ran in autocommit
	// mode and stands: no store can take that back (README: return on
	// every database error).
	n, _ := f.CountEffects(ctx, "after")
	t.Logf("settle refused: %v; the handler's own autocommitted write after the error: %d row(s)", settleErr, n)
}

// TestTxAndDB: the accessors say whether a transaction is there.
func TestTxAndDB(t *testing.T) {
	f := newFixture(t, "sqlite")
	ctx := testCtx(t)
	if db, ok := idemgorm.Tx(ctx); ok || db != nil {
		t.Fatal("Tx found a transaction in a bare context")
	}
	if idemgorm.DB(ctx, nil) != nil {
		t.Fatal("DB(ctx, nil) without a transaction is not nil")
	}
	if db := idemgorm.DB(ctx, f.DB); db == nil || db.Statement.ConnPool != f.DB.Statement.ConnPool {
		t.Fatal("DB without a transaction did not fall back")
	}
	req := claimReq("alice", "acc-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	txDB, ok := idemgorm.Tx(txCtx)
	if !ok || txDB.Statement.ConnPool == f.DB.Statement.ConnPool {
		t.Fatal("Tx did not return the transaction")
	}
	if db := idemgorm.DB(txCtx, f.DB); db.Statement.ConnPool != txDB.Statement.ConnPool {
		t.Fatal("DB did not prefer the transaction")
	}
}

func sameRecord(a, b idem.Record) bool {
	ra, rb := a.Response, b.Response
	a.Response, b.Response = nil, nil
	if fmt.Sprint(a) != fmt.Sprint(b) || (ra == nil) != (rb == nil) {
		return false
	}
	return ra == nil || (ra.Status == rb.Status && bytes.Equal(ra.Body, rb.Body) && fmt.Sprint(ra.Header) == fmt.Sprint(rb.Header))
}

// TestMySQLDeadlockedTransaction: InnoDB rolls the whole transaction back
// when it picks it as a deadlock victim, and the session goes on in
// autocommit mode. A handler that swallows the 1213 must not get its
// outcome committed on its own.
func TestMySQLDeadlockedTransaction(t *testing.T) {
	f := newFixture(t, "mysql")
	ctx := testCtx(t)
	locks := f.Effects + "_locks" // rows 1 and 2, made by the fixture
	if !f.Store.Guarded() {
		t.Fatal("store is not guarded: the temporary marker table was refused")
	}

	req := claimReq("alice", "deadlock-"+randSuffix(), "body", time.Minute)
	if _, err := f.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := f.WriteEffect(txCtx, "before"); err != nil {
		t.Fatal(err)
	}
	ours, _ := idemgorm.Tx(txCtx)
	if err := ours.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}

	// The other transaction is heavier, so InnoDB picks ours as the victim.
	other := f.DB.Begin()
	defer other.Rollback()
	for i := range 50 {
		if err := other.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", fmt.Sprintf("heavy-%d", i)).Error; err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 2").Error; err != nil {
		t.Fatal(err)
	}
	otherDone := make(chan error, 1)
	go func() { otherDone <- other.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 1").Error }()
	time.Sleep(200 * time.Millisecond) // let it wait for our lock on row 1
	err = ours.Exec("UPDATE " + locks + " SET v = v + 1 WHERE id = 2").Error
	if err == nil || !strings.Contains(err.Error(), "1213") {
		t.Fatalf("our UPDATE = %v, want the deadlock victim's 1213", err)
	}
	if oerr := <-otherDone; oerr != nil {
		t.Fatalf("the other transaction: %v", oerr)
	}
	_ = other.Rollback()

	// The handler swallows the deadlock and settles anyway.
	settleErr := tx.Settle(ctx, created("x"))
	if !errors.Is(settleErr, idemgorm.ErrTxEnded) {
		t.Fatalf("Settle after the deadlock rollback = %v, want ErrTxEnded", settleErr)
	}
	rec, err := f.Store.Get(ctx, "alice", req.Key)
	if err != nil || rec.State != idemstore.StateInProgress || rec.Response != nil {
		t.Fatalf("record %+v %v, want still in progress and nothing stored", rec, err)
	}
	if n, _ := f.CountEffects(ctx, "before"); n != 0 {
		t.Fatalf("%d rows of the deadlocked transaction exist", n)
	}
	if err := f.Store.Release(ctx, leaseOf(req)); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestSchemaQualifiedTable: WithTable("schema.table") on PostgreSQL and
// MySQL (where a schema is a database) migrates and works.
func TestSchemaQualifiedTable(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			db := openDB(t, d)
			schema := "idem_schema_" + randSuffix()
			if err := db.Exec("CREATE SCHEMA " + schema).Error; err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				drop := "DROP SCHEMA " + schema
				if d == "postgres" {
					drop += " CASCADE"
				}
				if err := db.Exec(drop).Error; err != nil {
					t.Errorf("%s: %v", drop, err)
				}
			})
			s, err := idemgorm.New(db, idemgorm.WithTable(schema+".keys"))
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			for range 2 { // Migrate is idempotent
				if err := s.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
			}
			r := claimReq("alice", "k", "body", time.Minute)
			if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			if res, err := s.Claim(ctx, claimReq("alice", "k", "body", time.Minute)); err != nil || res.Claimed {
				t.Fatalf("second claim: %+v %v", res, err)
			}
		})
	}
}

// TestTakeoverRacesLateCompletion: the holder settles just as its expired
// lease is taken over. Whichever commits first, there is exactly one
// committed business row per key, and the record ends completed by the
// attempt whose row it is. (On SQLite the holder's open transaction holds
// the write lock, so the completion always wins.)
func TestTakeoverRacesLateCompletion(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			const lease = 40 * time.Millisecond
			wins := map[string]int{}
			for i := range 25 {
				key := fmt.Sprintf("late-%d-%s", i, randSuffix())
				old := claimReq("alice", key, "body", lease)
				if _, err := f.Store.Claim(ctx, old); err != nil {
					t.Fatal(err)
				}
				oldCtx, oldTx, err := f.Store.BeginTx(ctx, leaseOf(old))
				if err != nil {
					t.Fatal(err)
				}
				if err := f.WriteEffect(oldCtx, key+"/old"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(lease + 10*time.Millisecond)

				var (
					wg             sync.WaitGroup
					oldErr, newErr error
					newClaimed     bool
					gate           = make(chan struct{})
					fresh          = claimReq("alice", key, "body", lease)
				)
				wg.Go(func() {
					<-gate
					if i%2 == 0 {
						time.Sleep(time.Duration(i%5) * time.Millisecond)
					}
					oldErr = oldTx.Settle(ctx, created("old"))
				})
				wg.Go(func() {
					<-gate
					if i%2 == 1 {
						time.Sleep(time.Duration(i%5) * time.Millisecond)
					}
					res, err := f.Store.Claim(ctx, fresh)
					if err != nil {
						newErr = err
						return
					}
					if !res.Claimed {
						return
					}
					newClaimed = true
					txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(fresh))
					if err != nil {
						newErr = err
						return
					}
					defer func() { _ = tx.Rollback(ctx) }()
					if err := f.WriteEffect(txCtx, key+"/new"); err != nil {
						newErr = err
						return
					}
					newErr = tx.Settle(ctx, created("new"))
				})
				close(gate)
				wg.Wait()
				_ = oldTx.Rollback(ctx)
				if newErr != nil && !errors.Is(newErr, idemstore.ErrTransient) {
					t.Fatalf("iteration %d: new attempt: %v", i, newErr)
				}
				if oldErr != nil && !errors.Is(oldErr, idemstore.ErrLeaseLost) {
					t.Fatalf("iteration %d: old settle: %v", i, oldErr)
				}
				nOld, _ := f.CountEffects(ctx, key+"/old")
				nNew, _ := f.CountEffects(ctx, key+"/new")
				rec, err := f.Store.Get(ctx, "alice", key)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case oldErr == nil && !newClaimed && nOld == 1 && nNew == 0 && rec.LeaseToken == old.Token:
					wins["completion first"]++
				case errors.Is(oldErr, idemstore.ErrLeaseLost) && newClaimed && newErr == nil && nOld == 0 && nNew == 1 && rec.LeaseToken == fresh.Token:
					wins["takeover first"]++
				default:
					t.Fatalf("iteration %d: old settle %v, new claimed %v (%v), rows old %d new %d, record %s by %s",
						i, oldErr, newClaimed, newErr, nOld, nNew, rec.State, rec.LeaseToken)
				}
				if rec.State != idemstore.StateCompleted {
					t.Fatalf("iteration %d: record left %s", i, rec.State)
				}
			}
			t.Logf("%s: %v", d, wins)
		})
	}
}
