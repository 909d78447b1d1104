package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestSessionChangesDoNotReachTheStore: every connection of the store's
// pool carries session settings a handler may have left behind: a
// search_path that puts a schema of look-alikes before pg_catalog (a now()
// from the year 2000 and a count(*) that always answers 1, which would
// defeat the settle's fence), another TimeZone, DateStyle, IntervalStyle
// and bytea_output, and short lock and statement timeouts. Under both the
// extended and the simple protocol (where results are text), core/storetest's
// claim, replay, fence, stale listing and purge cases pass as on a clean
// session, and the session's lock and statement timeouts do not apply.
func TestSessionChangesDoNotReachTheStore(t *testing.T) {
	t.Parallel()
	base := newPool(t, 4, nil)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			storetest.RunCases(t, func(t testing.TB) storetest.Backend {
				clean, polluted := pollutedEnv(t, base, mode)
				b := polluted.Backend()
				b.CountEffects = clean.CountEffects // on a clean session: count(*) has a look-alike
				return b
			}, "ClaimNewKey", "ResponseRoundTrip", "StaleHolderSettleIsFenced", "ListStale", "PurgeExpired")

			// The session's 10 ms lock timeout and 150 ms statement
			// timeout do not apply: a release waits for a row held 400
			// ms, as the store's own timeouts allow.
			ctx := testCtx(t)
			clean, polluted := pollutedEnv(t, base, mode)
			held := claimReq("alice", "held-"+randHex(4), "body", time.Minute)
			if _, err := polluted.Store.Claim(ctx, held); err != nil {
				t.Fatal(err)
			}
			locker := holdRow(t, ctx, base, clean.Store.Table(), held.Principal, held.Key)
			unlocked := make(chan struct{})
			go func() {
				defer close(unlocked)
				time.Sleep(400 * time.Millisecond)
				_ = locker.Rollback(context.Background())
			}()
			start := time.Now()
			err := polluted.Store.Release(ctx, leaseOf(held))
			<-unlocked
			if err != nil {
				t.Fatalf("release behind a row lock held 400 ms: %v", err)
			}
			if waited := time.Since(start); waited < 300*time.Millisecond {
				t.Fatalf("release returned after %v: the row lock was not held?", waited)
			}
		})
	}
}

// pollutedEnv makes a fresh schema through base (clean) and a store on it
// whose own pool of 3 connections, in mode, starts every session with the
// settings TestSessionChangesDoNotReachTheStore describes (polluted).
func pollutedEnv(t testing.TB, base *pgxpool.Pool, mode pgx.QueryExecMode) (clean, polluted *env) {
	t.Helper()
	ctx := testCtx(t)
	clean = newEnv(t, base)
	shadow := pgx.Identifier{clean.Schema + "_shadow"}.Sanitize()
	if _, err := base.Exec(ctx, `CREATE SCHEMA `+shadow+`;
		CREATE FUNCTION `+shadow+`.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01 00:00:00+00'::timestamptz$$;
		CREATE FUNCTION `+shadow+`.one(bigint) RETURNS bigint LANGUAGE sql AS $$SELECT 1::bigint$$;
		CREATE AGGREGATE `+shadow+`.count(*) (sfunc = `+shadow+`.one, stype = bigint, initcond = '1')`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = base.Exec(context.Background(), "DROP SCHEMA "+shadow+" CASCADE") })
	session := "SET search_path TO " + shadow + ", pg_catalog; SET TIME ZONE 'Pacific/Kiritimati'; SET DateStyle = 'SQL, DMY'; " +
		"SET IntervalStyle = 'iso_8601'; SET bytea_output = 'escape'; SET lock_timeout = '10ms'; SET statement_timeout = '150ms'"
	cfg := idempgxtest.PoolConfig(t, 3)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error { _, err := c.Exec(ctx, session); return err }
	pool := idempgxtest.OpenPool(t, cfg)
	// The look-alikes answer where the session's search_path reaches them.
	var year int
	var one int64
	if err := pool.QueryRow(ctx, "SELECT extract(year FROM now())::int, (SELECT count(*) FROM generate_series(1, 0))").Scan(&year, &one); err != nil || year != 2000 || one != 1 {
		t.Fatalf("look-alikes on the polluted session: year %d, count %d, %v", year, one, err)
	}
	s, err := idempgx.New(pool, idempgx.WithTable(clean.Schema+".idempotency_keys"))
	if err != nil {
		t.Fatal(err)
	}
	return clean, &env{&idempgxtest.Env{Pool: pool, Schema: clean.Schema, Store: s}}
}

// holdRow begins a transaction on pool that updates the row, and so holds
// it as an uncommitted settle would. The caller ends it; cleanup rolls it
// back otherwise.
func holdRow(t testing.TB, ctx context.Context, pool *pgxpool.Pool, table, principal, key string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	tag, err := tx.Exec(ctx, "UPDATE "+table+" SET request_id = request_id WHERE principal = $1 AND key = $2", principal, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("hold the row: %v %v", tag, err)
	}
	return tx
}

