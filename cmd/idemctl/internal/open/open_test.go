package open_test

// These tests run idemctl's commands on the real stores, opened by DSN as
// the command line opens them: PostgreSQL, MariaDB, SQLite and Redis.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
	"github.com/idemgo/idem/cmd/idemctl/internal/open"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
	"github.com/idemgo/idem/stores/redis/idemredistest"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// lease is the test engines' lease: short, so that crashed claims go stale
// quickly, and long enough that a live one stays live on a loaded machine.
const lease = 1500 * time.Millisecond

// target is one store the commands run against, opened by its DSN like
// the command line opens it.
type target struct {
	name       string
	selfExpire bool // Redis: expired records vanish, settled ones are not counted
	open       func(t *testing.T) (dsn, table, prefix string)
}

var targets = []target{
	{name: "postgres", open: func(t *testing.T) (string, string, string) {
		env := idempgxtest.NewEnv(t, idempgxtest.NewPool(t, 4))
		return idempgxtest.DSN(), env.Schema + ".idempotency_keys", ""
	}},
	// The go-sql-driver DSN, as the application is configured with it.
	{name: "mariadb", open: func(t *testing.T) (string, string, string) {
		fix := idemgormtest.NewFixture(t, "mysql")
		return idemgormtest.MySQLDSN(), fix.Store.Table(), ""
	}},
	{name: "sqlite", open: func(t *testing.T) (string, string, string) {
		path := filepath.Join(t.TempDir(), "idem.db")
		db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(path, 5*time.Second)), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		s, err := idemgorm.New(db)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		sqlDB, _ := db.DB()
		_ = sqlDB.Close()
		return "sqlite:" + path, "", ""
	}},
	{name: "redis", selfExpire: true, open: func(t *testing.T) (string, string, string) {
		env := idemredistest.NewEnv(t, idemredistest.NewClient(t))
		return "redis://" + idemredistest.Addr() + "/0", "", env.Store.Prefix()
	}},
}

// openDSN opens raw as idemctl does.
func openDSN(t *testing.T, raw, table, prefix string) *ctl.Opened {
	t.Helper()
	d, err := dsn.Parse(raw, "")
	if err != nil {
		t.Fatal(err)
	}
	o, err := open.Store(context.Background(), d, table, prefix)
	if err != nil {
		t.Fatalf("open %s: %v", d.Redacted, d.Scrub(err))
	}
	t.Cleanup(o.Close)
	return o
}

// crashStore is a store whose Release never arrives, as when the process
// dies between a handler's failure and the release: an engine on it leaves
// the claim in progress, which is how the tests make stale claims.
type crashStore struct{ idemstore.Store }

func (crashStore) Release(context.Context, idemstore.Lease) error {
	return errors.New("the process died before the release")
}

// endedStore's transactions end behind the store: Settle reports
// idemstore.ErrTxEnded, as when a handler committed the transaction itself, and
// the engine keeps the claim with its outcome unknown.
type endedStore struct{ idemstore.Store }

func (s endedStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	c, tx, err := s.Store.BeginTx(ctx, l)
	if err != nil {
		return c, nil, err
	}
	return c, endedTx{tx}, nil
}

type endedTx struct{ idemstore.Tx }

