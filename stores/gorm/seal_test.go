package idemgorm_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
	"gorm.io/gorm"
)

// prepareModes are the two ways a *gorm.DB can be opened that change the
// pool GORM hands out: plain, and PrepareStmt (GORM wraps the pool in
// *gorm.PreparedStmtDB and transactions in *gorm.PreparedStmtTX).
var prepareModes = []bool{false, true}

// forEachVariant runs fn for every dialect and both PrepareStmt modes, on
// a fresh fixture.
func forEachVariant(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, d := range dialects {
		for _, prep := range prepareModes {
			t.Run(fmt.Sprintf("%s/PrepareStmt=%v", d, prep), func(t *testing.T) {
				db := idemgormtest.OpenDBVariant(t, d, idemgormtest.Variant{PrepareStmt: prep})
				fn(t, idemgormtest.NewFixtureOn(t, db, d))
			})
		}
	}
}

// begin claims a fresh key and begins its transaction.
func begin(t *testing.T, f *fixture) (idemstore.ClaimRequest, context.Context, idemstore.Tx, *gorm.DB) {
	t.Helper()
	ctx := testCtx(t)
	req := claimReq("alice", "seal-"+randSuffix(), "body", time.Minute)
	if res, err := f.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	db, ok := idemgorm.Tx(txCtx)
	if !ok {
		t.Fatal("no transaction in the context BeginTx returned")
	}
	return req, txCtx, tx, db
}

func insertEffect(db *gorm.DB, f *fixture, id string) error {
	return db.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", id).Error
}

func count(t *testing.T, f *fixture, id string) int {
	t.Helper()
	n, err := f.CountEffects(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHandleCannotEndTheTransaction: Commit and Rollback on the handle are
// refused, the *sql.Tx and the *sql.DB are not handed out, and a refused
// COMMIT statement never reaches the server (the write before it is still
// uncommitted, invisible from outside).
func TestHandleCannotEndTheTransaction(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		ctx := testCtx(t)
		req, _, tx, db := begin(t, f)
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatal(err)
		}
		if err := db.Commit().Error; !errors.Is(err, idemgorm.ErrTxOwned) {
			t.Fatalf("Commit = %v, want ErrTxOwned", err)
		}
		if _, ok := db.Statement.ConnPool.(*sql.Tx); ok {
			t.Fatal("the handle's ConnPool is a *sql.Tx")
		}
		if _, ok := db.Statement.ConnPool.(gorm.TxBeginner); ok {
			t.Fatal("the handle's ConnPool can begin transactions")
		}
		if sqlDB, err := db.DB(); err == nil || sqlDB != nil || !errors.Is(err, idemgorm.ErrTxOwned) {
			t.Fatalf("db.DB() = %v, %v; want no *sql.DB and ErrTxOwned", sqlDB, err)
		}
		if err := db.Connection(func(*gorm.DB) error { return nil }); err == nil {
			t.Fatal("db.Connection on the handle succeeded")
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("the write is visible from outside after a refused Commit: %d", n)
		}
		// (db.Begin() on the handle: TestBeginOnTheHandle.)
		// After a refused Commit the transaction is intact and settles.
		if err := tx.Settle(ctx, created(req.Key)); err != nil {
			t.Fatalf("settle after a refused Commit: %v", err)
		}
		if n := count(t, f, req.Key); n != 1 {
			t.Fatalf("%d effects after settle, want 1", n)
		}
		// The handle is finished after Settle.
		if err := insertEffect(db, f, req.Key); err == nil {
			t.Fatal("a statement ran on the handle after Settle")
		}

		// Rollback is refused too, and nothing is stored.
		req2, _, tx2, db2 := begin(t, f)
		if err := insertEffect(db2, f, req2.Key); err != nil {
			t.Fatal(err)
		}
		if err := db2.Rollback().Error; !errors.Is(err, idemgorm.ErrTxOwned) {
			t.Fatalf("Rollback = %v, want ErrTxOwned", err)
		}
		if n := count(t, f, req2.Key); n != 0 {
			t.Fatalf("the write is visible from outside after a refused Rollback: %d", n)
		}
		if err := tx2.Settle(ctx, created(req2.Key)); err == nil || errors.Is(err, idemstore.ErrTxEnded) {
			t.Fatalf("settle after Rollback = %v, want a plain error (nothing stored, key released)", err)
		}
		if rec, err := f.Store.Get(ctx, "alice", req2.Key); err != nil || rec.State != idemstore.StateInProgress {
			t.Fatalf("record after a refused Rollback: %+v %v", rec, err)
		}
		if n := count(t, f, req2.Key); n != 0 {
			t.Fatalf("%d effects after a Rollback, want 0", n)
		}
	})
}

