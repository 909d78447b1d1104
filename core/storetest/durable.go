package storetest

import (
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// durableRounds is how often each durability check repeats: a commit that
// did not wait for its flush is caught unless something else on the
// server flushed in the moment between the commit and the check, which on
// a shared server happens now and then, never every time.
const durableRounds = 20

// undurableStatements are what a handler may run, per dialect, to make its
// own transaction's commit (or its pooled session's) stop waiting for
// durability; the settle's commit must wait all the same.
var undurableStatements = map[string][]string{
	"postgres": {"SET LOCAL synchronous_commit = off", "SET synchronous_commit = off", "SET LOCAL synchronous_commit = local"},
}

// testDurable: with Backend.Durability, on sessions that start without
// the server's wait for durability, a Durable claim and a Keep return only
// once their write is durable; a settle does too, whatever the handler set
// for its transaction or its session; and an attempt's first DownstreamKey
// returns only once the claim it derives from is durable (a key must never
// reach a provider while the nonce it comes from can be lost).
func testDurable(t *testing.T, b Backend) {
	if b.Durability == nil {
		t.Skip("not applicable: the store's server has no durable write position to compare with (Backend.Durability)")
	}
	db, mark := b.Durability(t)
	ctx := ctxT(t)
	check := func(what string, i int, flushedPast func() bool) {
		t.Helper()
		if !flushedPast() {
			t.Fatalf("round %d: %s returned before what it wrote was durable", i, what)
		}
	}
	for i := range durableRounds {
		req := claimReq("alice", uniq("durable"), "body")
		req.Durable, req.Lease = true, time.Minute
		flushed := mark()
		if res := mustClaim(t, db.Store, req); !res.Claimed {
			t.Fatalf("round %d: durable claim: %+v", i, res)
		}
		check("a Durable claim", i, flushed)
		flushed = mark()
		if err := db.Store.Keep(ctx, leaseOf(req)); err != nil {
			t.Fatal(err)
		}
		check("Keep", i, flushed)
	}
	for _, stmt := range append([]string{""}, undurableStatements[db.Dialect]...) {
		what := "a settle"
		if stmt != "" {
			what += " after " + stmt
		}
		for i := range durableRounds {
			req, txCtx, tx := claimAndBegin(t, db)
			if stmt != "" {
				if err := db.Exec(txCtx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			if err := db.WriteEffect(txCtx, req.Key); err != nil {
				t.Fatal(err)
			}
			flushed := mark()
			if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("d")}); err != nil {
				t.Fatal(err)
			}
			check(what, i, flushed)
		}
	}
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: db.Store})
	if err != nil {
		t.Fatal(err)
	}
	for i := range durableRounds / 2 {
		key := uniq("downstream")
		flushed := mark() // before the claim, which commits without waiting
		att, resp := eng.Begin(ctx, idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice", Key: key,
			ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`)})
		if att == nil {
			t.Fatalf("round %d: %d %s", i, resp.Status, resp.Body)
		}
		func() {
			defer att.Abort()
			if i%2 == 1 {
				if err := db.WriteEffect(att.Context(), key); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := idem.DownstreamKey(att.Context(), "charge"); err != nil {
				t.Fatal(err)
			}
			check("an attempt's first DownstreamKey", i, flushed)
			att.Finish(idem.Result{Status: http.StatusCreated})
		}()
	}
}

// testSessionKeepsDurability: with Backend.DurabilitySetting, what a claim
// sets for its own commit (to wait for durability or not) stays in its
// transaction: claims, Durable or not, and a settle leave the session's
// setting as it was, so a pool hands the connection on unchanged, and the
// handler's transaction starts with the session's setting.
func testSessionKeepsDurability(t *testing.T, b Backend) {
	if b.DurabilitySetting == nil {
		t.Skip("not applicable: the store's server has no durability setting to read (Backend.DurabilitySetting)")
	}
	db, show := b.DurabilitySetting(t)
	ctx := ctxT(t)
	session := show(ctx)
	for _, durable := range []bool{false, true} {
		req := claimReq("alice", uniq("session"), "body")
		req.Durable = durable
		mustClaim(t, db.Store, req)
		if got := show(ctx); got != session {
			t.Fatalf("the session's setting after a claim (Durable %v) = %q, want %q", durable, got, session)
		}
	}
	_, txCtx, tx := claimAndBegin(t, db)
	if got := show(txCtx); got != session {
		t.Fatalf("the setting in the handler's transaction = %q, want the session's %q", got, session)
	}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: okResponse("s")}); err != nil {
		t.Fatal(err)
	}
	if got := show(ctx); got != session {
		t.Fatalf("the session's setting after a settle = %q, want %q", got, session)
	}
}
