package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// The hostile-handler section: a handler that ends the transaction it was
// given, sends transaction-control statements through it, swallows a
// failed statement or changes session state under the store's settle.
// Each case runs one misbehaving attempt through the engine, checks what
// the client got, then retries with well-behaved attempts until the key
// completes, and proves by counting that the key has exactly one business
// write and a completed record holding the response the retries saw.

// hostileTimeouts are the engine's timeouts in this section. The lease is
// short because the cases where the transaction ended behind the store's
// back wait for it to expire.
const (
	hostileRequestTimeout = 2 * time.Second
	hostileStoreTimeout   = time.Second
	hostileLease          = hostileRequestTimeout + hostileStoreTimeout + 500*time.Millisecond
)

// hostileStatements are the transaction-control statements a store must
// refuse before they reach the server, per dialect: each would end the
// transaction (or, on MySQL, commit it implicitly), so the handler's
// writes could commit without the stored outcome.
var hostileStatements = map[string][]string{
	"postgres": {
		"COMMIT", "commit work", "END", "end transaction", "ROLLBACK", "ABORT",
		"COMMIT AND CHAIN", "ROLLBACK AND NO CHAIN", "PREPARE TRANSACTION 'idem_hostile'",
		"BEGIN", "START TRANSACTION", "COMMIT PREPARED 'idem_hostile'",
		"/* a comment */ COMMIT", "-- a line comment\nCOMMIT", "  \n\tCoMmIt  ;",
		"SELECT 1; COMMIT", "SELECT 'a;b'; commit; SELECT 1",
		// With standard_conforming_strings on, '\' is a whole string and
		// the COMMIT is a statement of its own.
		`SELECT '\'; COMMIT; --'`,
		`SELECT $q$x$q$; COMMIT`,
	},
	"mysql": {
		"COMMIT", "commit work", "ROLLBACK", "ROLLBACK WORK", "COMMIT AND CHAIN",
		"BEGIN", "BEGIN WORK", "START TRANSACTION", "START TRANSACTION READ ONLY",
		"SET autocommit = 1", "SET @@autocommit=1", "set session autocommit = ON",
		"SET @@session.autocommit = 1", "SET autocommit = 0",
		"XA START 'idem_hostile'", "XA END 'idem_hostile'",
		"/* a comment */ COMMIT", "# a line comment\nCOMMIT", "-- a line comment\nCOMMIT",
		"SELECT 1; COMMIT",
		// Statements that commit implicitly.
		"CREATE TABLE idem_hostile_ddl (id INT)", "DROP TABLE IF EXISTS idem_hostile_ddl",
		"TRUNCATE TABLE idem_hostile_ddl", "ALTER TABLE idem_hostile_ddl ADD COLUMN x INT",
		"LOCK TABLES idem_hostile_ddl WRITE", "UNLOCK TABLES", "RENAME TABLE a TO b",
		"FLUSH TABLES", "ANALYZE TABLE idem_hostile_ddl",
	},
	"sqlite": {
		"COMMIT", "END", "END TRANSACTION", "ROLLBACK", "ROLLBACK TRANSACTION",
		"BEGIN", "BEGIN IMMEDIATE", "/* a comment */ COMMIT", "-- a line comment\nCOMMIT",
		"SELECT 1; COMMIT",
	},
}

// harmlessStatements look like transaction control to a careless filter but
// are not: a store must run them. Each group runs in order in one
// transaction.
var harmlessStatements = map[string][][]string{
	"postgres": {
		{"SELECT 'COMMIT'"}, {"SELECT 1 /* ; COMMIT */"}, {"SELECT $$;COMMIT;$$"},
		{`SELECT 1 AS "commit"`}, {`SELECT E'\';COMMIT;--'`}, {"SELECT 'it''s; COMMIT'"},
		{"SAVEPOINT idem_s1", "ROLLBACK TO SAVEPOINT idem_s1", "RELEASE SAVEPOINT idem_s1"},
		{"SET LOCAL application_name = 'commit'"},
	},
	"mysql": {
		{"SELECT 'COMMIT'"}, {"SELECT 1 /* ; COMMIT */"}, {"SELECT 1 AS `commit`"},
		{`SELECT 'it\'s; COMMIT'`}, {"SELECT 'it''s; COMMIT'"},
		{"SAVEPOINT idem_s1", "ROLLBACK TO SAVEPOINT idem_s1", "RELEASE SAVEPOINT idem_s1"},
		{"CREATE TEMPORARY TABLE idem_tmp_harmless (id INT)", "DROP TEMPORARY TABLE idem_tmp_harmless"},
		{"SET @idem_x = 'autocommit'"},
	},
	"sqlite": {
		{"SELECT 'COMMIT'"}, {"SELECT 1 /* ; COMMIT */"}, {`SELECT 1 AS "commit"`},
		{"SELECT 'it''s; COMMIT'"},
		{"SAVEPOINT idem_s1", "ROLLBACK TO idem_s1", "RELEASE idem_s1"},
	},
}