// TestRefusedStatementsNeverReachTheServer: statements that would commit
// are refused before they reach the server. On MySQL a CREATE TABLE (which
// commits implicitly) leaves no table behind; everywhere a COMMIT leaves
// the earlier write uncommitted.
func TestRefusedStatementsNeverReachTheServer(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		req, _, tx, db := begin(t, f)
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatal(err)
		}
		stmts := []string{"COMMIT", "/* x */ commit", "SELECT 1; COMMIT", "ROLLBACK", "BEGIN"}
		if f.Dialect == "mysql" {
			stmts = append(stmts, "CREATE TABLE "+f.Effects+"_ddl (id INT)", "SET autocommit = 1", "/*!COMMIT*/")
		}
		for _, q := range stmts {
			if err := db.Exec(q).Error; !errors.Is(err, idemgorm.ErrTxOwned) {
				t.Fatalf("Exec(%q) = %v, want ErrTxOwned", q, err)
			}
			if n := count(t, f, req.Key); n != 0 {
				t.Fatalf("after %q the write is visible from outside", q)
			}
		}
		if f.Dialect == "mysql" {
			var n int64
			if err := f.DB.Raw("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
				f.Effects+"_ddl").Scan(&n).Error; err != nil || n != 0 {
				t.Fatalf("the refused CREATE TABLE reached the server: %d tables, %v", n, err)
			}
		}
		// A refused statement is a failed statement: nothing is stored.
		if err := tx.Settle(testCtx(t), created(req.Key)); err == nil {
			t.Fatal("settle after refused statements succeeded")
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("%d effects committed", n)
		}
	})
}

// TestBeginOnTheHandle: db.Begin() on the handle, the GORM habit, gives a
// working *gorm.DB in the idempotency transaction, never GORM's "invalid
// transaction": its Commit waits for the store's, so the write commits
// with the stored outcome; its Rollback is refused with ErrTxOwned and the
// settle stores nothing (its write is not committed); options the store
// cannot honour are refused.
func TestBeginOnTheHandle(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		ctx := testCtx(t)

		req, _, tx, db := begin(t, f)
		began := db.Begin()
		if began.Error != nil {
			t.Fatalf("Begin on the handle: %v", began.Error)
		}
		if err := insertEffect(began, f, req.Key); err != nil {
			t.Fatalf("a write through the begun db: %v", err)
		}
		if err := began.Commit().Error; err != nil {
			t.Fatalf("Commit of the begun db: %v", err)
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("the begun db's Commit committed the write before the settle (%d rows)", n)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); err != nil {
			t.Fatalf("settle: %v", err)
		}
		if n := count(t, f, req.Key); n != 1 {
			t.Fatalf("after the settle: %d rows, want the begun db's write committed with the outcome", n)
		}

		req, _, tx, db = begin(t, f)
		began = db.Begin()
		if err := insertEffect(began, f, req.Key); err != nil {
			t.Fatal(err)
		}
		if err := began.Rollback().Error; !errors.Is(err, idem.ErrTxOwned) {
			t.Fatalf("Rollback of the begun db = %v, want an error wrapping idem.ErrTxOwned", err)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201}}); !errors.Is(err, idem.ErrTxOwned) {
			t.Fatalf("settle after the begun db's Rollback = %v, want an error wrapping idem.ErrTxOwned", err)
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("after a refused Rollback: %d rows committed, want none", n)
		}

		_, _, _, db = begin(t, f)
		if err := db.Begin(&sql.TxOptions{ReadOnly: true}).Error; !errors.Is(err, idem.ErrTxOwned) {
			t.Fatalf("Begin(read only) = %v, want an error wrapping idem.ErrTxOwned", err)
		}
	})
}

