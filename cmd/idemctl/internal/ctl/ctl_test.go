package ctl_test

// These tests run the commands on core/memstore with its clock pinned, and
// drive the records through a real Engine; the same commands on the SQL
// and Redis stores are tested in internal/open.

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
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixture is a memstore on a pinned clock and engines on it.
type fixture struct {
	t     *testing.T
	clock *atomic.Pointer[time.Time]
	store *memstore.Store
	// engine is the application: lease 2 minutes, longer than the 40 s
	// idemctl used to assume.
	engine *idem.Engine
	// ended is the application whose handlers end their transaction
	// themselves: the settle reports idemstore.ErrTxEnded, and the engine keeps
	// the claim with its outcome unknown.
	ended *idem.Engine
}

// applicationLease is the fixture's Config.Lease.
const applicationLease = 2 * time.Minute

// epoch is the fixture's store clock: years before this machine's, so that
// a command measuring leases on this machine's clock finds every lease
// long expired.
var epoch = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: new(atomic.Pointer[time.Time])}
	now := epoch
	f.clock.Store(&now)
	f.store = memstore.MustNew(memstore.WithClock(func() time.Time { return *f.clock.Load() }))
	f.engine = f.newEngine(f.store)
	f.ended = f.newEngine(endedStore{f.store})
	return f
}

func (f *fixture) newEngine(s idemstore.Store) *idem.Engine {
	e, err := idem.New(idem.Config{FingerprintKey: []byte("test only: a fingerprint key of 32+ bytes"), Store: s,
		Lease: applicationLease, Retention: time.Hour, Logger: quiet})
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

// advance moves the store's clock on by d.
func (f *fixture) advance(d time.Duration) {
	now := f.clock.Load().Add(d)
	f.clock.Store(&now)
}

func (f *fixture) opts() ctl.Options {
	return ctl.Options{Store: f.store, Name: "memory"}
}

// endedStore's transactions end behind the store: Settle reports
// idemstore.ErrTxEnded, as when a handler committed the transaction itself.
type endedStore struct{ idemstore.Store }

func (s endedStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	c, tx, err := s.Store.BeginTx(ctx, l)
	return c, endedTx{tx}, err
}

type endedTx struct{ idemstore.Tx }

func (endedTx) Settle(context.Context, idemstore.Outcome) error {
	return fmt.Errorf("the handler committed the transaction itself: %w", idemstore.ErrTxEnded)
}

func request(principal, key string) idem.Request {
	body := `{"amount":1250,"currency":"EUR"}`
	return idem.Request{Method: "POST", Path: "/payments", Principal: principal, Key: key, ContentType: "application/json",
		RequestID: "req-" + key, Body: strings.NewReader(body), ContentLength: int64(len(body))}
}

// crash claims key and leaves the claim in progress, as when the process
// dies in the handler.
func (f *fixture) crash(key string) {
	f.t.Helper()
	a, resp := f.engine.Begin(context.Background(), request("alice", key))
	if a == nil {
		f.t.Fatalf("Begin(%s) answered %d instead of claiming", key, resp.Status)
	}
}

// uncertain claims key through the application whose handlers end their
// transaction: the claim is kept, its outcome unknown.
func (f *fixture) uncertain(key string) {
	f.t.Helper()
	a, resp := f.ended.Begin(context.Background(), request("alice", key))
	if a == nil {
		f.t.Fatalf("Begin(%s) answered %d instead of claiming", key, resp.Status)
	}
	a.Finish(idem.Result{Status: 201, Header: http.Header{}, Body: []byte(`{"id":"p1"}`)})
	if r := f.record(key); !r.Uncertain || r.State != idemstore.StateInProgress {
		f.t.Fatalf("%s is %+v, want in progress with its outcome unknown", key, r)
	}
}

func (f *fixture) record(key string) idem.Record {
	f.t.Helper()
	r, err := f.store.Get(context.Background(), "alice", key)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// retry sends key's request again through the application and returns its
// answer; an attempt that claims is aborted.
func (f *fixture) retry(key string) *idem.Response {
	f.t.Helper()
	a, resp := f.engine.Begin(context.Background(), request("alice", key))
	if a != nil {
		a.Abort()
		return &idem.Response{Status: -1} // the handler would have run
	}
	return resp
}

func run(cmd func(context.Context, io.Writer, ctl.Options) error, o ctl.Options) (string, error) {
	var b bytes.Buffer
	err := cmd(context.Background(), &b, o)
	return b.String(), err
}

func show(o ctl.Options, key string) (string, error) {
	return run(func(ctx context.Context, w io.Writer, o ctl.Options) error { return ctl.Show(ctx, w, o, "alice", key) }, o)
}

func release(o ctl.Options, key string) (string, error) {
	return run(func(ctx context.Context, w io.Writer, o ctl.Options) error {
		return ctl.Release(ctx, w, o, "alice", key)
	}, o)
}

func complete(o ctl.Options, key string, resp idem.Response) (string, error) {
	return run(func(ctx context.Context, w io.Writer, o ctl.Options) error {
		return ctl.Complete(ctx, w, o, "alice", key, resp)
	}, o)
}

// A claim is stale when its own lease has ended on the store's clock: a
// service whose lease is longer than idemctl's old default of 40 s keeps
// its live claims, and this machine's clock (years later than the
// store's here) has no say.
func TestStalenessIsTheRecordsOwnLease(t *testing.T) {
	f := newFixture(t)
	f.crash("pay-1")
	f.advance(time.Minute) // past 40 s, within the application's 2 minutes
	o := f.opts()

	if out, err := run(ctl.Stale, o); err != nil || out != "no stale claims (none in progress past its lease)\n" {
		t.Errorf("stale within the lease: %v\n%s", err, out)
	}
	if out, err := show(o, "pay-1"); err != nil || !strings.Contains(out, "state        in_progress (lease live: it ends in 1m0s)\n") {
		t.Errorf("show within the lease: %v\n%s", err, out)
	}
	o.Yes = true
	_, err := release(o, "pay-1")
	if !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), "the lease is live (it ends in 1m0s)") {
		t.Fatalf("release within the lease: %v, want refused as live", err)
	}
	if r := f.record("pay-1"); r.State != idemstore.StateInProgress {
		t.Fatalf("after the refused release pay-1 is %s", r.State)
	}
	if out, err := run(ctl.Stats, o); err != nil || !strings.Contains(out, "  stale        0 (past their own lease)\n") {
		t.Errorf("stats within the lease: %v\n%s", err, out)
	}

	f.advance(applicationLease)
	if out, err := run(ctl.Stale, o); err != nil || !strings.Contains(out, "alice      pay-1  req-pay-1   2001-02-03T04:05:06.000Z  1m0s ago     -\n") {
		t.Errorf("stale past the lease: %v\n%s", err, out)
	}
	if out, err := show(o, "pay-1"); err != nil || !strings.Contains(out, "state        in_progress (stale: its lease ended 1m0s ago)\n") ||
		!strings.Contains(out, "lease ends   2001-02-03T04:07:06.000Z (1m0s ago)\n") {
		t.Errorf("show past the lease: %v\n%s", err, out)
	}
	out, err := release(o, "pay-1")
	if err != nil || !strings.HasPrefix(out, "released alice/pay-1 (in progress, locked 3m0s ago, lease ended 1m0s ago, request id req-pay-1,") {
		t.Fatalf("release past the lease: %v\n%s", err, out)
	}
	if r := f.record("pay-1"); r.State != idemstore.StateReleased {
		t.Fatalf("after the release pay-1 is %s", r.State)
	}
}