// failingStatements fail when they run, in ways that differ by the moment
// they fail (parse, bind, execution); the transaction must be aborted, as
// PostgreSQL does, whether or not it is the handler's first statement.
var failingStatements = map[string][]struct {
	sql  string
	args []any
}{
	"postgres": {
		{"INSERT INTO idem_no_such_table VALUES (1)", nil},
		{"SELECT $1::int", []any{"not a number"}},
		{"SELECT 1/0", nil},
		{"DO $$ BEGIN COMMIT; END $$", nil},
	},
	"mysql": {
		{"INSERT INTO idem_no_such_table VALUES (1)", nil},
		{"SELECT no_such_column FROM DUAL", nil},
	},
	"sqlite": {
		{"INSERT INTO idem_no_such_table VALUES (1)", nil},
		{"SELECT no_such_function(1)", nil},
	},
}

// handlerBounds are bounds a handler may set on its own statements' waits;
// the store's settle must run under the store's bounds instead. The case
// holds the record from another transaction for heldFor after the
// handler's SET, so the settle waits that long for its row lock: bounded
// by the handler's 50ms it fails, under the store's lock and statement
// timeouts it waits and commits. (The bound is not smaller: the store's
// statement that pins its own bounds still runs under the handler's.)
var handlerBounds = map[string][]string{
	"postgres": {"SET LOCAL statement_timeout = '50ms'", "SET LOCAL lock_timeout = '50ms'"},
}

const heldFor = 300 * time.Millisecond

// hijackSchema creates a schema whose look-alikes would defeat the store's
// statements if its search_path reached them: an = for text and one for
// bigint and integer that are always true, a || for text that answers '1',
// a now() from the year 2000 and a count(*) that always answers 1.
var hijackSchema = []string{
	"CREATE SCHEMA %[1]s",
	"CREATE FUNCTION %[1]s.t(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'",
	"CREATE OPERATOR %[1]s.= (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.t)",
	"CREATE FUNCTION %[1]s.i(bigint, integer) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'",
	"CREATE OPERATOR %[1]s.= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = %[1]s.i)",
	"CREATE FUNCTION %[1]s.c(text, text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT ''1'''",
	"CREATE OPERATOR %[1]s.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = %[1]s.c)",
	"CREATE FUNCTION %[1]s.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01 00:00:00+00''::timestamptz'",
	"CREATE FUNCTION %[1]s.one(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'",
	"CREATE AGGREGATE %[1]s.count(*) (sfunc = %[1]s.one, stype = bigint, initcond = '1')",
}

// hijackKey is the context key under which a hijack case's handler finds
// its schema's name.
type hijackKey struct{}

// withHijackSchema creates a schema of look-alikes (hijackSchema) through
// a well-behaved request, and returns a context carrying its name and a
// func that drops it, again through a request.
func withHijackSchema(t *testing.T, b Backend) (context.Context, func()) {
	t.Helper()
	eng := hostileEngineWithout(t, b)
	schema := strings.ReplaceAll(uniq("idem_hijack"), "-", "_")
	through := func(stmts ...string) {
		t.Helper()
		resp := Serve(eng, "alice", uniq("hijack-ddl"), func(ctx context.Context) (int, []byte) {
			for _, stmt := range stmts {
				if err := b.Exec(ctx, fmt.Sprintf(stmt, schema)); err != nil {
					t.Errorf("Exec(%q): %v", stmt, err)
					return http.StatusInternalServerError, nil
				}
			}
			return http.StatusCreated, []byte(`{}`)
		})
		if resp.Status != http.StatusCreated {
			t.Fatalf("the request that runs %q answered %d %s", stmts[0], resp.Status, resp.Body)
		}
	}
	through(hijackSchema...)
	return context.WithValue(ctxT(t), hijackKey{}, schema), func() { through("DROP SCHEMA %s CASCADE") }
}

