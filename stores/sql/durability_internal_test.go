package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// pgStore opens PostgreSQL through pgx's stdlib on a pool of at most
// conns connections, whose sessions start with the run-time parameters
// params ("name=value"), and a store on a fresh table, dropped afterwards.
func pgStore(t *testing.T, conns int, params ...string) (*Store, *sql.DB) {
	t.Helper()
	return pgStoreOn(t, "pgx", conns, params...)
}

// pgStoreOn is pgStore through the database/sql driver named driver
// ("pgx" or lib/pq's "postgres").
func pgStoreOn(t *testing.T, driver string, conns int, params ...string) (*Store, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("IDEM_PG_DSN")
	if dsn == "" {
		dsn = "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
	}
	for _, p := range params {
		dsn += " " + p
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("PostgreSQL unreachable (IDEM_PG_DSN): %v", err)
	}
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { _ = db.Close() })
	return pgStoreOnDB(t, db), db
}

// pgStoreOnDB is a store on db on a fresh table, dropped afterwards.
func pgStoreOnDB(t *testing.T, db *sql.DB) *Store {
	t.Helper()
	s, err := New(db, WithTable("idem_dur_"+suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + s.Table()) })
	return s
}

// showSync reads synchronous_commit where db runs (a session, a
// transaction).
func showSync(t *testing.T, db querier) string {
	t.Helper()
	var v string
	if err := db.QueryRowContext(context.Background(), "SHOW synchronous_commit").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// flushedTo reports whether PostgreSQL's flushed WAL has reached lsn.
func flushedTo(t *testing.T, db querier, lsn string) bool {
	t.Helper()
	var durable bool
	if err := db.QueryRowContext(context.Background(), "SELECT pg_catalog.pg_current_wal_flush_lsn() >= CAST($1 AS pg_lsn)", lsn).Scan(&durable); err != nil {
		t.Fatal(err)
	}
	return durable
}

// TestPostgresSyncOnTheTxConnection: the Tx of a PostgreSQL attempt is an
// idemstore.Syncer whose Sync returns once the claim before it is durable, on
// the transaction's own connection: the pool here has one connection,
// which the transaction holds, so a Sync that asked the pool for another
// would wait until its context ended. Five claims, each checked within
// milliseconds of its claim, well inside the WAL writer's 200 ms delay, so
// a Sync that returned at once would be caught.
func TestPostgresSyncOnTheTxConnection(t *testing.T) {
	s, db := pgStore(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 5 {
		r := req("sync-"+suffix(), "body", "tok-"+suffix(), time.Minute, time.Hour)
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		var claimed string // at or past the claim's commit record
		if err := db.QueryRowContext(context.Background(), "SELECT pg_catalog.pg_current_wal_insert_lsn()::text").Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		txCtx, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
		if err != nil {
			t.Fatal(err)
		}
		// Before the table's cleanup, which needs the pool's connection.
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		syncer, ok := tx.(idemstore.Syncer)
		if !ok {
			t.Fatalf("the PostgreSQL Tx (%T) is not an idemstore.Syncer", tx)
		}
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		err = syncer.Sync(sctx)
		scancel()
		if err != nil {
			t.Fatalf("sync with the pool's one connection held by the transaction: %v", err)
		}
		// The transaction goes on after Sync.
		htx, _ := Tx(txCtx)
		if err := execOn(htx, "SELECT 1"); err != nil {
			t.Fatalf("a statement after Sync: %v", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if !flushedTo(t, db, claimed) {
			t.Fatalf("claim %d: Sync returned before its WAL (up to %s) was flushed", i, claimed)
		}
	}

	// Sync after the transaction ended, or after a failed statement, runs
	// nothing.
	r := req("sync-"+suffix(), "body", "tok-"+suffix(), time.Minute, time.Hour)
	if _, err := s.Claim(ctx, r); err != nil {
		t.Fatal(err)
	}
	txCtx, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
	if err != nil {
		t.Fatal(err)
	}
	htx, _ := Tx(txCtx)
	_ = execOn(htx, "SELECT 1/0")
	if err := tx.(idemstore.Syncer).Sync(ctx); !errors.Is(err, idemstore.ErrTxAborted) {
		t.Fatalf("Sync after a failed statement = %v, want idemstore.ErrTxAborted", err)
	}
	_ = tx.Rollback(ctx)
	if err := tx.(idemstore.Syncer).Sync(ctx); err == nil || !strings.Contains(err.Error(), "finished") {
		t.Fatalf("Sync after Rollback = %v, want the transaction finished", err)
	}
}

// TestPostgresDurableClaimCommitsSynchronously: a trigger on the store's
// table records synchronous_commit as each write of the store sees it, on
// sessions whose own default is off. A claim runs with it off unless
// Durable, whether it inserts or takes a row over (a stale claim, a
// released record: the next BeginTx records a WAL position past the
// takeover, so a Sync covers it as it covers an insert); Keep, whose
// durability nothing later waits for, runs with it on.
func TestPostgresDurableClaimCommitsSynchronously(t *testing.T) {
	s, db := pgStore(t, 4, "synchronous_commit=off")
	if got := showSync(t, db); got != "off" {
		t.Fatalf("the sessions start with synchronous_commit %q, want off", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := s.Table() + "_seen"
	fn := "idem_seen_" + suffix()
	for _, q := range []string{
		"CREATE TABLE " + seen + " (token text, op text, sync text)",
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " + seen +
			" VALUES (NEW.lease_token, TG_OP, current_setting('synchronous_commit')); RETURN NEW; END $$",
		"CREATE TRIGGER " + fn + " AFTER INSERT OR UPDATE ON " + s.Table() + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		if err := execErr(db, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + seen)
		_, _ = db.Exec("DROP FUNCTION IF EXISTS " + fn + "() CASCADE")
	})
	sawSync := func(token string) string {
		t.Helper()
		var v []string
		rows, err := db.Query("SELECT sync FROM "+seen+" WHERE token = $1", token)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var x string
			if err := rows.Scan(&x); err != nil {
				t.Fatal(err)
			}
			v = append(v, x)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(v) != 1 {
			t.Fatalf("the trigger saw %d writes with token %q, want 1", len(v), token)
		}
		return v[0]
	}
	claim := func(r idemstore.ClaimRequest, reclaim bool) {
		t.Helper()
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed || res.Reclaimed != reclaim {
			t.Fatalf("claim %s: %+v %v", r.Token, res, err)
		}
	}

	async := req("durable-"+suffix(), "body", "async-"+suffix(), 10*time.Millisecond, time.Hour)
	claim(async, false)
	if got := sawSync(async.Token); got != "off" {
		t.Fatalf("a claim that is not Durable ran with synchronous_commit %q, want off", got)
	}
	durable := req("durable-"+suffix(), "body", "durable-"+suffix(), time.Hour, time.Hour)
	durable.Durable = true
	claim(durable, false)
	if got := sawSync(durable.Token); got != "on" {
		t.Fatalf("a Durable claim ran with synchronous_commit %q, want on", got)
	}

	time.Sleep(20 * time.Millisecond) // async's lease ends
	takeover := req(async.Key, "body", "takeover-"+suffix(), time.Hour, time.Hour)
	claim(takeover, true)
	if got := sawSync(takeover.Token); got != "off" {
		t.Fatalf("a takeover that is not Durable ran with synchronous_commit %q, want off", got)
	}
	if err := s.Keep(ctx, leaseOfReq(takeover)); err != nil {
		t.Fatal(err)
	}
	var kept string
	if err := db.QueryRowContext(context.Background(), "SELECT sync FROM "+seen+" WHERE token = $1 ORDER BY ctid DESC LIMIT 1", takeover.Token).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != "on" {
		t.Fatalf("Keep ran with synchronous_commit %q, want on", kept)
	}
	if err := s.Release(ctx, leaseOfReq(durable)); err != nil {
		t.Fatal(err)
	}
	freed := req(durable.Key, "other body", "freed-"+suffix(), time.Hour, time.Hour)
	freed.Durable = true
	claim(freed, false)
	if got := sawSync(freed.Token); got != "on" {
		t.Fatalf("the Durable claim of a released record ran with synchronous_commit %q, want on", got)
	}
}

func leaseOfReq(r idemstore.ClaimRequest) idemstore.Lease {
	return idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

// querier is what showSync and flushedTo read through: the *sql.DB or the
// handle.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// execOn runs q through the handle h and returns its error.
func execOn(h *Handle, q string) error {
	_, err := h.ExecContext(context.Background(), q)
	return err
}

// TestPostgresSettleOneByOne: on a driver that cannot send the settle's
// settings, the settle and COMMIT as one query string, they run one by one
// with the same guarantees: the outcome is stored with the handler's write,
// and a settle whose lease was taken over returns idemstore.ErrLeaseLost
// and commits nothing of the handler's.
func TestPostgresSettleOneByOne(t *testing.T) {
	s, db := pgStore(t, 2)
	s.pgScript = false
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	effects := "idem_dur_fx_" + suffix()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+effects+" (k text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + effects) })
	outcome := idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 201, Body: []byte("done")}}
	for _, lose := range []bool{false, true} {
		r := req("one-"+suffix(), "body", "tok-"+suffix(), 20*time.Millisecond, time.Hour)
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		txCtx, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
		if err != nil {
			t.Fatal(err)
		}
		htx, _ := Tx(txCtx)
		if err := execOn(htx, "INSERT INTO "+effects+" VALUES ('"+r.Key+"')"); err != nil {
			t.Fatal(err)
		}
		if lose {
			time.Sleep(30 * time.Millisecond)
			next := req(r.Key, "body", "tok-"+suffix(), time.Minute, time.Hour)
			if res, err := s.Claim(ctx, next); err != nil || !res.Reclaimed {
				t.Fatalf("takeover: %+v %v", res, err)
			}
		}
		err = tx.Settle(ctx, outcome)
		var n int
		if qerr := db.QueryRowContext(ctx, "SELECT count(*) FROM "+effects+" WHERE k = $1", r.Key).Scan(&n); qerr != nil {
			t.Fatal(qerr)
		}
		rec, gerr := s.Get(ctx, r.Principal, r.Key)
		switch {
		case lose && (!errors.Is(err, idemstore.ErrLeaseLost) || n != 0):
			t.Fatalf("settle after a takeover = %v with %d handler writes committed, want idemstore.ErrLeaseLost and none", err, n)
		case !lose && (err != nil || n != 1 || gerr != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "done"):
			t.Fatalf("settle = %v, %d handler writes, record %+v %v; want the outcome stored with the write", err, n, rec, gerr)
		}
	}
}