// TestStatementTimeoutBoundsWaits: with a lock timeout longer than the
// statement timeout, the statement timeout bounds a call that meets a held
// row, with a transient 57014. (The lock timeout's bound, for every call,
// is core/storetest's BoundedWaits.)
func TestStatementTimeoutBoundsWaits(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := newEnv(t, newPool(t, 4, nil))
	const bound = 200 * time.Millisecond
	s := e.storeOn(t, e.Pool, e.Schema+".idempotency_keys", idempgx.WithLockTimeout(5*time.Second), idempgx.WithStatementTimeout(bound))
	req := claimReq("alice", "wait-"+randHex(6), "body", time.Hour)
	if _, err := e.Store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	holdRow(t, ctx, e.Pool, e.Store.Table(), req.Principal, req.Key)
	start := time.Now()
	err := s.Release(ctx, leaseOf(req))
	if waited := time.Since(start); !errors.Is(err, idemstore.ErrTransient) || sqlStateOf(err) != "57014" || waited < bound/2 || waited > bound+2*time.Second {
		t.Fatalf("release behind a held row: %v after %v, want a transient 57014 after about %v", err, waited, bound)
	}
}

// TestDeadPeerSettings: the handler's transaction runs with TCP keepalives
// and tcp_user_timeout derived from the statement timeout, so that the
// server drops a client that went silent mid-transaction (a half-sent
// settle holding a row lock) within DeadPeerTimeout instead of the
// operating system's two hours. A partition cannot be simulated over
// loopback; this checks that the settings are in force in the handler's
// transaction on one pooled connection, whatever happened on it before:
// its first transaction after other code turned them off, after a handler
// turned them off and settled, after one that turned them off and failed,
// and after one that turned them off and committed behind the store.
func TestDeadPeerSettings(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := newPool(t, 1, nil) // one connection, over TCP: the DSN names 127.0.0.1
	e := newEnv(t, pool)
	settings := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var v string
		if err := q.QueryRow(ctx, `SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
			WHERE name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	const off = "SET tcp_user_timeout = 0; SET tcp_keepalives_idle = 0; SET tcp_keepalives_count = 9"
	for _, c := range []struct {
		statement time.Duration
		want      string
		deadPeer  time.Duration
	}{
		{idempgx.DefaultStatementTimeout, "tcp_keepalives_count=4 tcp_keepalives_idle=4 tcp_keepalives_interval=1 tcp_user_timeout=8000", 8 * time.Second},
		{10 * time.Second, "tcp_keepalives_count=4 tcp_keepalives_idle=10 tcp_keepalives_interval=3 tcp_user_timeout=22000", 22 * time.Second},
		{300 * time.Millisecond, "tcp_keepalives_count=4 tcp_keepalives_idle=1 tcp_keepalives_interval=1 tcp_user_timeout=5000", 5 * time.Second},
	} {
		s, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".idempotency_keys"), idempgx.WithStatementTimeout(c.statement))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.DeadPeerTimeout(); got != c.deadPeer {
			t.Errorf("statement timeout %v: DeadPeerTimeout() = %v, want %v", c.statement, got, c.deadPeer)
		}
		// attempt begins a transaction, checks the settings in it, lets the
		// handler run handler (turning them off) and ends it with end.
		attempt := func(step, handler string, end func(idemstore.Tx) error) {
			t.Helper()
			req := claimReq("alice", "peer-"+randHex(4), "body", time.Minute)
			if _, err := s.Claim(ctx, req); err != nil {
				t.Fatal(err)
			}
			txCtx, tx, err := s.BeginTx(ctx, leaseOf(req))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }() // a failed check must not strand the connection
			htx, _ := idempgx.Tx(txCtx)
			if inTx := settings(htx); inTx != c.want {
				t.Errorf("statement timeout %v, %s: in the handler's transaction %s, want %s", c.statement, step, inTx, c.want)
			}
			if handler != "" {
				_, _ = idempgx.RawConn(htx).Exec(txCtx, handler)
			}
			_ = end(tx)
		}
		settle := func(tx idemstore.Tx) error { return tx.Settle(ctx, okResponse("x")) }
		rollback := func(tx idemstore.Tx) error { return tx.Rollback(ctx) }

		if _, err := pool.Exec(ctx, off); err != nil { // code outside the store
			t.Fatal(err)
		}
		attempt("the connection's first transaction after other code turned them off", off, settle)
		if after := settings(pool); after != c.want {
			t.Errorf("statement timeout %v: after a handler turned them off and settled, the session has %s, want %s", c.statement, after, c.want)
		}
		attempt("after a handler turned them off and settled", off+"; SELECT 1/0", rollback)
		attempt("after a handler turned them off and failed", off+"; COMMIT; BEGIN", settle)
		attempt("after a handler turned them off and committed behind the store", "", settle)
		t.Logf("statement timeout %v: handler's transaction %s (dead peer noticed within %v)", c.statement, c.want, s.DeadPeerTimeout())
	}
}

// TestCheck: Check (and Migrate, which ends with it) names what makes the
// table unusable, as a *SchemaError wrapping idem.ErrMisconfigured.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := newPool(t, 4, nil)
	e := newEnv(t, pool)
	if err := e.Store.Check(ctx); err != nil {
		t.Fatalf("Check of a migrated table: %v", err)
	}
	byName, err := idempgx.New(pool, idempgx.WithTable(e.Schema+".t"))
	if err != nil {
		t.Fatal(err)
	}
	good := byName.Schema()
	cases := []struct {
		name       string
		ddl        string // run after the good schema for table t, "" for no table at all
		missing    []string
		wrongTypes []string
	}{
		{"no table", "", []string{"table"}, nil},
		{"a column missing", "ALTER TABLE {t} DROP COLUMN request_id", []string{"column request_id"}, nil},
		{"a table from before the nonce", "ALTER TABLE {t} DROP COLUMN nonce", []string{"column nonce"}, nil},
		{"a table from before the lease deadline and the uncertain mark", "ALTER TABLE {t} DROP COLUMN lease_expires_at, DROP COLUMN uncertain",
			[]string{"column lease_expires_at", "column uncertain"}, nil},
		{"uncertain as text", "ALTER TABLE {t} ALTER COLUMN uncertain DROP DEFAULT, ALTER COLUMN uncertain TYPE text",
			nil, []string{"uncertain: text, want bool"}},
		{"the old jsonb headers", "ALTER TABLE {t} ALTER COLUMN headers TYPE jsonb USING NULL", nil, []string{"headers: jsonb, want bytea"}},
		{"text where a time belongs", "ALTER TABLE {t} ALTER COLUMN expires_at TYPE text", nil, []string{"expires_at: text, want timestamptz"}},
		{"no unique index", "ALTER TABLE {t} DROP CONSTRAINT t_pkey", []string{"unique index on (principal, key)"}, nil},
		{"a partial unique index only", "ALTER TABLE {t} DROP CONSTRAINT t_pkey; CREATE UNIQUE INDEX ON {t} (principal, key) WHERE state = 'completed'",
			[]string{"unique index on (principal, key)"}, nil},
		{"another unique index", "ALTER TABLE {t} DROP CONSTRAINT t_pkey; CREATE UNIQUE INDEX ON {t} (key, principal)", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			schema := e.Schema + "_c" + randHex(3)
			if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
			table := schema + ".t"
			if c.ddl != "" {
				ddl := strings.ReplaceAll(good, `"`+e.Schema+`"."t"`, table) + ";" + strings.ReplaceAll(c.ddl, "{t}", table)
				if _, err := pool.Exec(ctx, ddl); err != nil {
					t.Fatal(err)
				}
			}
			s, err := idempgx.New(pool, idempgx.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			checkErr := s.Check(ctx)
			var se *idempgx.SchemaError
			if c.missing == nil && c.wrongTypes == nil {
				if checkErr != nil {
					t.Fatalf("Check = %v, want nil", checkErr)
				}
				return
			}
			if !errors.As(checkErr, &se) || !errors.Is(checkErr, idem.ErrMisconfigured) {
				t.Fatalf("Check = %v, want a *SchemaError wrapping ErrMisconfigured", checkErr)
			}
			if fmt.Sprint(se.Missing) != fmt.Sprint(c.missing) || fmt.Sprint(se.WrongType) != fmt.Sprint(c.wrongTypes) {
				t.Fatalf("Check: missing %q, wrong %q; want %q, %q", se.Missing, se.WrongType, c.missing, c.wrongTypes)
			}
			if c.ddl != "" {
				// Migrate leaves the table as it is and reports it the same way.
				if err := s.Migrate(ctx); !errors.As(err, &se) {
					t.Fatalf("Migrate on an unusable table = %v, want a *SchemaError", err)
				}
			}
			t.Logf("%s: %v", c.name, checkErr)
		})
	}

	// Privileges, checked for the user the pool connects as.
	role := "idempgx_check_" + randHex(4)
	if _, err := pool.Exec(ctx, "CREATE ROLE "+role+"; GRANT USAGE ON SCHEMA "+pgx.Identifier{e.Schema}.Sanitize()+" TO "+role+
		"; GRANT SELECT, UPDATE ON "+e.Store.Table()+" TO "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	cfg := idempgxtest.PoolConfig(t, 2)
	cfg.ConnConfig.RuntimeParams["role"] = role
	limited := idempgxtest.OpenPool(t, cfg)
	s, err := idempgx.New(limited, idempgx.WithTable(e.Schema+".idempotency_keys"))
	if err != nil {
		t.Fatal(err)
	}
	var se *idempgx.SchemaError
	if err := s.Check(ctx); !errors.As(err, &se) || fmt.Sprint(se.Missing) != "[privilege INSERT privilege DELETE]" {
		t.Fatalf("Check as a role without INSERT and DELETE = %v", err)
	}
	// At run time the same lack is a misconfiguration, never "retry".
	_, err = s.Claim(ctx, claimReq("alice", "priv-"+randHex(4), "body", time.Minute))
	if !errors.Is(err, idem.ErrMisconfigured) || errors.Is(err, idemstore.ErrTransient) || sqlStateOf(err) != "42501" {
		t.Fatalf("claim without INSERT = %v, want ErrMisconfigured (42501)", err)
	}
}