// sessionChanges are session or transaction settings a handler may change;
// the store's own statements must not depend on them, now or on a later
// request that gets the same pooled connection.
var sessionChanges = map[string][]string{
	"postgres": {
		"SET LOCAL search_path TO pg_catalog", "SET search_path TO pg_catalog",
		"SET TIME ZONE 'Pacific/Kiritimati'", "SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'iso_8601'",
	},
	"mysql": {
		"SET SESSION sql_mode = 'SIMULTANEOUS_ASSIGNMENT'", "SET SESSION sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES'",
		"SET time_zone = '+13:00'", "SET SESSION innodb_lock_wait_timeout = 1",
	},
	"sqlite": {
		"PRAGMA recursive_triggers = ON",
	},
}

// hostileHandler is one misbehaving first attempt: it does what it does
// with the transaction in ctx (writing business rows for id through
// b.WriteEffect) and returns the status it answers. A non-nil violation
// fails the test: the store let through what it must refuse.
type hostileHandler func(ctx context.Context, b Backend, id string) (status int, violation error)

// hostileCase is one scenario with what the client must get first.
type hostileCase struct {
	name       string
	needs      string // "" none, "sql", "endhandle", "endaround", "replacearound"
	handler    hostileHandler
	wantStatus int
	wantType   idem.ProblemType // "" when the handler's own response is expected
	// holdFor: once the handler returns, the record is held from another
	// transaction (Backend.HoldRecord) for this long, so the settle waits
	// for it.
	holdFor time.Duration
	// ended: the transaction ended behind the store's back, so the key
	// stays in progress until the lease expires.
	ended bool
	// mayRelease: with ended, a store that knows nothing of the handler's
	// work committed (a deadlock rolled all of it back) may release the
	// key instead and pass the handler's own answer on; a released key
	// must then have no business write.
	mayRelease bool
	// hijack: the handler's search_path puts a schema of look-alikes
	// (hijackSchema) before pg_catalog, and another principal's key is in
	// progress while the settle runs; its record must stay so.
	hijack bool
}

// RunHostile runs the hostile-handler section on the Backends newBackend
// makes. Run calls it; a store may also run it on its own.
func RunHostile(t *testing.T, newBackend NewBackend) {
	t.Run("Hostile", func(t *testing.T) {
		b := newBackend(t)
		if b.Dialect != "" && b.Exec == nil {
			t.Fatalf("storetest: Backend sets Dialect %q but not Exec", b.Dialect)
		}
		for _, tc := range hostileCases(b.Dialect) {
			t.Run(tc.name, func(t *testing.T) {
				switch {
				case tc.needs == "sql" && b.Dialect == "":
					t.Skip("not applicable: the store's handle runs no SQL")
				case tc.needs == "endhandle" && b.EndHandle == nil:
					t.Skip("not applicable: the store's handle has no Commit or Rollback")
				case tc.needs == "holdrecord" && (b.Dialect == "" || b.HoldRecord == nil):
					t.Skip("not applicable: the backend cannot hold a record from outside (Backend.HoldRecord)")
				case tc.needs == "endaround" && b.EndTxAround == nil:
					t.Skip("not applicable: the backend knows no route around the handle that ends the transaction")
				case tc.needs == "replacearound" && b.ReplaceTxAround == nil:
					t.Skip("not applicable: the backend knows no route around the handle that begins another transaction")
				}
				runHostileCase(t, b, tc)
			})
		}
		t.Run("TxUsedReported", func(t *testing.T) { testTxUsedReported(t, b) })
		t.Run("PrincipalAndKeyAtTheLimit", func(t *testing.T) { testLimits(t, b) })
	})
}

