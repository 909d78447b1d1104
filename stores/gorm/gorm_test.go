package idemgorm_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
	"gorm.io/gorm"
)

// The GORM layer's own tests: what GORM does with the *gorm.DB of Tx
// (Commit, Rollback, Begin, nested Transaction, PrepareStmt sessions).
// The store under it is idemsql's, tested there.

type fixture = idemgormtest.Fixture

// prepareModes are the two ways a *gorm.DB can be opened that change the
// pool GORM hands out: plain, and PrepareStmt (GORM wraps the pool in
// *gorm.PreparedStmtDB and transactions in *gorm.PreparedStmtTX).
var prepareModes = []bool{false, true}

// forEachVariant runs fn for every dialect and both PrepareStmt modes, on
// a fresh fixture.
func forEachVariant(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, d := range idemgormtest.Dialects {
		for _, prep := range prepareModes {
			t.Run(fmt.Sprintf("%s/PrepareStmt=%v", d, prep), func(t *testing.T) {
				db := idemgormtest.OpenDBVariant(t, d, idemgormtest.Variant{PrepareStmt: prep})
				fn(t, idemgormtest.NewFixtureOn(t, db, d))
			})
		}
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func created(id string) idemstore.Outcome {
	return idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"` + id + `"}`),
	}}
}

// begin claims a fresh key and begins its transaction.
func begin(t *testing.T, f *fixture) (idemstore.ClaimRequest, context.Context, idemstore.Tx, *gorm.DB) {
	t.Helper()
	ctx := testCtx(t)
	fp := sha256.Sum256([]byte("body"))
	s := idemgormtest.RandSuffix()
	req := idemstore.ClaimRequest{Principal: "alice", Key: "seal-" + s, Fingerprint: fp[:], Token: "tok-" + s,
		Nonce: "n-" + s, RequestID: "req-" + s, Lease: time.Minute, Retention: time.Hour}
	if res, err := f.Store.Claim(ctx, req); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	txCtx, tx, err := f.Store.BeginTx(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
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
	var n int64
	if err := f.DB.Raw("SELECT COUNT(*) FROM "+f.Effects+" WHERE id = ?", id).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n)
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
		if err := db.Commit().Error; !errors.Is(err, idemstore.ErrTxOwned) {
			t.Fatalf("Commit = %v, want ErrTxOwned", err)
		}
		if _, ok := db.Statement.ConnPool.(*sql.Tx); ok {
			t.Fatal("the handle's ConnPool is a *sql.Tx")
		}
		if _, ok := db.Statement.ConnPool.(gorm.TxBeginner); ok {
			t.Fatal("the handle's ConnPool can begin transactions")
		}
		if sqlDB, err := db.DB(); err == nil || sqlDB != nil || !errors.Is(err, idemstore.ErrTxOwned) {
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
		if err := db2.Rollback().Error; !errors.Is(err, idemstore.ErrTxOwned) {
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
		if !errors.Is(err, idemstore.ErrTxOwned) {
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
	for _, d := range idemgormtest.Dialects {
		t.Run(d, func(t *testing.T) {
			storetest.RunHostile(t, idemgormtest.NewBackendVariant(d, idemgormtest.Variant{PrepareStmt: true}))
		})
	}
}