// TestNestedTransactionsAreSavepoints: GORM's Transaction on the handle
// nests with savepoints: a nested commit stays in the outer transaction, a
// nested rollback undoes only its own writes, also after a failed
// statement inside it.
func TestNestedTransactionsAreSavepoints(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		ctx := testCtx(t)
		req, _, tx, db := begin(t, f)
		k := req.Key
		if err := db.Transaction(func(tx2 *gorm.DB) error { return insertEffect(tx2, f, k+"/a") }); err != nil {
			t.Fatalf("nested commit: %v", err)
		}
		boom := errors.New("boom")
		if err := db.Transaction(func(tx2 *gorm.DB) error {
			if err := insertEffect(tx2, f, k+"/b"); err != nil {
				return err
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("nested rollback: %v", err)
		}
		// A failing statement inside a nested transaction, returned as
		// its error: the savepoint recovers the outer transaction.
		if err := db.Transaction(func(tx2 *gorm.DB) error {
			if err := insertEffect(tx2, f, k+"/c"); err != nil {
				return err
			}
			return tx2.Exec("INSERT INTO idem_no_such_table VALUES (1)").Error
		}); err == nil {
			t.Fatal("the failing nested transaction succeeded")
		}
		// Two levels.
		if err := db.Transaction(func(tx2 *gorm.DB) error {
			if err := insertEffect(tx2, f, k+"/d"); err != nil {
				return err
			}
			_ = tx2.Transaction(func(tx3 *gorm.DB) error {
				_ = insertEffect(tx3, f, k+"/e")
				return boom
			})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := insertEffect(db, f, k+"/f"); err != nil {
			t.Fatalf("a write after the nested transactions: %v", err)
		}
		if err := tx.Settle(ctx, created(k)); err != nil {
			t.Fatalf("settle: %v", err)
		}
		for id, want := range map[string]int{"/a": 1, "/b": 0, "/c": 0, "/d": 1, "/e": 0, "/f": 1} {
			if n := count(t, f, k+id); n != want {
				t.Errorf("effect %s: %d rows, want %d", id, n, want)
			}
		}
	})
}

// TestFailedStatementAbortsTheTransaction: after any failed statement on
// the handle every later statement is refused with ErrTxAborted and Settle
// stores nothing, on every dialect, as on PostgreSQL; a ROLLBACK TO
// SAVEPOINT taken before the failure recovers; gorm.ErrRecordNotFound is
// not a failure.
func TestFailedStatementAbortsTheTransaction(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		ctx := testCtx(t)

		// Not found is no failure.
		req, _, tx, db := begin(t, f)
		var row struct{ ID string }
		if err := db.Table(f.Effects).Where("id = ?", "nobody").First(&row).Error; !errors.Is(err, gorm.ErrRecordNotFound) {
			t.Fatalf("First on no row = %v", err)
		}
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatalf("a write after ErrRecordNotFound: %v", err)
		}
		if err := tx.Settle(ctx, created(req.Key)); err != nil {
			t.Fatalf("settle after ErrRecordNotFound: %v", err)
		}

		// A swallowed failure aborts.
		req, _, tx, db = begin(t, f)
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("INSERT INTO idem_no_such_table VALUES (1)").Error; err == nil {
			t.Fatal("the failing statement succeeded")
		}
		if err := insertEffect(db, f, req.Key+"/after"); !errors.Is(err, idemgorm.ErrTxAborted) {
			t.Fatalf("a write after a failed statement = %v, want ErrTxAborted", err)
		}
		var one int
		if err := db.Raw("SELECT 1").Scan(&one).Error; !errors.Is(err, idemgorm.ErrTxAborted) {
			t.Fatalf("a read after a failed statement = %v, want ErrTxAborted", err)
		}
		if err := tx.Settle(ctx, created(req.Key)); err == nil {
			t.Fatal("settle after a failed statement succeeded")
		}
		if n := count(t, f, req.Key) + count(t, f, req.Key+"/after"); n != 0 {
			t.Fatalf("%d effects committed by an aborted transaction", n)
		}

		// A failure while reading rows aborts too: the error comes after
		// the first rows (SQLite: integer overflow on the third row;
		// PostgreSQL: division by zero on the third; MySQL: a
		// conversion error in strict mode on the third).
		req, _, tx, db = begin(t, f)
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatal(err)
		}
		q := map[string]string{
			"sqlite":   "SELECT CASE WHEN i = 3 THEN abs(-9223372036854775807 - 1) ELSE i END FROM (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3)",
			"postgres": "SELECT 1 / (3 - i) FROM generate_series(1, 5) AS i",
			"mysql":    "SELECT (SELECT 1 UNION ALL SELECT i) FROM (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3) AS t",
		}[f.Dialect]
		rows, err := db.Raw(q).Rows()
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			_ = rows.Close()
		}
		if err == nil {
			t.Fatalf("%s: the row-reading failure did not happen", f.Dialect)
		}
		if err := insertEffect(db, f, req.Key+"/after"); !errors.Is(err, idemgorm.ErrTxAborted) {
			t.Fatalf("a write after a failure while reading rows = %v, want ErrTxAborted", err)
		}
		if err := tx.Settle(ctx, created(req.Key)); err == nil {
			t.Fatal("settle after a failure while reading rows succeeded")
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("%d effects committed", n)
		}

		// ROLLBACK TO a savepoint taken before the failure recovers.
		req, _, tx, db = begin(t, f)
		if err := insertEffect(db, f, req.Key); err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("SAVEPOINT before_failure").Error; err != nil {
			t.Fatal(err)
		}
		if err := insertEffect(db, f, req.Key+"/undone"); err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("SELECT no_such_column FROM " + f.Effects).Error; err == nil {
			t.Fatal("the failing statement succeeded")
		}
		if err := db.Exec("ROLLBACK TO SAVEPOINT no_such_savepoint").Error; !errors.Is(err, idemgorm.ErrTxAborted) {
			t.Fatalf("ROLLBACK TO an unknown savepoint = %v, want ErrTxAborted", err)
		}
		if err := db.Exec("ROLLBACK TO SAVEPOINT before_failure").Error; err != nil {
			t.Fatalf("ROLLBACK TO SAVEPOINT: %v", err)
		}
		if err := insertEffect(db, f, req.Key+"/recovered"); err != nil {
			t.Fatalf("a write after recovering: %v", err)
		}
		if err := tx.Settle(ctx, created(req.Key)); err != nil {
			t.Fatalf("settle after recovering: %v", err)
		}
		for id, want := range map[string]int{"": 1, "/undone": 0, "/recovered": 1} {
			if n := count(t, f, req.Key+id); n != want {
				t.Errorf("effect %q: %d, want %d", id, n, want)
			}
		}
	})
}