func hostileCases(dialect string) []hostileCase {
	writeThen := func(status int, then func(ctx context.Context, b Backend) error) hostileHandler {
		return func(ctx context.Context, b Backend, id string) (int, error) {
			if err := b.WriteEffect(ctx, id); err != nil {
				return 0, fmt.Errorf("the first write failed: %w", err)
			}
			return status, then(ctx, b)
		}
	}
	endHandle := func(commit bool) func(ctx context.Context, b Backend) error {
		return func(ctx context.Context, b Backend) error {
			if err := b.EndHandle(ctx, commit); !errors.Is(err, idem.ErrTxOwned) {
				return fmt.Errorf("the handle's Commit/Rollback (commit=%v) answered %v, want an error wrapping idem.ErrTxOwned", commit, err)
			}
			return nil
		}
	}
	cases := []hostileCase{
		{name: "CommitThen500", needs: "endhandle", handler: writeThen(500, endHandle(true)), wantStatus: 500},
		{name: "CommitThen201", needs: "endhandle", handler: writeThen(201, endHandle(true)), wantStatus: 201},
		// Rollback is refused too, and the work it meant to undo is not
		// committed: a 2xx after it turns into a 500 that names the
		// handler's doing (transaction-owned), not a store failure.
		{name: "RollbackThen201", needs: "endhandle", handler: writeThen(201, endHandle(false)),
			wantStatus: 500, wantType: idem.ProblemTxOwned},
		// Ending the transaction behind the store and then failing must
		// not release the key either: the first write may have committed.
		{name: "EndTxAroundThen500", needs: "endaround", ended: true, mayRelease: true, wantStatus: 500,
			handler: writeThen(500, func(ctx context.Context, b Backend) error { return b.EndTxAround(ctx) })},
		{name: "EndTxAroundThen201", needs: "endaround", ended: true, wantStatus: 500, wantType: idem.ProblemTxEnded,
			handler: writeThen(201, func(ctx context.Context, b Backend) error {
				if err := b.EndTxAround(ctx); err != nil {
					return fmt.Errorf("EndTxAround: %w", err)
				}
				// Whatever ended the transaction, nothing more may run
				// through the handle: it would commit on its own.
				if err := b.WriteEffect(ctx, "after-end"); err == nil {
					return errors.New("a write after the transaction ended went through the handle")
				}
				return nil
			})},
	}
	for _, stmt := range hostileStatements[dialect] {
		refuse := func(ctx context.Context, b Backend) error {
			if err := b.Exec(ctx, stmt); !errors.Is(err, idem.ErrTxOwned) {
				return fmt.Errorf("Exec(%q) answered %v, want an error wrapping idem.ErrTxOwned", stmt, err)
			}
			return nil
		}
		// The refused statement is a failed statement: the transaction is
		// aborted, so the 2xx the handler answers anyway is not stored, and
		// the answer names the handler's doing (transaction-owned): it
		// tried to end the store's transaction, which a retry repeats.
		cases = append(cases, hostileCase{name: "Refuse " + stmt, needs: "sql", handler: writeThen(201, refuse),
			wantStatus: 500, wantType: idem.ProblemTxOwned})
	}
	if dialect != "" {
		// The table's row: a write, COMMIT, another write, a 500.
		cases = append(cases, hostileCase{name: "CommitStatementWriteAgainThen500", needs: "sql", wantStatus: 500,
			handler: writeThen(500, func(ctx context.Context, b Backend) error {
				if err := b.Exec(ctx, "COMMIT"); !errors.Is(err, idem.ErrTxOwned) {
					return fmt.Errorf("Exec(COMMIT) answered %v, want idem.ErrTxOwned", err)
				}
				_ = b.WriteEffect(ctx, "second-write")
				return nil
			})})
	}
	for _, group := range harmlessStatements[dialect] {
		cases = append(cases, hostileCase{name: "Run " + strings.Join(group, "; "), needs: "sql", wantStatus: 201,
			handler: writeThen(201, func(ctx context.Context, b Backend) error {
				for _, stmt := range group {
					if err := b.Exec(ctx, stmt); err != nil {
						return fmt.Errorf("Exec(%q), which ends nothing, failed: %w", stmt, err)
					}
				}
				return nil
			})})
	}
	for _, f := range failingStatements[dialect] {
		fail := func(ctx context.Context, b Backend) error {
			if err := b.Exec(ctx, f.sql, f.args...); err == nil {
				return fmt.Errorf("Exec(%q) succeeded; the case needs it to fail", f.sql)
			}
			return nil
		}
		// First: the failing statement is the handler's first, its error
		// swallowed, then the write and a 201.
		cases = append(cases, hostileCase{name: "SwallowFirst " + f.sql, needs: "sql", wantStatus: 500, wantType: idem.ProblemCommitFailed,
			handler: func(ctx context.Context, b Backend, id string) (int, error) {
				if v := fail(ctx, b); v != nil {
					return 0, v
				}
				_ = b.WriteEffect(ctx, id) // fails on PostgreSQL; must not commit anywhere
				return 201, nil
			}})
		cases = append(cases, hostileCase{name: "SwallowAfterWrite " + f.sql, needs: "sql", wantStatus: 500,
			wantType: idem.ProblemCommitFailed, handler: writeThen(201, fail)})
	}
	for _, stmt := range handlerBounds[dialect] {
		cases = append(cases, hostileCase{name: "Bound " + stmt, needs: "holdrecord", wantStatus: 201, holdFor: heldFor,
			handler: writeThen(201, func(ctx context.Context, b Backend) error {
				if err := b.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("Exec(%q): %w", stmt, err)
				}
				return nil
			})})
	}
	if dialect == "postgres" {
		// The store's statements are parsed under the handler's
		// search_path: the settle's fence and its check that the
		// transaction is still the one it began must name pg_catalog's
		// operators and functions, whether the handler sets the path for
		// its transaction or, before replacing it behind the store, for
		// the session.
		// hijack runs stmts through the handle, each formatted with the
		// hijack schema's name.
		hijack := func(stmts ...string) func(ctx context.Context, b Backend) error {
			return func(ctx context.Context, b Backend) error {
				schema, _ := ctx.Value(hijackKey{}).(string)
				for _, stmt := range stmts {
					if err := b.Exec(ctx, fmt.Sprintf(stmt, schema)); err != nil {
						return fmt.Errorf("Exec(%q): %w", stmt, err)
					}
				}
				return nil
			}
		}
		// The handler's own work at COMMIT (a deferred constraint trigger
		// whose function names a table without its schema) runs under the
		// handler's search_path, as in a transaction of its own: the
		// settle's statements, which come before the COMMIT, name their
		// schemas instead of pinning the path.
		deferred := hijack(
			"CREATE TABLE %[1]s.audit (id text)",
			"CREATE TABLE %[1]s.audited (id text)",
			"CREATE FUNCTION %[1]s.audit() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN INSERT INTO audit VALUES (NEW.id); RETURN NULL; END'",
			"CREATE CONSTRAINT TRIGGER audit AFTER INSERT ON %[1]s.audited DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s.audit()",
			"SET LOCAL search_path = %[1]s, pg_catalog",
			"INSERT INTO %[1]s.audited VALUES ('x')",
		)
		cases = append(cases,
			hostileCase{name: "HijackedSearchPath", needs: "sql", wantStatus: 201, hijack: true,
				handler: writeThen(201, hijack("SET LOCAL search_path = %s, pg_catalog"))},
			hostileCase{name: "DeferredTriggerUnderTheHandlersSearchPath", needs: "sql", wantStatus: 201, hijack: true,
				handler: writeThen(201, deferred)},
			hostileCase{name: "ReplaceTxAroundUnderHijackedSearchPath", needs: "replacearound", ended: true, wantStatus: 500,
				wantType: idem.ProblemTxEnded, hijack: true,
				handler: writeThen(201, func(ctx context.Context, b Backend) error {
					if err := hijack("SET search_path = %s, pg_catalog")(ctx, b); err != nil {
						return err
					}
					return b.ReplaceTxAround(ctx)
				})})
	}
	for _, stmt := range sessionChanges[dialect] {
		// The write goes first, so a timeout the handler sets cannot fail
		// the handler's own statement: only the store's.
		cases = append(cases, hostileCase{name: "Session " + stmt, needs: "sql", wantStatus: 201,
			handler: writeThen(201, func(ctx context.Context, b Backend) error {
				if err := b.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("Exec(%q): %w", stmt, err)
				}
				return nil
			})})
	}
	return cases
}