// A live lease is released only with --force, which asks about the risk.
func TestReleaseForcedLiveLease(t *testing.T) {
	f := newFixture(t)
	f.crash("pay-1")
	o := f.opts()
	o.Force = true
	var asked string
	o.Confirm = func(q string) (bool, error) { asked = q; return true, nil }
	if _, err := release(o, "pay-1"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(asked, "FORCE: the lease is live (it ends in 2m0s); its holder may still be running") {
		t.Errorf("the forced release asked %q", asked)
	}
	if r := f.record("pay-1"); r.State != idemstore.StateReleased {
		t.Fatalf("pay-1 is %s", r.State)
	}
}

func TestUncertain(t *testing.T) {
	f := newFixture(t)
	f.uncertain("pay-1")
	f.crash("pay-2")
	f.advance(3 * time.Minute)
	if resp := f.retry("pay-1"); resp.Status != http.StatusConflict || !strings.Contains(string(resp.Body), "outcome-unknown") {
		t.Fatalf("retry of pay-1: %d %s, want 409 outcome-unknown", resp.Status, resp.Body)
	}
	o := f.opts()

	out, err := run(ctl.Stale, o)
	if err != nil || !strings.Contains(out, "  3m0s ago     unknown\n") ||
		!strings.HasSuffix(out, "2 stale claims\n1 with "+ctl.UncertainNote+"\n") {
		t.Errorf("stale: %v\n%s", err, out)
	}
	out, err = show(o, "pay-1")
	if err != nil || !strings.Contains(out, "\noutcome      unknown: an attempt's work may have committed; resolve with idemctl complete or release --force\n") {
		t.Errorf("show: %v\n%s", err, out)
	}
	if out, err := show(o, "pay-2"); err != nil || strings.Contains(out, "outcome") {
		t.Errorf("show of a claim whose holder crashed: %v\n%s", err, out)
	}
	o.JSON = true
	out, err = show(o, "pay-1")
	var j map[string]any
	if err != nil || json.Unmarshal([]byte(out), &j) != nil || j["uncertain"] != true || j["stale"] != true {
		t.Errorf("show --json: %v\n%s", err, out)
	}
	o.JSON = false
	if out, err := run(ctl.Stats, o); err != nil || !strings.Contains(out, "  outcome unknown  1 of them") {
		t.Errorf("stats: %v\n%s", err, out)
	}

	// release refuses it without --force, and says what it risks.
	o.Yes = true
	_, err = release(o, "pay-1")
	if !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), ctl.UncertainRisk) {
		t.Fatalf("release of an outcome-unknown record: %v, want refused with what it risks", err)
	}
	o.Yes, o.Force = false, true
	var asked string
	o.Confirm = func(q string) (bool, error) { asked = q; return false, nil }
	if _, err := release(o, "pay-1"); !errors.Is(err, ctl.ErrRefused) {
		t.Fatalf("release --force not confirmed: %v", err)
	}
	if !strings.HasPrefix(asked, "FORCE: "+ctl.UncertainRisk+". Release alice/pay-1 (in progress, locked 3m0s ago, lease ended 3m0s ago, outcome unknown,") {
		t.Errorf("release --force asked %q", asked)
	}
	if r := f.record("pay-1"); r.State != idemstore.StateInProgress || !r.Uncertain {
		t.Fatalf("after the refusals pay-1 is %+v", r)
	}

	// complete resolves it: the retry replays the stored response.
	o = f.opts()
	o.Yes, o.StoredBody = true, ctl.StoredBodyPlain
	resp := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"p1"}`)}
	out, err = complete(o, "pay-1", resp)
	if err != nil || out != "stored 201 as the completed outcome of alice/pay-1 (in progress, outcome unknown, request id req-pay-1; "+
		"1 header fields, 11 body bytes): retries replay it\n" {
		t.Fatalf("complete: %v\n%s", err, out)
	}
	if r := f.record("pay-1"); r.State != idemstore.StateCompleted || r.Uncertain {
		t.Fatalf("after complete pay-1 is %+v", r)
	}
	got := f.retry("pay-1")
	if got.Status != 201 || string(got.Body) != `{"id":"p1"}` || got.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("retry after complete: %d %v %s, want the stored 201", got.Status, got.Header, got.Body)
	}
	// And a crashed claim's stale record too, as failed for a 4xx.
	out, err = complete(o, "pay-2", idem.Response{Status: 422, Body: []byte(`{"error":"declined"}`)})
	if err != nil || !strings.HasPrefix(out, "stored 422 as the failed outcome of alice/pay-2 (in progress, stale,") {
		t.Fatalf("complete of a stale claim: %v\n%s", err, out)
	}
	if got := f.retry("pay-2"); got.Status != 422 {
		t.Fatalf("retry of pay-2: %d", got.Status)
	}
	if _, err := complete(o, "pay-2", resp); !errors.Is(err, ctl.ErrRefused) {
		t.Fatalf("complete of a settled record: %v, want refused", err)
	}
}

// An operator who answers the prompt with end of input (^D) has confirmed
// nothing: refused (exit 4), not a store error.
func TestNoAnswerIsARefusal(t *testing.T) {
	f := newFixture(t)
	f.crash("pay-1")
	f.advance(3 * time.Minute)
	o := f.opts()
	var prompt bytes.Buffer
	o.Confirm = ctl.PromptConfirm(strings.NewReader(""), &prompt)
	_, err := release(o, "pay-1")
	if ctl.ExitCode(err) != ctl.ExitRefused || !strings.HasSuffix(prompt.String(), "? The key is then free: the next retry runs the handler afresh. [y/N] ") {
		t.Fatalf("release answered with EOF: %v (exit %d), prompt %q", err, ctl.ExitCode(err), prompt.String())
	}
	if r := f.record("pay-1"); r.State != idemstore.StateInProgress {
		t.Fatalf("pay-1 is %s", r.State)
	}
}

func TestCompleteRefuses(t *testing.T) {
	f := newFixture(t)
	f.uncertain("pay-1")
	f.crash("live")
	ok := idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{}`)}
	for _, tc := range []struct {
		name string
		set  func(*ctl.Options)
		key  string
		resp idem.Response
		want int
		msg  string
	}{
		{name: "no --stored-body", set: func(o *ctl.Options) { o.StoredBody = "" }, resp: ok, want: ctl.ExitUsage, msg: "cannot seal"},
		{name: "unknown --stored-body", set: func(o *ctl.Options) { o.StoredBody = "sealed" }, resp: ok, want: ctl.ExitUsage},
		{name: "a sensitive stored header", set: func(o *ctl.Options) { o.StoredHeaders = []string{"Content-Type", "set-cookie"} },
			resp: idem.Response{Status: 201, Header: http.Header{"Set-Cookie": {"session=s3cret"}}}, want: ctl.ExitUsage, msg: "a session or a credential"},
		{name: "a header not stored", resp: idem.Response{Status: 201, Header: http.Header{"X-Payment-Id": {"p1"}}},
			want: ctl.ExitUsage, msg: "X-Payment-Id is not in --stored-headers"},
		{name: "a header splitting the replay", resp: idem.Response{Status: 201, Header: http.Header{"Location": {"/p\r\nSet-Cookie: x"}}},
			want: ctl.ExitUsage, msg: "control character"},
		{name: "an invalid header name", resp: idem.Response{Status: 201, Header: http.Header{"Bad Name": {"x"}}}, want: ctl.ExitUsage},
		{name: "a 5xx", resp: idem.Response{Status: 503}, want: ctl.ExitUsage, msg: "releases rather than stores"},
		{name: "a 429", resp: idem.Response{Status: 429}, want: ctl.ExitUsage},
		{name: "a 1xx", resp: idem.Response{Status: 102}, want: ctl.ExitUsage},
		{name: "a body too large", resp: idem.Response{Status: 201, Body: make([]byte, ctl.MaxBody+1)}, want: ctl.ExitUsage},
		{name: "a live lease", key: "live", resp: ok, want: ctl.ExitRefused, msg: "live lease"},
		{name: "no record", key: "none", resp: ok, want: ctl.ExitNotFound},
		{name: "not confirmed", set: func(o *ctl.Options) { o.Yes = false }, resp: ok, want: ctl.ExitUsage, msg: "stdin is not a terminal"},
	} {
		o := f.opts()
		o.Yes, o.StoredBody = true, ctl.StoredBodyPlain
		if tc.set != nil {
			tc.set(&o)
		}
		key := tc.key
		if key == "" {
			key = "pay-1"
		}
		_, err := complete(o, key, tc.resp)
		if ctl.ExitCode(err) != tc.want || !strings.Contains(fmt.Sprint(err), tc.msg) {
			t.Errorf("%s: %v (exit %d), want exit %d with %q", tc.name, err, ctl.ExitCode(err), tc.want, tc.msg)
		}
	}
	if r := f.record("pay-1"); r.State != idemstore.StateInProgress || !r.Uncertain {
		t.Fatalf("after the refusals pay-1 is %+v", r)
	}
}