// TestPrepareStmtSessionOnTheHandleIsRefused: a gorm.Session{PrepareStmt:
// true} made from the handle would run prepared statements the store
// cannot see (or, for statements GORM prepared on the pool, outside the
// transaction): it is refused, and nothing it tried ran anywhere.
func TestPrepareStmtSessionOnTheHandleIsRefused(t *testing.T) {
	forEachVariant(t, func(t *testing.T, f *fixture) {
		q := "INSERT INTO " + f.Effects + " (id) VALUES (?)"
		// Prime GORM's statement cache with the same text on the pool.
		if err := f.DB.Session(&gorm.Session{PrepareStmt: true}).Exec(q, "primed").Error; err != nil {
			t.Fatal(err)
		}
		req, _, tx, db := begin(t, f)
		err := db.Session(&gorm.Session{PrepareStmt: true}).Exec(q, req.Key).Error
		if !errors.Is(err, idemgorm.ErrTxOwned) {
			t.Fatalf("Exec through a PrepareStmt session of the handle = %v, want ErrTxOwned", err)
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("the refused statement ran outside the transaction: %d rows", n)
		}
		if err := tx.Settle(testCtx(t), created(req.Key)); err == nil {
			t.Fatal("settle after a refused statement succeeded")
		}
		if n := count(t, f, req.Key); n != 0 {
			t.Fatalf("%d effects committed", n)
		}
	})
}

// TestHostilePrepareStmt runs core/storetest's hostile-handler section on
// *gorm.DBs opened with PrepareStmt: true.
func TestHostilePrepareStmt(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			storetest.RunHostile(t, idemgormtest.NewBackendVariant(d, idemgormtest.Variant{PrepareStmt: true}))
		})
	}
}

// TestHeadersByteExact: header names and values with NUL bytes, invalid
// UTF-8 and several values are replayed byte for byte.
func TestHeadersByteExact(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			ctx := testCtx(t)
			req := claimReq("alice", "hdr-"+randSuffix(), "body", time.Minute)
			if _, err := f.Store.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			_, tx, err := f.Store.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{
				"Content-Type": {"application/json"},
				"X-Nul":        {"a\x00b"},
				"X-Bad-Utf8":   {"\xff\xfe\xfd", "\u0000"},
				"X-Empty":      {""},
				"X-Many":       {"1", "2", "3"},
			}
			out := idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Header: h, Body: []byte("\x00\xff")}}
			if err := tx.Settle(ctx, out); err != nil {
				t.Fatal(err)
			}
			rec, err := f.Store.Get(ctx, "alice", req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%q", rec.Response.Header) != fmt.Sprintf("%q", h) || string(rec.Response.Body) != "\x00\xff" {
				t.Fatalf("stored %q %q, want %q %q", rec.Response.Header, rec.Response.Body, h, "\x00\xff")
			}
		})
	}
}

// TestTxUsed: Used reports whether the handler ran anything through the
// handle; the store's own statements do not count.
func TestTxUsed(t *testing.T) {
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			f := newFixture(t, d)
			_, _, tx, db := begin(t, f)
			if tx.Used() {
				t.Fatal("Used before the handler ran anything")
			}
			var one int
			if err := db.Raw("SELECT 1").Scan(&one).Error; err != nil {
				t.Fatal(err)
			}
			if !tx.Used() {
				t.Fatal("not Used after a SELECT through the handle")
			}
		})
	}
}

// refusedEverywhere is a sanity check of the test helpers: the handle's
// error names what was refused.
func TestRefusalSaysWhy(t *testing.T) {
	f := newFixture(t, "sqlite")
	_, _, _, db := begin(t, f)
	err := db.Exec("COMMIT").Error
	if err == nil || !strings.Contains(err.Error(), "COMMIT") {
		t.Fatalf("refusal %v does not name the statement", err)
	}
}
