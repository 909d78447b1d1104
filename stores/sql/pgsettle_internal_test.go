package idemsql

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// pgRequest runs one request's store calls on s by hand: a claim of key,
// BeginTx, the handler's write of key into effects through the handle
// (after a SET LOCAL standard_conforming_strings = off of its own), then
// meddle, if any, on the transaction, and the settle of outcome. It
// returns whether the transaction ran with the session's prepared
// statements, and the settle's error.
func pgRequest(t *testing.T, s *Store, effects, principal, key string, outcome idemstore.Outcome,
	meddle func(*storeTx)) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := req(key, "body", "tok-"+suffix(), time.Minute, time.Hour)
	r.Principal = principal
	if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
		t.Fatalf("claim of %q: %+v %v", key, res, err)
	}
	txCtx, tx, err := s.BeginTx(ctx, leaseOfReq(r))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	h, _ := Tx(txCtx)
	if err := execOn(h, "SET LOCAL standard_conforming_strings = off"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.ExecContext(txCtx, "INSERT INTO "+effects+" VALUES ($1)", key); err != nil {
		t.Fatal(err)
	}
	st := tx.(pgTx).storeTx
	prepared := st.prepared
	if meddle != nil {
		meddle(st)
	}
	return prepared, tx.Settle(ctx, outcome)
}

// effectsTable creates a table for the handler's writes on db, dropped
// afterwards, and returns its name.
func effectsTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	effects := "idem_set_fx_" + suffix()
	if _, err := db.Exec("CREATE TABLE " + effects + " (k text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + effects) })
	return effects
}

// committed counts the handler's writes of key in effects.
func committed(t *testing.T, db *sql.DB, effects, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM "+effects+" WHERE k = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPostgresSettlePreparedInTheSession: through pgx's stdlib and lib/pq
// a session's first transaction begins and settles as text and gives the
// session the store's prepared statements, which its later transactions
// run. Either way the values reach the table byte for byte, whatever they
// hold (quotes, backslashes, non-ASCII text, NUL bytes) and although the
// handler turned standard_conforming_strings off, and the handler's write
// commits with the outcome.
func TestPostgresSettlePreparedInTheSession(t *testing.T) {
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			s, db := pgStoreOn(t, driver, 1)
			effects := effectsTable(t, db)
			outcome := idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201,
				Header: http.Header{"X-Odd": {`it's \ "ĉi tie"` + "\x00\xff"}},
				Body:   []byte("{\"a\":\"it's \\\\ \x00 \xff ключ\"}")}}
			principal := "bob's" // ASCII with a quote
			for i, want := range []bool{false, true, true, true} {
				key := "k" + suffix() + `\x41` // ASCII with a backslash
				switch i {
				case 2:
					key = "ключ-" + suffix()
				case 3:
					key = "plain-" + suffix() // a key that travels as it is
				}
				prepared, err := pgRequest(t, s, effects, principal, key, outcome, nil)
				if err != nil || prepared != want {
					t.Fatalf("request %d: settle = %v with prepared statements %v, want nil and %v", i, err, prepared, want)
				}
				rec, err := s.Get(context.Background(), principal, key)
				switch {
				case err != nil:
					t.Fatal(err)
				case rec.State != idemstore.StateCompleted || rec.Response.Status != 201 ||
					!bytes.Equal(rec.Response.Body, outcome.Response.Body) ||
					rec.Response.Header.Get("X-Odd") != outcome.Response.Header.Get("X-Odd"):
					t.Fatalf("request %d: stored %+v, want %+v", i, rec, outcome)
				case committed(t, db, effects, key) != 1:
					t.Fatalf("request %d: the handler's write did not commit with the outcome", i)
				}
			}
		})
	}
}

// TestPostgresSettleWithoutItsStatement: a session whose prepared settle
// was removed behind the store's back (a DEALLOCATE the handle did not
// see) fails the settle, commits nothing of the handler's and leaves the
// record in progress; the connection is not pooled again, so the next
// request runs and settles.
func TestPostgresSettleWithoutItsStatement(t *testing.T) {
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			s, db := pgStoreOn(t, driver, 1)
			effects := effectsTable(t, db)
			outcome := idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("ok")}}
			if _, err := pgRequest(t, s, effects, "alice", "warm-"+suffix(), outcome, nil); err != nil {
				t.Fatal(err)
			}
			key := "gone-" + suffix()
			prepared, err := pgRequest(t, s, effects, "alice", key, outcome, func(st *storeTx) {
				if _, err := st.conn.ExecContext(context.Background(), "DEALLOCATE "+s.q.pg.session.settle); err != nil {
					t.Fatal(err)
				}
			})
			rec, gerr := s.Get(context.Background(), "alice", key)
			switch {
			case !prepared:
				t.Fatal("the second transaction on the session did not run the prepared statements")
			case err == nil || errors.Is(err, idemstore.ErrLeaseLost):
				t.Fatalf("settle without its prepared statement = %v, want an error other than ErrLeaseLost", err)
			case gerr != nil || rec.State != idemstore.StateInProgress:
				t.Fatalf("record after the failed settle: %+v %v, want it in progress", rec, gerr)
			case committed(t, db, effects, key) != 0:
				t.Fatal("the handler's write committed without the outcome")
			}
			if _, err := pgRequest(t, s, effects, "alice", "next-"+suffix(), outcome, nil); err != nil {
				t.Fatalf("the request after the failed settle: %v", err)
			}
		})
	}
}

// TestPostgresTwoStoresOneSession: two stores on two tables share one
// pooled connection; each gives the session its own statements, and
// finding one store's does not make the other run statements the session
// lacks.
func TestPostgresTwoStoresOneSession(t *testing.T) {
	a, db := pgStore(t, 1)
	b := pgStoreOnDB(t, db)
	effects := effectsTable(t, db)
	outcome := idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("ok")}}
	for i, s := range []*Store{a, b, a, b} {
		if prepared, err := pgRequest(t, s, effects, "alice", "two-"+suffix(), outcome, nil); err != nil || prepared != (i >= 2) {
			t.Fatalf("request %d: settle = %v with prepared statements %v, want nil and %v", i, err, prepared, i >= 2)
		}
	}
}