// With --stored-body=omit (an application that seals its bodies), complete
// stores no body, which the application's replay does not try to open.
func TestCompleteOmitsTheBody(t *testing.T) {
	f := newFixture(t)
	f.uncertain("pay-1")
	o := f.opts()
	o.Yes, o.StoredBody = true, ctl.StoredBodyOmit
	o.StoredHeaders = []string{"Location", "X-Payment-Id"}
	resp := idem.Response{Status: 201, Header: http.Header{"location": {"/payments/p1"}, "X-Payment-Id": {"p1"}}, Body: []byte(`{"id":"p1"}`)}
	if _, err := complete(o, "pay-1", resp); err != nil {
		t.Fatal(err)
	}
	r := f.record("pay-1")
	if r.State != idemstore.StateCompleted || len(r.Response.Body) != 0 || r.Response.Header.Get("Location") != "/payments/p1" ||
		r.Response.Header.Get("X-Payment-Id") != "p1" {
		t.Fatalf("stored %+v", r.Response)
	}
}

// The takeover is fenced: a retry that took the claim over between the
// read and the takeover keeps it, and nothing is stored.
func TestCompleteLosesToARetry(t *testing.T) {
	f := newFixture(t)
	f.crash("pay-1")
	f.advance(3 * time.Minute)
	o := f.opts()
	o.StoredBody = ctl.StoredBodyPlain
	var retry *idem.Attempt
	o.Confirm = func(string) (bool, error) {
		retry, _ = f.engine.Begin(context.Background(), request("alice", "pay-1"))
		return true, nil
	}
	_, err := complete(o, "pay-1", idem.Response{Status: 201})
	if retry == nil {
		t.Fatal("the retry did not take the claim over")
	}
	if !errors.Is(err, ctl.ErrRefused) || !strings.Contains(err.Error(), "changed since it was read") {
		t.Fatalf("complete after a takeover: %v, want refused", err)
	}
	if resp := retry.Finish(idem.Result{Status: 201, Header: http.Header{}, Body: []byte(`{"id":"p9"}`)}); resp.Status != 201 {
		t.Fatalf("the retry's settle answered %d: %s", resp.Status, resp.Body)
	}
}