// hostileEngine is the engine the section runs: its Reconcile answers a
// takeover from the business table, as an operator's reconciler would, so
// that a key whose transaction ended behind the store's back completes
// with exactly one effect.
func hostileEngine(t *testing.T, b Backend, obs idem.Observer) *idem.Engine {
	t.Helper()
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey,
		Store: b.Store, RequestTimeout: hostileRequestTimeout, StoreTimeout: hostileStoreTimeout, Lease: hostileLease,
		Observer: obs,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			n, err := b.CountEffects(ctx, stale.Key)
			if err != nil || n == 0 {
				return nil, err
			}
			return &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: fmt.Appendf(nil, `{"id":%q,"reconciled":true}`, stale.Key)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// hostileEngineWithout is hostileEngine without Reconcile, as most
// applications run.
func hostileEngineWithout(t *testing.T, b Backend) *idem.Engine {
	t.Helper()
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: b.Store,
		RequestTimeout: hostileRequestTimeout, StoreTimeout: hostileStoreTimeout, Lease: hostileLease})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// recorder keeps the events an engine emits.
type recorder struct {
	mu  sync.Mutex
	evs []idem.Event
}

func (r *recorder) Observe(_ context.Context, ev idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

func (r *recorder) all() []idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idem.Event(nil), r.evs...)
}