func (endedTx) Settle(context.Context, idemstore.Outcome) error {
	return fmt.Errorf("the handler committed the transaction itself: %w", idemstore.ErrTxEnded)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newEngine(t *testing.T, s idemstore.Store, retention time.Duration) *idem.Engine {
	t.Helper()
	return newEngineLease(t, s, retention, lease, 500*time.Millisecond)
}

// newEngineLease is newEngine with its own lease and request timeout.
func newEngineLease(t *testing.T, s idemstore.Store, retention, lease, requestTimeout time.Duration) *idem.Engine {
	t.Helper()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: s, RequestTimeout: requestTimeout, StoreTimeout: 500 * time.Millisecond,
		Lease: lease, Retention: retention, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func request(principal, key string) idem.Request {
	body := `{"amount":1250,"currency":"EUR"}`
	return idem.Request{Method: "POST", Path: "/payments", Principal: principal, Key: key, ContentType: "application/json",
		RequestID: "req-" + key, Body: strings.NewReader(body), ContentLength: int64(len(body))}
}

// begin starts an attempt through e that holds its claim until finished.
func begin(t *testing.T, e *idem.Engine, principal, key string) *idem.Attempt {
	t.Helper()
	a, resp := e.Begin(context.Background(), request(principal, key))
	if a == nil {
		t.Fatalf("Begin(%s/%s) answered %d instead of claiming", principal, key, resp.Status)
	}
	return a
}

func finish(t *testing.T, a *idem.Attempt, status int, body string) {
	t.Helper()
	resp := a.Finish(idem.Result{Status: status, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/p1"}},
		Body: []byte(body)})
	if resp.Status != status {
		t.Fatalf("Finish answered %d (%s), want %d", resp.Status, resp.Body, status)
	}
}

var normalisers = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<TIME>"},
	{regexp.MustCompile(`\b[0-9a-f]{64}(?:[0-9a-f]{2})?\b`), "<FP>"},
	{regexp.MustCompile(`\b[0-9a-f]{32}\b`), "<TOKEN>"},
	{regexp.MustCompile(`("\w+_seconds"): [0-9.]+`), "$1: <N>"},
	{regexp.MustCompile(`(in )?\b[0-9][0-9.]*(ns|µs|ms|s|m|h)([0-9.]+(ns|µs|ms|s|m|h))*( ago)?`), "<AGE>"},
	{regexp.MustCompile(`(\S) {2,}`), "$1  "}, // the columns, whatever their width
}

func normalise(s, storeName string) string {
	quoted, _ := json.Marshal(storeName)
	s = strings.ReplaceAll(s, string(quoted[1:len(quoted)-1]), "<STORE>")
	s = strings.ReplaceAll(s, storeName, "<STORE>")
	for _, n := range normalisers {
		s = n.re.ReplaceAllString(s, n.repl)
	}
	return s
}

// env is one target opened for a test.
type env struct {
	t      *testing.T
	tg     target
	opened *ctl.Opened
	dsn    string
	table  string
	prefix string
	engine *idem.Engine
	crash  *idem.Engine
	ended  *idem.Engine
}

func (e *env) opts() ctl.Options {
	return ctl.Options{Store: e.opened.Store, Name: e.opened.Name, StoredBody: ctl.StoredBodyPlain}
}

// run runs cmd and returns its normalised output.
func (e *env) run(cmd func(context.Context, io.Writer, ctl.Options) error, o ctl.Options) (string, error) {
	var b bytes.Buffer
	err := cmd(context.Background(), &b, o)
	return normalise(b.String(), e.opened.Name), err
}

func (e *env) want(name, got, want string) {
	e.t.Helper()
	if got != want {
		e.t.Errorf("%s output:\n%s\nwant:\n%s", name, got, want)
	}
}

func (e *env) record(principal, key string) idem.Record {
	e.t.Helper()
	r, err := e.opened.Store.Get(context.Background(), principal, key)
	if errors.Is(err, idemstore.ErrNotFound) {
		return idem.Record{State: "absent"}
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) state(principal, key string) idemstore.State { return e.record(principal, key).State }

func setup(t *testing.T, tg target) *env {
	raw, table, prefix := tg.open(t)
	o := openDSN(t, raw, table, prefix)
	e := &env{t: t, tg: tg, opened: o, dsn: raw, table: table, prefix: prefix}
	e.engine = newEngine(t, o.Store, time.Hour)
	e.crash = newEngine(t, crashStore{o.Store}, time.Hour)
	e.ended = newEngine(t, endedStore{o.Store}, time.Hour)
	return e
}

func TestCommands(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			testCommands(t, setup(t, tg))
		})
	}
}