// reconciler is a reconciler whose answers the test sets per key.
type reconciler struct {
	srv    *httptest.Server
	asked  atomic.Int32
	answer func(w http.ResponseWriter, q ctl.ReconcileRequest)
}

func newReconciler(t *testing.T, answer func(w http.ResponseWriter, q ctl.ReconcileRequest)) *reconciler {
	rc := &reconciler{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.asked.Add(1)
		var q ctl.ReconcileRequest
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil || r.Method != http.MethodPost {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		rc.answer(w, q)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func writeAnswer(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, body)
}

func TestReconcile(t *testing.T) {
	f := newFixture(t)
	f.crash("none")
	f.uncertain("done")
	f.advance(3 * time.Minute)
	charged := map[string]string{}
	rc := newReconciler(t, func(w http.ResponseWriter, q ctl.ReconcileRequest) {
		charged[q.Key] = q.DownstreamKeys["charge"]
		switch q.Key {
		case "none":
			writeAnswer(w, `{"effect": "none"}`)
		case "done":
			if !q.Uncertain {
				http.Error(w, "want uncertain", 400)
				return
			}
			writeAnswer(w, `{"effect": "completed", "status": 201, "headers": {"Content-Type": ["application/json"], "X-Internal": ["dropped"]},
				"body": "eyJpZCI6InA0In0="}`) // {"id":"p4"}
		}
	})
	o := f.opts()
	o.URL, o.StoredBody, o.Steps = rc.srv.URL, ctl.StoredBodyPlain, []string{"charge"}
	o.DryRun = true
	out, err := run(ctl.Reconcile, o)
	if err != nil || out != `PRINCIPAL  KEY   REQUEST ID  OUTCOME  ACTION             DETAIL
alice      done  req-done    unknown  would be stored    reconciler: 201, stored as completed without X-Internal (not in --stored-headers)
alice      none  req-none    -        would be released  reconciler: no effect
` {
		t.Fatalf("reconcile --dry-run: %v\n%s", err, out)
	}
	if f.record("none").State != idemstore.StateInProgress || f.record("done").State != idemstore.StateInProgress {
		t.Fatal("the dry run changed a record")
	}
	o.DryRun = false
	if out, err = run(ctl.Reconcile, o); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	if r := f.record("none"); r.State != idemstore.StateReleased {
		t.Errorf("none is %s, want released", r.State)
	}
	if got := f.retry("done"); got.Status != 201 || string(got.Body) != `{"id":"p4"}` || got.Header.Get("X-Internal") != "" {
		t.Errorf("retry of done: %d %v %s, want the reconciled 201 without X-Internal", got.Status, got.Header, got.Body)
	}
	if got := f.retry("none"); got.Status != -1 {
		t.Errorf("retry of none: %d, want the handler to run", got.Status)
	}
	for k, dk := range charged {
		r := f.record(k)
		if dk != idem.DownstreamKeyOf("alice", k, r.Nonce, "charge") {
			t.Errorf("%s: sent downstream key %q", k, dk)
		}
	}
	if out, err := run(ctl.Reconcile, o); err != nil || out != "no stale claims (none in progress past its lease)\n" {
		t.Errorf("second reconcile: %v\n%s", err, out)
	}
}

// Any answer but an explicit effect keeps the claim, stops the pass and
// exits 5: a 404 (a typo in --url), a redirect (never followed), an error,
// a malformed or unknown body, a response that cannot be stored, no
// answer in time.
func TestReconcileKeepsWithoutAValidAnswer(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		writeAnswer(w, `{"effect": "none"}`)
	}))
	defer other.Close()
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		msg    string
	}{
		{"404", func(w http.ResponseWriter) { http.NotFound(w, nil) }, "404 Not Found"},
		{"307", func(w http.ResponseWriter) {
			w.Header().Set("Location", other.URL)
			w.WriteHeader(http.StatusTemporaryRedirect)
		}, "a redirect is not followed"},
		{"502", func(w http.ResponseWriter) { http.Error(w, "provider down", http.StatusBadGateway) }, "502"},
		{"not JSON", func(w http.ResponseWriter) { io.WriteString(w, `{"effect": "none"}`) }, "Content-Type"},
		{"malformed", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "none"`) }, "not a valid effect object"},
		{"an unknown member", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "none", "efect": "completed"}`) }, "unknown field"},
		{"an unknown effect", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "maybe"}`) }, "unknown effect"},
		{"an empty object", func(w http.ResponseWriter) { writeAnswer(w, `{}`) }, "unknown effect"},
		{"two values", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "none"} {"effect": "none"}`) }, "more than one"},
		{"none with a response", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "none", "status": 201}`) }, "which is it"},
		{"completed without a status", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "completed"}`) }, "without a status"},
		{"a 5xx to store", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "completed", "status": 500}`) }, "releases rather than stores"},
		{"a header splitting the replay", func(w http.ResponseWriter) {
			writeAnswer(w, `{"effect": "completed", "status": 201, "headers": {"Location": ["/p\r\nSet-Cookie: s=1"]}}`)
		}, "control character"},
		{"a body not base64", func(w http.ResponseWriter) { writeAnswer(w, `{"effect": "completed", "status": 201, "body": "{}"}`) }, "not a valid effect object"},
		{"too large", func(w http.ResponseWriter) {
			writeAnswer(w, `{"effect": "completed", "status": 201, "body": "`+strings.Repeat("A", 3<<20)+`"}`)
		}, "larger than"},
		{"too slow", func(w http.ResponseWriter) { time.Sleep(time.Second); writeAnswer(w, `{"effect": "none"}`) }, "no answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.crash("k1")
			f.advance(time.Second) // k1 is the first stale claim
			f.crash("k2")
			f.advance(3 * time.Minute)
			rc := newReconciler(t, func(w http.ResponseWriter, _ ctl.ReconcileRequest) { tc.answer(w) })
			o := f.opts()
			o.URL, o.StoredBody, o.AskTimeout = rc.srv.URL, ctl.StoredBodyPlain, 300*time.Millisecond
			start := time.Now()
			out, err := run(ctl.Reconcile, o)
			if !errors.Is(err, ctl.ErrReconciler) || ctl.ExitCode(err) != ctl.ExitKept || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("reconcile: %v (exit %d), want exit 5 with %q\n%s", err, ctl.ExitCode(err), tc.msg, out)
			}
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("reconcile took %v with an ask timeout of 300ms", d)
			}
			if !strings.Contains(out, "kept") || !strings.Contains(out, "the claim is kept (outcome unknown), the pass stops") {
				t.Errorf("the report:\n%s", out)
			}
			// The claim is kept, its outcome unknown now, and its lease
			// ended: the application's retry is refused, not run.
			r := f.record("k1")
			if r.State != idemstore.StateInProgress || !r.Uncertain || f.clock.Load().Before(r.LeaseExpiresAt) {
				t.Errorf("k1 is %+v, want kept", r)
			}
			if got := f.retry("k1"); got.Status != http.StatusConflict {
				t.Errorf("retry of k1: %d, want 409", got.Status)
			}
			if n := rc.asked.Load(); n != 1 {
				t.Errorf("the reconciler was asked %d times, want once: the pass stops at the first claim kept", n)
			}
			if r := f.record("k2"); r.State != idemstore.StateInProgress || r.Uncertain {
				t.Errorf("k2, never asked, is %+v", r)
			}
			if n := elsewhere.Load(); n != 0 {
				t.Errorf("the redirect's target was asked %d times", n)
			}
		})
	}
}

// An application that seals its bodies: reconcile stores the answer
// without its body, which the application's replay never has to open.
func TestReconcileOmitsTheBody(t *testing.T) {
	f := newFixture(t)
	f.uncertain("k1")
	rc := newReconciler(t, func(w http.ResponseWriter, _ ctl.ReconcileRequest) {
		writeAnswer(w, `{"effect": "completed", "status": 201, "headers": {"Location": ["/payments/p1"]}, "body": "eyJpZCI6InA0In0="}`)
	})
	o := f.opts()
	o.URL = rc.srv.URL
	if _, err := run(ctl.Reconcile, o); ctl.ExitCode(err) != ctl.ExitUsage || !strings.Contains(err.Error(), "--stored-body is required") {
		t.Fatalf("reconcile without --stored-body: %v, want a usage error", err)
	}
	if rc.asked.Load() != 0 {
		t.Fatal("the reconciler was asked")
	}
	o.StoredBody = ctl.StoredBodyOmit
	out, err := run(ctl.Reconcile, o)
	if err != nil || !strings.Contains(out, "stored as completed without its body (--stored-body=omit)") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	r := f.record("k1")
	if r.State != idemstore.StateCompleted || len(r.Response.Body) != 0 || r.Response.Header.Get("Location") != "/payments/p1" {
		t.Fatalf("stored %+v", r.Response)
	}
}

// fakeStore opens the fixture's store for any DSN and records the DSN.
func (f *fixture) opener(got *dsn.DSN) ctl.Opener {
	return func(_ context.Context, d dsn.DSN, _, _ string) (*ctl.Opened, error) {
		if got != nil {
			*got = d
		}
		return &ctl.Opened{Store: f.store, Name: "memory", Close: func() {}}, nil
	}
}

// With stdin not a terminal (here /dev/null, a character device, and a
// pipe), a command that changes a record does not prompt: it exits 2 and
// says to pass --yes.
func TestNotATerminal(t *testing.T) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pw.Close()
	body := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(body, []byte(`{"id":"p1"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, stdin := range []*os.File{devNull, pr} {
		for _, argv := range [][]string{
			{"release", "alice", "pay-1", "--force"},
			{"complete", "alice", "pay-1", "--status", "201", "--body-file", body, "--stored-body", "plain"},
		} {
			f := newFixture(t)
			f.uncertain("pay-1")
			var stdout, stderr bytes.Buffer
			code := ctl.Main(context.Background(), append(argv, "--dsn", "sqlite:x"), stdin, &stdout, &stderr, f.opener(nil))
			if code != ctl.ExitUsage || stderr.String() != "idemctl: usage: stdin is not a terminal: pass --yes to confirm, or --dry-run to see what would be done\n" {
				t.Errorf("%s < %s: exit %d\n%s%s", argv, stdin.Name(), code, stdout.String(), stderr.String())
			}
			if r := f.record("pay-1"); r.State != idemstore.StateInProgress || !r.Uncertain {
				t.Errorf("%s < %s: pay-1 is %+v", argv, stdin.Name(), r)
			}
		}
	}
	// purge too, when there is something to purge.
	f := newFixture(t)
	f.crash("old")
	f.advance(2 * time.Hour) // past the retention
	var stderr bytes.Buffer
	if code := ctl.Main(context.Background(), []string{"purge", "--dsn", "sqlite:x"}, devNull, io.Discard, &stderr, f.opener(nil)); code != ctl.ExitUsage ||
		!strings.Contains(stderr.String(), "stdin is not a terminal: pass --yes to confirm") {
		t.Errorf("purge < /dev/null: exit %d\n%s", code, stderr.String())
	}
	// With --yes it runs.
	f = newFixture(t)
	f.uncertain("pay-1")
	var stdout bytes.Buffer
	stderr.Reset()
	argv := []string{"complete", "alice", "pay-1", "--status", "201", "--header", "Content-Type: application/json",
		"--body-file", body, "--stored-body", "plain", "--yes", "--dsn", "sqlite:x"}
	if code := ctl.Main(context.Background(), argv, devNull, &stdout, &stderr, f.opener(nil)); code != ctl.ExitOK {
		t.Fatalf("complete --yes: exit %d\n%s", code, stderr.String())
	}
	if got := f.retry("pay-1"); got.Status != 201 || string(got.Body) != `{"id":"p1"}` || got.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("retry after complete: %d %v %s", got.Status, got.Header, got.Body)
	}
}

