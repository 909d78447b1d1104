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
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

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

// The claim's statements run behind a prelude that does not pin the
// search_path: they name every function and operator with their schema.
// On sessions whose search_path puts look-alikes before pg_catalog (a
// pool configured so, or a handler's SET left on a pooled session), a
// claim still inserts its own row with the server's clock and reads back
// its own record, never another principal's.
func TestClaimUnderAHijackedSearchPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newPool(t, 2, nil))
	ctx := testCtx(t)
	hijack := strings.ReplaceAll("idem_lookalike_"+randHex(4), "-", "_")
	for _, stmt := range []string{
		"CREATE SCHEMA %[1]s",
		"CREATE FUNCTION %[1]s.t(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'",
		"CREATE OPERATOR %[1]s.= (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.t)",
		"CREATE FUNCTION %[1]s.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01 00:00:00+00''::timestamptz'",
		"CREATE FUNCTION %[1]s.p(timestamptz, interval) RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01 00:00:00+00''::timestamptz'",
		"CREATE OPERATOR %[1]s.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = %[1]s.p)",
		"CREATE FUNCTION %[1]s.m(bigint, interval) RETURNS interval LANGUAGE sql AS 'SELECT interval ''0'''",
		"CREATE OPERATOR %[1]s.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = %[1]s.m)",
	} {
		if _, err := e.Pool.Exec(ctx, fmt.Sprintf(stmt, hijack)); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() { _, _ = e.Pool.Exec(context.Background(), "DROP SCHEMA "+hijack+" CASCADE") })
	cfg := idempgxtest.PoolConfig(t, 1)
	cfg.ConnConfig.RuntimeParams["search_path"] = hijack + ", pg_catalog"
	s := e.storeOn(t, idempgxtest.OpenPool(t, cfg), e.Schema+".idempotency_keys")

	start := time.Now()
	first := claimReq("alice", "k-"+randHex(4), "body", time.Minute)
	replay := first
	replay.Token, replay.RequestID = randHex(16), "req-replay"
	for _, tc := range []struct {
		name    string
		req     idemstore.ClaimRequest
		claimed bool
	}{
		{"a new key", first, true},
		{"another principal's new key", claimReq("bob", first.Key, "body", time.Minute), true},
		{"a replay", replay, false},
	} {
		res, err := s.Claim(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := res.Record
		switch {
		case res.Claimed != tc.claimed:
			t.Fatalf("%s: claimed %v, want %v", tc.name, res.Claimed, tc.claimed)
		case r.Principal != tc.req.Principal || r.Key != tc.req.Key || r.LeaseToken != first.Token && r.Principal == "alice":
			t.Fatalf("%s: got the record of %s/%s (token %s), want %s/%s", tc.name, r.Principal, r.Key, r.LeaseToken, tc.req.Principal, tc.req.Key)
		case r.CreatedAt.Before(start.Add(-time.Minute)) || r.LockedAt.Before(start.Add(-time.Minute)):
			t.Fatalf("%s: created %v, locked %v, want about %v", tc.name, r.CreatedAt, r.LockedAt, start)
		case r.LeaseExpiresAt.Before(start.Add(50*time.Second)) || r.ExpiresAt.Before(start.Add(50*time.Minute)):
			t.Fatalf("%s: lease ends %v and the record expires %v, want a minute and an hour from %v", tc.name, r.LeaseExpiresAt, r.ExpiresAt, start)
		}
	}
}