func testCommands(t *testing.T, e *env) {
	ctx := context.Background()
	// The records, all made through the engine: one whose handler ended
	// its transaction itself (its outcome unknown), a completed payment,
	// a failed one, five claims whose holder crashed, one settled record
	// whose retention ends at once, then (after the lease) a live claim.
	a := begin(t, e.ended, "erin", "unknown-1")
	if resp := a.Finish(idem.Result{Status: 201, Header: http.Header{}, Body: []byte(`{"id":"p0"}`)}); resp.Status != http.StatusInternalServerError {
		t.Fatalf("the ended transaction answered %d", resp.Status)
	}
	finish(t, begin(t, e.engine, "alice", "pay-1"), http.StatusCreated, `{"id":"p1"}`)
	finish(t, begin(t, e.engine, "alice", "pay-2"), http.StatusUnprocessableEntity, `{"error":"card declined"}`)
	charged := map[string]string{} // the crashed attempts' downstream keys
	for i := 1; i <= 5; i++ {
		key := fmt.Sprintf("stuck-%d", i)
		a := begin(t, e.crash, "bob", key)
		dk, err := idem.DownstreamKey(a.Context(), "charge")
		if err != nil {
			t.Fatal(err)
		}
		charged[key] = dk
		a.Abort()
	}
	short := newEngine(t, e.opened.Store, 2*lease)
	finish(t, begin(t, short, "carol", "old-1"), http.StatusCreated, `{"id":"p0"}`)
	time.Sleep(2*lease + 200*time.Millisecond)
	// The live claim outlasts the test on a loaded machine: its lease and
	// its handler's deadline are a minute.
	live := begin(t, newEngineLease(t, e.opened.Store, time.Hour, time.Minute, 30*time.Second), "dave", "live-1")
	t.Cleanup(live.Abort) // a no-op once finished; else its open transaction would block the cleanup

	settled := [4]string{"2", "1", "0", "1"} // completed, failed, released, expired
	settledJSON := settled
	if e.tg.selfExpire {
		settled = [4]string{"not counted", "not counted", "not counted", "0"}
		settledJSON = [4]string{"null", "null", "null", "0"}
	}

	t.Run("stats", func(t *testing.T) {
		out, err := e.run(ctl.Stats, e.opts())
		if err != nil {
			t.Fatal(err)
		}
		e.want("stats", out, `store  <STORE>
store clock  <TIME>
in progress  7
  stale  6 (past their own lease)
  outcome unknown  1 of them (resolve with idemctl complete or release --force)
  oldest lock  <TIME> (<AGE>)
completed  `+settled[0]+`
failed  `+settled[1]+`
released  `+settled[2]+` (free again; kept for their nonce)
expired  `+settled[3]+` (awaiting purge)
`)
		o := e.opts()
		o.JSON = true
		out, err = e.run(ctl.Stats, o)
		if err != nil {
			t.Fatal(err)
		}
		e.want("stats --json", out, `{
  "store": "<STORE>",
  "now": "<TIME>",
  "in_progress": 7,
  "completed": `+settledJSON[0]+`,
  "failed": `+settledJSON[1]+`,
  "released": `+settledJSON[2]+`,
  "stale": 6,
  "uncertain": 1,
  "stale_capped": false,
  "oldest_locked_at": "<TIME>",
  "oldest_age_seconds": <N>,
  "expired": `+settledJSON[3]+`
}
`)
	})

	t.Run("stale", func(t *testing.T) {
		o := e.opts()
		o.Limit = 3
		out, err := e.run(ctl.Stale, o)
		if err != nil {
			t.Fatal(err)
		}
		e.want("stale", out, `PRINCIPAL  KEY  REQUEST ID  LOCKED AT (UTC)  LEASE ENDED  OUTCOME
erin  unknown-1  req-unknown-1  <TIME>  <AGE>  unknown
bob  stuck-1  req-stuck-1  <TIME>  <AGE>  -
bob  stuck-2  req-stuck-2  <TIME>  <AGE>  -
3 stale claims (the limit; there may be more: --limit)
1 with `+ctl.UncertainNote+`
`)
		o.JSON, o.Limit = true, 2
		out, err = e.run(ctl.Stale, o)
		if err != nil {
			t.Fatal(err)
		}
		e.want("stale --json", out, `[
  {
    "principal": "erin",
    "key": "unknown-1",
    "state": "in_progress",
    "fingerprint": "<FP>",
    "request_id": "req-unknown-1",
    "lease_token": "<TOKEN>",
    "created_at": "<TIME>",
    "locked_at": "<TIME>",
    "lease_expires_at": "<TIME>",
    "expires_at": "<TIME>",
    "lock_age_seconds": <N>,
    "stale": true,
    "uncertain": true,
    "expired": false
  },
  {
    "principal": "bob",
    "key": "stuck-1",
    "state": "in_progress",
    "fingerprint": "<FP>",
    "request_id": "req-stuck-1",
    "lease_token": "<TOKEN>",
    "created_at": "<TIME>",
    "locked_at": "<TIME>",
    "lease_expires_at": "<TIME>",
    "expires_at": "<TIME>",
    "lock_age_seconds": <N>,
    "stale": true,
    "uncertain": false,
    "expired": false
  }
]
`)
	})

	t.Run("show", func(t *testing.T) {
		show := func(o ctl.Options, p, k string) (string, error) {
			return e.run(func(ctx context.Context, w io.Writer, o ctl.Options) error { return ctl.Show(ctx, w, o, p, k) }, o)
		}
		out, err := show(e.opts(), "alice", "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		e.want("show", out, `principal  alice
key  pay-1
state  completed
fingerprint  <FP>
request id  req-pay-1
lease token  <TOKEN>
created at  <TIME> (<AGE>)
locked at  <TIME> (<AGE>)
expires at  <TIME> (<AGE>)
status  201
header  Content-Type: application/json
header  Location: /payments/p1
body  11 bytes (--body prints it)
`)
		o := e.opts()
		o.Body = true
		out, err = show(o, "alice", "pay-2")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out, "status  422\nheader  Content-Type: application/json\nheader  Location: /payments/p1\nbody  25 bytes\n{\"error\":\"card declined\"}\n") {
			t.Errorf("show --body:\n%s", out)
		}
		o.JSON = true
		var raw bytes.Buffer
		if err := ctl.Show(ctx, &raw, o, "alice", "pay-1"); err != nil {
			t.Fatal(err)
		}
		var j map[string]any
		if err := json.Unmarshal(raw.Bytes(), &j); err != nil || j["body"] != `{"id":"p1"}` || j["status"] != 201.0 || j["state"] != "completed" {
			t.Errorf("show --json --body = %s (%v)", raw.String(), err)
		}
		if out, err := show(e.opts(), "dave", "live-1"); err != nil || !strings.Contains(out, "state  in_progress (lease live: it ends <AGE>)\n") {
			t.Errorf("show live-1: %v\n%s", err, out)
		}
		if out, err := show(e.opts(), "bob", "stuck-1"); err != nil || !strings.Contains(out, "state  in_progress (stale: its lease ended <AGE>)\n") {
			t.Errorf("show stuck-1: %v\n%s", err, out)
		}
		if out, err := show(e.opts(), "erin", "unknown-1"); err != nil || !strings.Contains(out, "\noutcome  unknown: an attempt's work may have committed; resolve with idemctl complete or release --force\n") {
			t.Errorf("show unknown-1: %v\n%s", err, out)
		}
		_, err = show(e.opts(), "alice", "no-such-key")
		if !errors.Is(err, idemstore.ErrNotFound) || ctl.ExitCode(err) != ctl.ExitNotFound {
			t.Errorf("show of a missing key: %v (exit %d), want not found (exit 1)", err, ctl.ExitCode(err))
		}
	})

	release := func(o ctl.Options, p, k string) (string, error) {
		return e.run(func(ctx context.Context, w io.Writer, o ctl.Options) error { return ctl.Release(ctx, w, o, p, k) }, o)
	}

	t.Run("release refuses a live lease and an unknown outcome without --force", func(t *testing.T) {
		o := e.opts()
		o.Yes = true
		_, err := release(o, "dave", "live-1")
		if !errors.Is(err, ctl.ErrRefused) || ctl.ExitCode(err) != ctl.ExitRefused || !strings.Contains(err.Error(), "may happen twice") {
			t.Fatalf("release of a live lease: %v, want refused with what --force risks", err)
		}
		if s := e.state("dave", "live-1"); s != idemstore.StateInProgress {
			t.Fatalf("after the refused release live-1 is %s", s)
		}
		_, err = release(o, "erin", "unknown-1")
		if !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), ctl.UncertainRisk) {
			t.Fatalf("release of an unknown outcome: %v, want refused with what --force risks", err)
		}
		if r := e.record("erin", "unknown-1"); r.State != idemstore.StateInProgress || !r.Uncertain {
			t.Fatalf("after the refused release unknown-1 is %+v", r)
		}
	})

	t.Run("a fenced release loses to a holder that settled first", func(t *testing.T) {
		o := e.opts()
		o.Force = true
		var asked string
		o.Confirm = func(q string) (bool, error) {
			asked = q
			// While the operator reads the question, the holder settles.
			finish(t, live, http.StatusCreated, `{"id":"p7"}`)
			return true, nil
		}
		_, err := release(o, "dave", "live-1")
		if !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), "nothing released") {
			t.Fatalf("release after the holder settled: %v, want refused", err)
		}
		if !strings.HasPrefix(asked, "FORCE: the lease is live") {
			t.Errorf("the forced release asked %q", asked)
		}
		if s := e.state("dave", "live-1"); s != idemstore.StateCompleted {
			t.Fatalf("live-1 is %s, want the holder's completed outcome", s)
		}
	})

	t.Run("a fenced release loses to a retry that took the claim over", func(t *testing.T) {
		o := e.opts()
		var settledRetry chan struct{}
		o.Confirm = func(string) (bool, error) {
			settledRetry = make(chan struct{})
			// The client retries meanwhile: its claim takes stuck-1 over,
			// and it settles a moment later (on SQLite the release waits
			// for its write lock until then).
			retry := begin(t, e.engine, "bob", "stuck-1")
			go func() {
				defer close(settledRetry)
				time.Sleep(300 * time.Millisecond)
				if resp := retry.Finish(idem.Result{Status: 201, Header: http.Header{}, Body: []byte(`{"id":"p8"}`)}); resp.Status != 201 {
					t.Errorf("the retry's settle answered %d: %s", resp.Status, resp.Body)
				}
			}()
			return true, nil
		}
		_, err := release(o, "bob", "stuck-1")
		if settledRetry != nil {
			<-settledRetry
		}
		if !errors.Is(err, ctl.ErrRefused) {
			t.Fatalf("release after a takeover: %v, want refused", err)
		}
		if s := e.state("bob", "stuck-1"); s != idemstore.StateCompleted {
			t.Fatalf("the retry's record is %s, want its completed outcome", s)
		}
	})

	t.Run("release", func(t *testing.T) {
		o := e.opts()
		o.DryRun = true
		out, err := release(o, "bob", "stuck-2")
		if err != nil || !strings.HasPrefix(out, "would release bob/stuck-2 (in progress, locked <AGE>, lease ended <AGE>, request id req-stuck-2, lease token <TOKEN>)") {
			t.Fatalf("release --dry-run: %v\n%s", err, out)
		}
		o.DryRun = false
		if _, err := release(o, "bob", "stuck-2"); !errors.Is(err, ctl.ErrNotATerminal) {
			t.Fatalf("release without a terminal or --yes: %v, want a usage error", err)
		}
		o.Confirm = func(string) (bool, error) { return false, nil }
		if _, err := release(o, "bob", "stuck-2"); !errors.Is(err, ctl.ErrRefused) {
			t.Fatalf("release not confirmed: %v", err)
		}
		if s := e.state("bob", "stuck-2"); s != idemstore.StateInProgress {
			t.Fatalf("stuck-2 is %s after a dry run and a refusal", s)
		}
		o.Confirm, o.Yes = nil, true
		out, err = release(o, "bob", "stuck-2")
		if err != nil || out != "released bob/stuck-2 (in progress, locked <AGE>, lease ended <AGE>, request id req-stuck-2, lease token <TOKEN>): the key is free for the next retry\n" {
			t.Fatalf("release --yes: %v\n%s", err, out)
		}
		if s := e.state("bob", "stuck-2"); s != idemstore.StateReleased {
			t.Fatalf("stuck-2 is %s after its release", s)
		}
		if _, err := release(o, "alice", "pay-1"); !errors.Is(err, ctl.ErrRefused) || e.state("alice", "pay-1") != idemstore.StateCompleted {
			t.Fatalf("release of a completed record: %v", err)
		}
		if _, err := release(o, "bob", "stuck-2"); !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), "released already") {
			t.Fatalf("second release: %v", err)
		}
		if _, err := release(o, "bob", "never"); ctl.ExitCode(err) != ctl.ExitNotFound {
			t.Fatalf("release of a missing record: %v", err)
		}
	})

	t.Run("complete", func(t *testing.T) {
		o := e.opts()
		o.Yes = true
		resp := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"p0","resolved":true}`)}
		var b bytes.Buffer
		if err := ctl.Complete(ctx, &b, o, "erin", "unknown-1", resp); err != nil {
			t.Fatalf("complete: %v\n%s", err, b.String())
		}
		if r := e.record("erin", "unknown-1"); r.State != idemstore.StateCompleted || r.Uncertain {
			t.Fatalf("after complete unknown-1 is %+v", r)
		}
		// The client's retry replays what the operator stored.
		a, got := e.engine.Begin(ctx, request("erin", "unknown-1"))
		if a != nil || got == nil || got.Status != 201 || string(got.Body) != `{"id":"p0","resolved":true}` {
			if a != nil {
				a.Abort()
			}
			t.Fatalf("retry of unknown-1: attempt %v, response %+v; want the completed 201 replayed", a != nil, got)
		}
	})

	t.Run("purge", func(t *testing.T) {
		o := e.opts()
		o.DryRun = true
		out, err := e.run(ctl.Purge, o)
		if err != nil || out != "would purge "+settled[3]+" expired records\n" {
			t.Fatalf("purge --dry-run: %v\n%s", err, out)
		}
		o.DryRun = false
		if !e.tg.selfExpire {
			if _, err := e.run(ctl.Purge, o); ctl.ExitCode(err) != ctl.ExitUsage {
				t.Fatalf("purge without a terminal or --yes: %v", err)
			}
			if s := e.state("carol", "old-1"); s != idemstore.StateCompleted {
				t.Fatalf("old-1 is %s before the purge", s)
			}
		}
		o.Yes = true
		out, err = e.run(ctl.Purge, o)
		want := "purged 1 expired records\n"
		if e.tg.selfExpire {
			want = "nothing to purge: no expired records\n"
		}
		if err != nil || out != want {
			t.Fatalf("purge --yes: %v\n%s", err, out)
		}
		if s := e.state("carol", "old-1"); s != "absent" {
			t.Fatalf("old-1 is %s after the purge", s)
		}
	})

	t.Run("reconcile", func(t *testing.T) {
		var asked []ctl.ReconcileRequest
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var q ctl.ReconcileRequest
			if err := json.NewDecoder(r.Body).Decode(&q); err != nil || r.Method != http.MethodPost {
				http.Error(w, "bad request", 400)
				return
			}
			asked = append(asked, q)
			w.Header().Set("Content-Type", "application/json")
			switch q.Key {
			case "stuck-3":
				io.WriteString(w, `{"effect": "none"}`) // the provider saw nothing
			case "stuck-4":
				_ = json.NewEncoder(w).Encode(ctl.ReconcileAnswer{Effect: ctl.EffectCompleted, Status: 201,
					Headers: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"p4","reconciled":true}`)})
			default:
				http.Error(w, "provider unavailable", http.StatusBadGateway)
			}
		}))
		defer srv.Close()
		o := e.opts()
		o.URL, o.DryRun, o.Steps = srv.URL, true, []string{"charge"}
		out, err := e.run(ctl.Reconcile, o)
		if !errors.Is(err, ctl.ErrReconciler) {
			t.Fatalf("reconcile --dry-run: %v, want the reconciler's 502 to stop it", err)
		}
		e.want("reconcile --dry-run", out, `PRINCIPAL  KEY  REQUEST ID  OUTCOME  ACTION  DETAIL
bob  stuck-3  req-stuck-3  -  would be released  reconciler: no effect
bob  stuck-4  req-stuck-4  -  would be stored  reconciler: 201, stored as completed
bob  stuck-5  req-stuck-5  -  would be kept  reconciler: answered 502 Bad Gateway, not 200 with an effect (a 404 is no answer either); the pass stops
`)
		for _, k := range []string{"stuck-3", "stuck-4", "stuck-5"} {
			if s := e.state("bob", k); s != idemstore.StateInProgress {
				t.Fatalf("%s is %s after a dry run", k, s)
			}
		}
		o.DryRun, o.JSON = false, true
		out, err = e.run(ctl.Reconcile, o)
		if ctl.ExitCode(err) != ctl.ExitKept {
			t.Fatalf("reconcile: %v, want exit 5 for stuck-5", err)
		}
		var rep []map[string]any
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep) != 3 ||
			rep[0]["action"] != ctl.ActionReleased || rep[1]["action"] != ctl.ActionStored || rep[2]["action"] != ctl.ActionKept {
			t.Fatalf("reconcile --json: %v\n%s", err, out)
		}
		if len(asked) != 6 || asked[3].Key != "stuck-3" || asked[3].RequestID != "req-stuck-3" || asked[3].Principal != "bob" {
			t.Fatalf("the reconciler was asked %+v", asked)
		}
		// The reconciler gets the keys the crashed attempts sent their
		// provider, to look the charges up by.
		for _, q := range asked {
			if got := q.DownstreamKeys["charge"]; got != charged[q.Key] || idem.DownstreamKeyOf(q.Principal, q.Key, q.Nonce, "charge") != got {
				t.Fatalf("%s: the reconciler was sent downstream key %q and nonce %q, the attempt used %q", q.Key, got, q.Nonce, charged[q.Key])
			}
		}
		if s := e.state("bob", "stuck-3"); s != idemstore.StateReleased {
			t.Errorf("stuck-3 (no effect) is %s, want released", s)
		}
		if r := e.record("bob", "stuck-5"); r.State != idemstore.StateInProgress || !r.Uncertain {
			t.Errorf("stuck-5 (no answer) is %+v, want kept with its outcome unknown", r)
		}
		// The client's retry of stuck-4 replays what the reconciler said;
		// its retry of stuck-5 is refused: its outcome is unknown, and the
		// application has no Reconcile to ask.
		a, resp := e.engine.Begin(ctx, request("bob", "stuck-4"))
		if a != nil || resp == nil || resp.Status != 201 || string(resp.Body) != `{"id":"p4","reconciled":true}` {
			if a != nil {
				a.Abort()
			}
			t.Fatalf("retry of stuck-4: attempt %v, response %+v; want the reconciled 201 replayed", a != nil, resp)
		}
		a, resp = e.engine.Begin(ctx, request("bob", "stuck-5"))
		if a != nil || resp == nil || resp.Status != http.StatusConflict {
			if a != nil {
				a.Abort()
			}
			t.Fatalf("retry of stuck-5: attempt %v, response %+v; want 409 outcome-unknown", a != nil, resp)
		}
	})

	t.Run("command line", func(t *testing.T) {
		argv := []string{"show", "alice", "pay-1", "--dsn", e.dsn, "--json"}
		if e.table != "" {
			argv = append(argv, "--table", e.table)
		}
		if e.prefix != "" {
			argv = append(argv, "--prefix", e.prefix)
		}
		var b bytes.Buffer
		if err := ctl.Run(ctx, argv, &b, nil, open.Store); err != nil || !strings.Contains(b.String(), `"request_id": "req-pay-1"`) {
			t.Fatalf("Run(%q): %v\n%s", argv, err, b.String())
		}
		argv[1] = "nobody"
		if code := ctl.ExitCode(ctl.Run(ctx, argv, io.Discard, nil, open.Store)); code != ctl.ExitNotFound {
			t.Errorf("Run of a missing record: exit %d, want 1", code)
		}
	})
}

// The other DSN forms the applications use open the same stores:
// PostgreSQL's key=value, and MySQL as a mysql:// URL.
func TestDSNForms(t *testing.T) {
	pc, err := pgx.ParseConfig(idempgxtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	env := idempgxtest.NewEnv(t, idempgxtest.NewPool(t, 4))
	kv := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", pc.Host, pc.Port, pc.User, pc.Database)
	if pc.Password != "" {
		kv += " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pc.Password) + "'"
	}
	o := openDSN(t, kv, env.Schema+".idempotency_keys", "")
	if err := ctl.Stats(context.Background(), io.Discard, ctl.Options{Store: o.Store, Name: o.Name}); err != nil {
		t.Errorf("stats on %s: %v", o.Name, err)
	}

	fix := idemgormtest.NewFixture(t, "mysql")
	cfg, err := mysqldriver.ParseDSN(idemgormtest.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd == "" {
		u.User = url.User(cfg.User)
	}
	o = openDSN(t, u.String(), fix.Store.Table(), "")
	if err := ctl.Stats(context.Background(), io.Discard, ctl.Options{Store: o.Store, Name: o.Name}); err != nil {
		t.Errorf("stats on %s: %v", o.Name, err)
	}
}

// A store that refuses the password, or cannot be reached: the error names
// the DSN without the password.
func TestWrongPasswordIsNotEchoed(t *testing.T) {
	cfg, err := mysqldriver.ParseDSN(idemgormtest.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Passwd = "n0t-th3-pa55word"
	for _, raw := range []string{
		cfg.FormatDSN(),
		"postgres://postgres:n0t-th3-pa55word@127.0.0.1:1/test?sslmode=disable&connect_timeout=2",
		"host=127.0.0.1 port=1 user=postgres password=n0t-th3-pa55word dbname=test connect_timeout=2",
		"redis://:n0t-th3-pa55word@127.0.0.1:1/0",
	} {
		err := ctl.Run(context.Background(), []string{"stats", "--dsn", raw, "--timeout", "5s"}, io.Discard, nil, open.Store)
		if err == nil || strings.Contains(err.Error(), "pa55word") {
			t.Errorf("%s: %v", dsn.Redact(raw), err)
		}
	}
}

// A password reaches the driver as written, in both MySQL forms, while no
// message shows it: on MariaDB, with a user of its own whose password has
// the characters each form treats specially.
func TestPasswordReachesTheDriver(t *testing.T) {
	fix := idemgormtest.NewFixture(t, "mysql")
	cfg, err := mysqldriver.ParseDSN(idemgormtest.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	const user, pw = "idemctl_test", "p@ss:w/rd%41?"
	db := fix.DB.Exec("CREATE USER IF NOT EXISTS '" + user + "'@'%' IDENTIFIED BY '" + pw + "'")
	if db.Error == nil {
		db = fix.DB.Exec("GRANT ALL ON " + cfg.DBName + ".* TO '" + user + "'@'%'")
	}
	if db.Error != nil {
		t.Skipf("cannot make a user with a password: %v", db.Error)
	}
	t.Cleanup(func() { fix.DB.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	sqlDriver := *cfg
	sqlDriver.User, sqlDriver.Passwd = user, pw
	u := url.URL{Scheme: "mysql", User: url.UserPassword(user, pw), Host: cfg.Addr, Path: "/" + cfg.DBName}
	for _, raw := range []string{sqlDriver.FormatDSN(), u.String()} {
		d, err := dsn.Parse(raw, "")
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		o, err := open.Store(context.Background(), d, fix.Store.Table(), "")
		if err != nil {
			t.Fatalf("open %s: %v", d.Redacted, d.Scrub(err))
		}
		var b bytes.Buffer
		err = ctl.Stats(context.Background(), &b, ctl.Options{Store: o.Store, Name: o.Name})
		o.Close()
		if err != nil {
			t.Errorf("stats on %s: %v", d.Redacted, err)
		}
		if strings.Contains(d.Redacted+b.String(), "w/rd") {
			t.Errorf("the password shows in %q or the output", d.Redacted)
		}
	}
	bad := sqlDriver
	bad.Passwd = pw + "x"
	err = ctl.Run(context.Background(), []string{"stats", "--dsn", bad.FormatDSN(), "--table", fix.Store.Table()}, io.Discard, nil, open.Store)
	if err == nil || strings.Contains(err.Error(), "w/rd") {
		t.Errorf("a wrong password: %v", err)
	}
}