// The command line picks the store by the DSN's shape or by --store, and no
// error it returns holds a DSN's password.
func TestDSNs(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		argv []string
		kind dsn.Kind
	}{
		{[]string{"--dsn", "host=db user=app password=s3cret dbname=payments"}, dsn.Postgres},
		{[]string{"--dsn", "app:s3cret@tcp(db:3306)/payments?parseTime=true"}, dsn.MySQL},
		{[]string{"--dsn", "mysql://app:s3cret@db/payments"}, dsn.MySQL},
		{[]string{"--dsn", "/var/lib/idem.db", "--store", "sqlite"}, dsn.SQLite},
		{[]string{"--dsn", "redis://:s3cret@cache:6379/0", "--prefix", "app:"}, dsn.Redis},
	} {
		var got dsn.DSN
		if err := ctl.Run(context.Background(), append([]string{"stats"}, tc.argv...), io.Discard, nil, f.opener(&got)); err != nil {
			t.Errorf("%q: %v", tc.argv, err)
		}
		if got.Kind != tc.kind {
			t.Errorf("%q opened %s, want %s", tc.argv, got.Kind, tc.kind)
		}
	}
	failing := func(_ context.Context, d dsn.DSN, _, _ string) (*ctl.Opened, error) {
		return nil, fmt.Errorf("connect %s (driver DSN %q): %w", "the DSN", d.Driver, idemstore.ErrTransient)
	}
	for _, argv := range [][]string{
		{"stats", "--dsn", "postgres://app:s3cret@db/payments"},
		{"stats", "--dsn", "host=db password='s3cret x'"},
		{"stats", "--dsn", "mysql://app:s3cret@db/payments"},
		{"stats", "--dsn", "app:s3cret@tcp(db:3306)/payments"},
		{"stats", "--dsn", "redis://:s3cret@cache:6379/0"},
		{"stats", "--dsn", "postgres://app:s3cret@db:port/payments"},
		{"stats", "--dsn", "ftp://app:s3cret@db/payments"},
		{"stats", "--dsn", "app:s3cret@tcp(db:3306)/payments", "--store", "redis"},
		{"stats", "--dsn", "redis://:s3cret@cache:6379/0", "--table", "t"},
		{"stats", "postgres://app:s3cret@db/payments"},
	} {
		err := ctl.Run(context.Background(), argv, io.Discard, nil, failing)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v", argv, err)
		}
	}
}