func (r *recorder) last() idem.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.evs) == 0 {
		return idem.Event{}
	}
	return r.evs[len(r.evs)-1]
}

// Serve runs one POST /payments for (principal, key) through eng, as an
// adapter does: handler runs with the attempt's context (the store's
// transaction in it) and returns the status and JSON body it answers. It
// returns what the client gets. Store tests that drive the engine
// themselves use it.
func Serve(eng *idem.Engine, principal, key string, handler func(ctx context.Context) (int, []byte)) *idem.Response {
	return ServeContext(context.Background(), eng, principal, key, handler)
}

// ServeContext is Serve with the request's context.
func ServeContext(ctx context.Context, eng *idem.Engine, principal, key string, handler func(ctx context.Context) (int, []byte)) *idem.Response {
	att, resp := eng.Begin(ctx, idem.Request{
		Method: http.MethodPost, Path: "/payments", Principal: principal, Key: key,
		ContentType: "application/json", Body: strings.NewReader(`{"amount":1}`),
	})
	if att == nil {
		return resp
	}
	defer att.Abort()
	status, body := handler(att.Context())
	return att.Finish(idem.Result{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
}

func runHostileCase(t *testing.T, b Backend, tc hostileCase) {
	rec := &recorder{}
	eng := hostileEngine(t, b, rec)
	key := uniq("hostile")
	ctx, unhijack := ctxT(t), func() {}
	var bystander idemstore.ClaimRequest
	if tc.hijack {
		ctx, unhijack = withHijackSchema(t, b)
		bystander = claimReq("bob", uniq("bystander"), "body")
		mustClaim(t, b.Store, bystander)
	}
	var violation error
	unheld := make(chan struct{}) // the record's hold (holdFor) has ended
	first := ServeContext(ctx, eng, "alice", key, func(ctx context.Context) (int, []byte) {
		status, v := tc.handler(ctx, b, key)
		violation = v
		if tc.holdFor > 0 {
			release := b.HoldRecord(t, "alice", key)
			time.AfterFunc(tc.holdFor, func() { release(); close(unheld) })
		} else {
			close(unheld)
		}
		return status, fmt.Appendf(nil, `{"id":%q,"first":true}`, key)
	})
	<-unheld
	if tc.hijack {
		// Dropped before anything is observed: the tests' own queries on
		// a session the handler left with the look-alikes would be fooled.
		unhijack()
		if r := get(t, b, "bob", bystander.Key); r.State != idemstore.StateInProgress {
			t.Errorf("another principal's record in progress during the settle is now %s", r.State)
		}
	}
	if violation != nil {
		t.Errorf("the store let the handler through: %v", violation)
	}
	if first.Status != tc.wantStatus {
		t.Fatalf("the misbehaving attempt answered %d %s, want %d", first.Status, first.Body, tc.wantStatus)
	}
	if tc.wantType != "" && !bytes.Contains(first.Body, []byte(tc.wantType)) {
		t.Fatalf("the misbehaving attempt answered %s, want problem type %s", first.Body, tc.wantType)
	}
	n := effects(t, b, key)
	released := tc.mayRelease && rec.last().Outcome == idem.OutcomeReleased
	switch {
	case tc.ended && !released:
		if !bytes.Contains(first.Body, []byte(idem.ProblemTxEnded)) {
			t.Fatalf("the misbehaving attempt answered %s, want problem type %s", first.Body, idem.ProblemTxEnded)
		}
		if ev := rec.last(); ev.Outcome != idem.OutcomeTxEnded {
			t.Fatalf("outcome %q, want %q", ev.Outcome, idem.OutcomeTxEnded)
		}
		// The key must not be released: its effect may have committed.
		if r, err := b.Store.Get(ctxT(t), "alice", key); err != nil || r.State != idemstore.StateInProgress || !r.Uncertain {
			t.Fatalf("after the transaction ended behind the store: record %+v, %v; want it kept in progress, Uncertain", r, err)
		}
		// Without Reconcile nothing runs it again: the retry is answered
		// outcome-unknown, however long it waits.
		blind := hostileEngineWithout(t, b)
		resp := Serve(blind, "alice", key, func(ctx context.Context) (int, []byte) {
			t.Error("a retry without Reconcile ran the handler of a key whose outcome is unknown")
			return wellBehaved(t, b, key)(ctx)
		})
		if resp.Status != http.StatusConflict || !bytes.Contains(resp.Body, []byte(idem.ProblemOutcomeUnknown)) {
			t.Fatalf("a retry without Reconcile answered %d %s, want 409 %s", resp.Status, resp.Body, idem.ProblemOutcomeUnknown)
		}
		if m := effects(t, b, key); m != n {
			t.Fatalf("a retry without Reconcile changed the business writes from %d to %d", n, m)
		}
	case first.Status == http.StatusCreated:
		if n != 1 {
			t.Fatalf("answered 201 with %d business writes committed, want 1", n)
		}
	default:
		if n != 0 {
			t.Fatalf("answered %d with %d business writes committed, want none", first.Status, n)
		}
	}
	final := retryHostile(t, eng, b, key)
	if n := effects(t, b, key); n != 1 {
		t.Fatalf("after well-behaved retries: %d business writes for the key, want exactly 1", n)
	}
	stored := get(t, b, "alice", key)
	if stored.State != idemstore.StateCompleted || stored.Response == nil || !bytes.Equal(stored.Response.Body, final.Body) {
		t.Fatalf("after retries: record %s with %v, want completed with the retry's body %s", stored.State, stored.Response, final.Body)
	}
	if first.Status == http.StatusCreated && !bytes.Equal(first.Body, final.Body) {
		t.Fatalf("the first attempt answered 201 %s but the key replays %s", first.Body, final.Body)
	}
	// The store must still work on whatever connection the handler left
	// behind: a few more well-behaved keys.
	for range 3 {
		other := uniq("after")
		if resp := Serve(eng, "alice", other, wellBehaved(t, b, other)); resp.Status != http.StatusCreated {
			t.Fatalf("a well-behaved request after the case answered %d %s", resp.Status, resp.Body)
		}
	}
}

// wellBehaved writes one business row for id and answers 201.
func wellBehaved(t *testing.T, b Backend, id string) func(ctx context.Context) (int, []byte) {
	return func(ctx context.Context) (int, []byte) {
		if err := b.WriteEffect(ctx, id); err != nil {
			t.Logf("well-behaved write for %s failed: %v", id, err)
			return http.StatusServiceUnavailable, []byte(`{"error":"write failed"}`)
		}
		return http.StatusCreated, fmt.Appendf(nil, `{"id":%q,"at":%d}`, id, time.Now().UnixNano())
	}
}

// retryHostile retries key with a well-behaved handler until it answers
// 201, for at most the lease and some slack.
func retryHostile(t *testing.T, eng *idem.Engine, b Backend, key string) *idem.Response {
	t.Helper()
	deadline := time.Now().Add(hostileLease + 10*time.Second)
	for time.Now().Before(deadline) {
		resp := Serve(eng, "alice", key, wellBehaved(t, b, key))
		switch {
		case resp.Status == http.StatusCreated:
			return resp
		case resp.Status == http.StatusConflict:
			time.Sleep(100 * time.Millisecond)
		default:
			t.Fatalf("a well-behaved retry answered %d %s", resp.Status, resp.Body)
		}
	}
	t.Fatalf("key %s never completed", key)
	return nil
}

// testTxUsedReported: the event says whether the handler used the store's
// transaction, which is how a user finds a handler that writes through the
// pool instead.
func testTxUsedReported(t *testing.T, b Backend) {
	rec := &recorder{}
	eng := hostileEngine(t, b, rec)
	for _, used := range []bool{true, false} {
		key := uniq("used")
		resp := Serve(eng, "alice", key, func(ctx context.Context) (int, []byte) {
			if used {
				if err := b.WriteEffect(ctx, key); err != nil {
					t.Errorf("WriteEffect: %v", err)
				}
			}
			return http.StatusCreated, []byte(`{}`)
		})
		if resp.Status != http.StatusCreated {
			t.Fatalf("answered %d %s", resp.Status, resp.Body)
		}
		if ev := rec.last(); ev.TxUsed != used {
			t.Fatalf("Event.TxUsed = %v for a handler that used the transaction: %v", ev.TxUsed, used)
		}
	}
}

// testLimits: the longest principal and key the engine accepts are stored
// and replayed by every store, and the longest request id is kept as it
// is; one byte more of principal is a 400 before anything is claimed.
func testLimits(t *testing.T, b Backend) {
	eng := hostileEngine(t, b, nil)
	principal := strings.Repeat("é", idemstore.MaxPrincipalLength/2) + "p" // 255 bytes, multi-byte UTF-8
	key := strings.Repeat("k", idem.DefaultMaxKeyLength-12) + uniq("")[1:]
	if len(principal) != idemstore.MaxPrincipalLength || len(key) != idem.DefaultMaxKeyLength {
		t.Fatalf("test set-up: principal %d bytes, key %d", len(principal), len(key))
	}
	var bodies [][]byte
	for range 2 {
		resp := Serve(eng, principal, key, func(ctx context.Context) (int, []byte) {
			if err := b.WriteEffect(ctx, key); err != nil {
				t.Errorf("WriteEffect: %v", err)
			}
			return http.StatusCreated, []byte(`{"ok":true}`)
		})
		if resp.Status != http.StatusCreated {
			t.Fatalf("principal of %d bytes, key of %d: answered %d %s", len(principal), len(key), resp.Status, resp.Body)
		}
		bodies = append(bodies, resp.Body)
	}
	if n := effects(t, b, key); n != 1 || !bytes.Equal(bodies[0], bodies[1]) {
		t.Fatalf("%d business writes for the longest key and bodies %s, %s: want 1 write and the second request replaying the first", n, bodies[0], bodies[1])
	}
	// The request id is stored as it is at the limit.
	req := claimReq(principal, uniq("rid"), "body")
	req.RequestID = strings.Repeat("ü", idemstore.MaxRequestIDLength/2) + "r"
	mustClaim(t, b.Store, req)
	if got := get(t, b, principal, req.Key); got.RequestID != req.RequestID || got.Principal != principal {
		t.Fatalf("request id of %d bytes stored as %d bytes, principal %d as %d", len(req.RequestID), len(got.RequestID), len(principal), len(got.Principal))
	}
	long := principal + "x"
	if resp := Serve(eng, long, uniq("k"), func(context.Context) (int, []byte) {
		t.Error("the handler ran for a principal over the limit")
		return 500, nil
	}); resp.Status != http.StatusBadRequest || !bytes.Contains(resp.Body, []byte(idem.ProblemPrincipalInvalid)) {
		t.Fatalf("principal of %d bytes answered %d %s, want 400 %s", len(long), resp.Status, resp.Body, idem.ProblemPrincipalInvalid)
	}
}