func TestExitCodes(t *testing.T) {
	f := newFixture(t)
	unreachable := func(context.Context, dsn.DSN, string, string) (*ctl.Opened, error) {
		return nil, fmt.Errorf("connect: %w", idemstore.ErrTransient)
	}
	for _, tc := range []struct {
		argv []string
		want int
	}{
		{nil, ctl.ExitUsage},
		{[]string{"frobnicate", "--dsn", "sqlite:x"}, ctl.ExitUsage},
		{[]string{"show", "alice", "--dsn", "sqlite:x"}, ctl.ExitUsage},
		{[]string{"stats"}, ctl.ExitUsage}, // no --dsn
		{[]string{"stats", "--dsn", "sqlite:x", "--lease", "40s"}, ctl.ExitUsage},
		{[]string{"stats", "--dsn", "sqlite:x", "--force"}, ctl.ExitUsage},
		{[]string{"stats", "--dsn", "sqlite:x", "--nope"}, ctl.ExitUsage},
		{[]string{"stats", "--dsn", "nothing"}, ctl.ExitUsage},
		{[]string{"stats", "--dsn", "sqlite:x.db", "--prefix", "p:"}, ctl.ExitUsage},
		{[]string{"release", "a", "b", "--dsn", "sqlite:x", "--status", "201"}, ctl.ExitUsage},
		{[]string{"complete", "a", "b", "--dsn", "sqlite:x"}, ctl.ExitUsage}, // no --status
		{[]string{"complete", "a", "b", "--dsn", "sqlite:x", "--status", "201", "--header", "nocolon"}, ctl.ExitUsage},
		{[]string{"complete", "a", "b", "--dsn", "sqlite:x", "--status", "201", "--body-file", "/nonexistent"}, ctl.ExitUsage},
		{[]string{"complete", "a", "b", "--dsn", "sqlite:x", "--status", "201", "--body-file", "x", "--stored-body", "omit"}, ctl.ExitUsage},
		{[]string{"reconcile", "--dsn", "sqlite:x", "--stored-body", "plain"}, ctl.ExitUsage},                       // no --url
		{[]string{"reconcile", "--dsn", "sqlite:x", "--url", "ftp://h/x", "--stored-body", "plain"}, ctl.ExitUsage}, // not http
		{[]string{"stats", "--dsn", "sqlite:x"}, ctl.ExitStore},
		{[]string{"release", "a", "b", "--dsn", "sqlite:x", "--force", "--yes"}, ctl.ExitStore},
	} {
		t.Setenv("IDEM_DSN", "")
		if got := ctl.ExitCode(ctl.Run(context.Background(), tc.argv, io.Discard, nil, unreachable)); got != tc.want {
			t.Errorf("%q: exit %d, want %d", tc.argv, got, tc.want)
		}
	}
	if got := ctl.ExitCode(ctl.Run(context.Background(), []string{"show", "a", "b", "--dsn", "sqlite:x"}, io.Discard, nil, f.opener(nil))); got != ctl.ExitNotFound {
		t.Errorf("show of a missing record: exit %d", got)
	}
}
