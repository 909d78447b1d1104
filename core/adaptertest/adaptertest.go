package adaptertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
)

// Run runs the suite against the adapter that h mounts, with stores from
// newBackend (storetest.MemBackend, or a real database's Backend).
func Run(t *testing.T, h Harness, newBackend storetest.NewBackend) {
	tests := []struct {
		name string
		fn   func(*testing.T, *suite)
	}{
		{"NewRequiresEngineAndPrincipal", testNewRequiresEngineAndPrincipal},
		{"OnRouteGroupAndGlobal", testGroupAndGlobal},
		{"BeforeAuthFailsClosed", testBeforeAuth},
		{"PrincipalErrorIs401", testPrincipalError},
		{"EarlierHeadersSurvive", testEarlierHeaders},
		{"TransactionCommitsWithRecord", testTransactionCommits},
		{"FirstRequestThenReplay", testFirstThenReplay},
		{"EventRouteIsTheTemplate", testRouteTemplate},
		{"ConcurrentIdenticalRequestsRunOnce", testConcurrentRunOnce},
		{"WaitedDuplicateIsReplayed", testWaitedReplay},
		{"ChangedBodyIs422", testChangedBody},
		{"CanonicalJSONReplays", testCanonicalJSON},
		{"MissingAndInvalidKeysAre400", testBadKeys},
		{"AmbiguousKeysAre400", testAmbiguousKeys},
		{"NoPrincipalIs401AndClaimsNothing", testNoPrincipal},
		{"ClientErrorIsStoredAndReplayed", testClientErrorStored},
		{"ServerErrorIsReleased", testServerErrorReleased},
		{"UncertainOutcomeIs409", testUncertainIs409},
		{"HandlerErrorIsReleased", testHandlerErrorReleased},
		{"HandlerErrorIsClassified", testHandlerErrorClassified},
		{"PanicIsReleased", testPanicReleased},
		{"NothingReachesClientBeforeCommit", testNothingBeforeCommit},
		{"FailedCommitSendsProblemNotHandlerBody", testFailedCommit},
		{"HandlerSeesTransactionAndDeadline", testTransactionAndDeadline},
		{"DeadlineReleases", testDeadlineReleases},
		{"PrincipalsNeverShareKeys", testPrincipalsIsolated},
		{"BodyRestoredForHandler", testBodyRestored},
		{"BodyTooLargeIs413", testBodyTooLarge},
		{"OptionalKeyPassesThrough", testOptionalKey},
		{"ReplayReauthorized", testReplayReauthorized},
		{"StoredRecordHoldsOnlyAllowedData", testStoredRecord},
		{"ReplayedHeadersValidated", testReplayedHeadersValidated},
		{"ProblemsLeakNothing", testProblemsLeakNothing},
		{"HostileBodiesNeverShareAFingerprint", testHostileBodies},
		{"SlowAndBrokenBodies", testSlowAndBrokenBodies},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, &suite{h: h, b: newBackend(t)})
		})
	}
}

type suite struct {
	h Harness
	b storetest.Backend
}

// config returns the Config the suite serves with, for backend b.
func (s *suite) config() idem.Config {
	return idem.Config{FingerprintKey: storetest.FingerprintKey, Store: s.b.Store, RequestTimeout: 5 * time.Second, StoreTimeout: 2 * time.Second, Lease: 10 * time.Second}
}

// serve starts a server with the middleware on a route group, the usual
// placement.
func (s *suite) serve(t *testing.T, cfg idem.Config, h Handler) string {
	t.Helper()
	return s.start(t, Setup{Config: cfg, Handler: h})
}

// start starts a server for setup, ending the test when the adapter's New
// fails.
func (s *suite) start(t *testing.T, setup Setup) string {
	t.Helper()
	base, err := s.h.Serve(t, setup)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return base
}

// wantUntouched ends the test unless a refused request left no trace: p's
// handler never ran and principal's key is not claimed.
func (s *suite) wantUntouched(t *testing.T, p *payments, principal, key string) {
	t.Helper()
	if n := p.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
	if _, err := s.b.Store.Get(context.Background(), principal, key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the key was claimed: %v", err)
	}
}

// payments is a payments-style handler: it writes one business effect per
// execution in the store's transaction and answers 201 with a body unique
// to the execution, a Location, a Set-Cookie and a header outside the
// allow-list.
type payments struct {
	b     storetest.Backend
	runs  atomic.Int64
	delay time.Duration
}

func (p *payments) handle(ctx context.Context, r Request) Reply {
	n := p.runs.Add(1)
	id := fmt.Sprintf("pay_%d", n)
	if err := p.b.WriteEffect(ctx, effectID(r)); err != nil {
		return Reply{Status: 599, Body: []byte("no transaction in the handler's context: " + err.Error())}
	}
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	body, _ := json.Marshal(map[string]any{"id": id, "run": n, "nanos": time.Now().UnixNano()})
	return Reply{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/payments/" + id},
			"Set-Cookie":   {"session=" + id + "; HttpOnly"},
			"X-Not-Stored": {id},
		},
		Body: body,
	}
}

// effectID names the business effect of a request: the principal and key,
// so counts are per idempotent request.
func effectID(r Request) string {
	return r.Header.Get("Authorization") + "|" + r.Header.Get(idem.DefaultHeader)
}

// send posts to the suite's /payments route.
func send(t testing.TB, base, principal, key, body string, extra ...string) Response {
	t.Helper()
	return Send(t, http.MethodPost, base+"/payments", principal, key, body, extra...)
}

func sendErr(ctx context.Context, base, principal, key, body string, extra ...string) (Response, error) {
	return SendContext(ctx, http.MethodPost, base+"/payments", principal, key, body, extra...)
}

// effects counts the business effects of principal's request with key
// (see effectID).
func effects(t testing.TB, b storetest.Backend, principal, key string) int {
	t.Helper()
	return Effects(t, b, "Bearer "+principal+"|"+key)
}

const paymentBody = `{"amount":1000,"currency":"EUR","description":"coffee"}`

func testFirstThenReplay(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	first := send(t, base, "alice", "k-first", paymentBody)
	WantStatus(t, "first request", first, http.StatusCreated)
	if first.Header.Get(idem.ReplayedHeader) != "" {
		t.Fatal("the first response is marked as replayed")
	}
	if first.Header.Get("Set-Cookie") == "" || first.Header.Get("X-Not-Stored") == "" {
		t.Fatal("the first response lost headers the handler set")
	}
	for i := range 3 {
		again := send(t, base, "alice", "k-first", paymentBody)
		WantStatus(t, "replay", again, http.StatusCreated)
		if !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("replay %d body %s, want byte-identical %s", i, again.Body, first.Body)
		}
		for _, h := range []string{"Content-Type", "Location"} {
			if again.Header.Get(h) != first.Header.Get(h) {
				t.Fatalf("replayed %s = %q, want %q", h, again.Header.Get(h), first.Header.Get(h))
			}
		}
		if !again.Replayed() {
			t.Fatalf("replay lacks %s: true", idem.ReplayedHeader)
		}
		if again.Header.Get("Set-Cookie") != "" || again.Header.Get("X-Not-Stored") != "" {
			t.Fatalf("replay carries headers outside the allow-list: %v", again.Header)
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times for one key", n)
	}
	if n := effects(t, s.b, "alice", "k-first"); n != 1 {
		t.Fatalf("%d committed effects, want 1", n)
	}
	// The quoted Structured Field form names the same key.
	sf := send(t, base, "alice", `"k-first"`, paymentBody)
	if !bytes.Equal(sf.Body, first.Body) || !sf.Replayed() {
		t.Fatalf("quoted key form did not replay the bare key: %d %s", sf.Status, sf.Body)
	}
}

func testConcurrentRunOnce(t *testing.T, s *suite) {
	p := &payments{b: s.b, delay: 300 * time.Millisecond}
	base := s.serve(t, s.config(), p.handle)
	const clients = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		replies []Response
		start   = make(chan struct{})
	)
	for range clients {
		wg.Go(func() {
			<-start
			r, err := sendErr(context.Background(), base, "alice", "k-race", paymentBody)
			if err != nil {
				t.Errorf("concurrent request: %v", err)
				return
			}
			mu.Lock()
			replies = append(replies, r)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	var created, conflicts int
	var createdBody []byte
	for _, r := range replies {
		switch r.Status {
		case http.StatusCreated:
			if createdBody != nil && !bytes.Equal(createdBody, r.Body) {
				t.Fatalf("two different 201 bodies for one key: %s and %s", createdBody, r.Body)
			}
			createdBody = r.Body
			created++
		case http.StatusConflict:
			WantProblem(t, "concurrent duplicate", r, http.StatusConflict, idem.ProblemKeyInUse)
			if ra := r.Header.Get("Retry-After"); ra == "" || ra == "0" {
				t.Fatalf("409 without a positive Retry-After: %q", ra)
			}
			conflicts++
		default:
			t.Fatalf("concurrent duplicate got %d %s", r.Status, r.Body)
		}
	}
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times for %d concurrent identical requests", n, clients)
	}
	if created < 1 || conflicts < 1 {
		t.Fatalf("%d created, %d conflicts: want one execution and the rest 409 while it ran", created, conflicts)
	}
	if n := effects(t, s.b, "alice", "k-race"); n != 1 {
		t.Fatalf("%d committed effects, want 1", n)
	}
	after := send(t, base, "alice", "k-race", paymentBody)
	if after.Status != http.StatusCreated || !bytes.Equal(after.Body, createdBody) {
		t.Fatalf("retry after the race: %d %s, want the stored 201", after.Status, after.Body)
	}
}

func testChangedBody(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	WantStatus(t, "first", send(t, base, "alice", "k-422", paymentBody), http.StatusCreated)
	changed := send(t, base, "alice", "k-422", `{"amount":9999,"currency":"EUR","description":"coffee"}`)
	WantProblem(t, "same key, other body", changed, http.StatusUnprocessableEntity, idem.ProblemKeyReused)
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func testCanonicalJSON(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	first := send(t, base, "alice", "k-canon", paymentBody)
	WantStatus(t, "first", first, http.StatusCreated)
	same := "{\n  \"description\": \"coffee\",\n  \"currency\" : \"EUR\",\n  \"amount\": 1000.0\n}"
	again := send(t, base, "alice", "k-canon", same)
	if again.Status != http.StatusCreated || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("reordered, re-spaced JSON was not replayed: %d %s", again.Status, again.Body)
	}
}

func testBadKeys(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	WantProblem(t, "no key", send(t, base, "alice", "", paymentBody), http.StatusBadRequest, idem.ProblemKeyMissing)
	for _, key := range []string{strings.Repeat("k", 256), "has space", `"unterminated`, "tab\there", "ümlaut", `"a"b"`} {
		WantProblem(t, fmt.Sprintf("key %.20q", key), send(t, base, "alice", key, paymentBody), http.StatusBadRequest, idem.ProblemKeyInvalid)
	}
	if n := p.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times for requests without a valid key", n)
	}
	if _, err := s.b.Store.Get(context.Background(), "alice", "has space"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("an invalid key was stored: %v", err)
	}
}

// AmbiguousKey is one way a request can name its idempotency key
// ambiguously: Lines are the header's field lines (the metadata's values
// for gRPC), Keys every key some reading of them names. Every adapter
// refuses it as key-invalid and claims none of Keys.
type AmbiguousKey struct {
	Name  string
	Lines []string
	Keys  []string
}

// AmbiguousKeys are the forms the suites send: several field lines, a
// list, an Inner List, parameters, a bare key holding a comma.
var AmbiguousKeys = []AmbiguousKey{
	{"two field lines", []string{"k-line-1", "k-line-2"}, []string{"k-line-1", "k-line-2", "k-line-1, k-line-2"}},
	{"two quoted field lines", []string{`"k-quoted-1"`, `"k-quoted-2"`}, []string{"k-quoted-1", "k-quoted-2"}},
	{"an empty and a full field line", []string{"", "k-after-empty"}, []string{"k-after-empty"}},
	{"a list", []string{"k-list-1, k-list-2"}, []string{"k-list-1", "k-list-2", "k-list-1, k-list-2"}},
	{"a list of strings", []string{`"k-slist-1", "k-slist-2"`}, []string{"k-slist-1", "k-slist-2"}},
	{"an Inner List", []string{`("k-inner-1" "k-inner-2")`}, []string{"k-inner-1", "k-inner-2", `("k-inner-1" "k-inner-2")`}},
	{"a one-member Inner List", []string{"(k-inner)"}, []string{"k-inner", "(k-inner)"}},
	{"a string with a parameter", []string{`"k-param";x=1`}, []string{"k-param", `"k-param";x=1`}},
	{"a bare key with a parameter", []string{"k-bparam;x"}, []string{"k-bparam", "k-bparam;x"}},
	{"a bare list without space", []string{"k-bare-1,k-bare-2"}, []string{"k-bare-1", "k-bare-2", "k-bare-1,k-bare-2"}},
}

// testAmbiguousKeys: a key field that does not name one key (several field
// lines, a list, an Inner List, parameters) is refused with 400
// key-invalid, whichever line or member the adapter might have taken: the
// handler does not run and no reading of the field is claimed.
func testAmbiguousKeys(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	for _, tc := range AmbiguousKeys {
		t.Run(tc.Name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(paymentBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer alice")
			req.Header[idem.DefaultHeader] = tc.Lines
			runs := p.runs.Load()
			r, err := roundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			WantProblem(t, fmt.Sprintf("key field lines %q", tc.Lines), r, http.StatusBadRequest, idem.ProblemKeyInvalid)
			if p.runs.Load() != runs {
				t.Fatalf("key field lines %q: the handler ran", tc.Lines)
			}
			for _, key := range tc.Keys {
				if _, err := s.b.Store.Get(context.Background(), "alice", key); !errors.Is(err, idemstore.ErrNotFound) {
					t.Fatalf("key field lines %q: %q was claimed: %v", tc.Lines, key, err)
				}
			}
		})
	}
	// The same characters inside one sf-string are one key.
	WantStatus(t, "a quoted key holding , and ;", send(t, base, "alice", `"k-one,key;x=1"`, paymentBody), http.StatusCreated)
	if _, err := s.b.Store.Get(context.Background(), "alice", "k-one,key;x=1"); err != nil {
		t.Fatalf("the quoted key was not stored as k-one,key;x=1: %v", err)
	}
}

func testNoPrincipal(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	WantProblem(t, "anonymous", send(t, base, "", "k-anon", paymentBody), http.StatusUnauthorized, idem.ProblemUnauthenticated)
	s.wantUntouched(t, p, "", "k-anon")
	// Nothing was claimed: an authenticated request with the same key and
	// another body runs, instead of getting 422.
	WantStatus(t, "authenticated after anonymous", send(t, base, "alice", "k-anon", `{"amount":1}`), http.StatusCreated)
}

func testClientErrorStored(t *testing.T, s *suite) {
	var runs atomic.Int64
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		return Reply{Status: http.StatusBadRequest, Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body: fmt.Appendf(nil, `{"title":"amount must be positive","run":%d}`, runs.Load())}
	})
	first := send(t, base, "alice", "k-400", `{"amount":-1}`)
	WantStatus(t, "invalid payment", first, http.StatusBadRequest)
	again := send(t, base, "alice", "k-400", `{"amount":-1}`)
	WantStatus(t, "replayed 400", again, http.StatusBadRequest)
	if !bytes.Equal(again.Body, first.Body) || !again.Replayed() {
		t.Fatalf("400 not replayed: %s vs %s", again.Body, first.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want a stored 400", runs.Load())
	}
}

// flaky fails its first execution in the way fail says, after writing its
// business effect, then behaves like payments.
func (s *suite) flaky(fail func(ctx context.Context, r Request) Reply) (*payments, Handler) {
	p := &payments{b: s.b}
	var calls atomic.Int64
	return p, func(ctx context.Context, r Request) Reply {
		if calls.Add(1) == 1 {
			if err := s.b.WriteEffect(ctx, effectID(r)); err != nil {
				return Reply{Status: 599, Body: []byte(err.Error())}
			}
			return fail(ctx, r)
		}
		return p.handle(ctx, r)
	}
}

func (s *suite) wantReleasedThenRetried(t *testing.T, base string, p *payments, key string, first Response) {
	t.Helper()
	if first.Status < 400 {
		t.Fatalf("failed attempt answered %d", first.Status)
	}
	if n := effects(t, s.b, "alice", key); n != 0 {
		t.Fatalf("failed attempt left %d committed effects", n)
	}
	retry := send(t, base, "alice", key, paymentBody)
	WantStatus(t, "retry after a transient failure", retry, http.StatusCreated)
	if retry.Header.Get(idem.ReplayedHeader) != "" {
		t.Fatal("the retry was a replay, not a fresh execution")
	}
	if p.runs.Load() != 1 {
		t.Fatalf("retry did not run the handler (runs %d)", p.runs.Load())
	}
	if n := effects(t, s.b, "alice", key); n != 1 {
		t.Fatalf("%d committed effects after the retry, want 1", n)
	}
}

func testServerErrorReleased(t *testing.T, s *suite) {
	p, h := s.flaky(func(context.Context, Request) Reply {
		return Reply{Status: http.StatusServiceUnavailable, Body: []byte("provider down")}
	})
	base := s.serve(t, s.config(), h)
	first := send(t, base, "alice", "k-503", paymentBody)
	WantStatus(t, "503", first, http.StatusServiceUnavailable)
	s.wantReleasedThenRetried(t, base, p, "k-503", first)
}

// testHandlerErrorReleased: the error a handler returns is rendered by the
// framework into the response the client gets, with its status, and the
// outcome is released.
func testHandlerErrorReleased(t *testing.T, s *suite) {
	p, h := s.flaky(func(context.Context, Request) Reply {
		return Reply{Status: http.StatusServiceUnavailable, Err: errors.New("provider down")}
	})
	base := s.serve(t, s.config(), h)
	first := send(t, base, "alice", "k-err", paymentBody)
	WantStatus(t, "handler error", first, http.StatusServiceUnavailable)
	if ct := first.Header.Get("Content-Type"); ct == idem.ProblemContentType {
		t.Fatalf("the framework's rendering of the error was replaced by a problem: %s", first.Body)
	}
	s.wantReleasedThenRetried(t, base, p, "k-err", first)
}

// testHandlerErrorClassified: a handler error is classified with the
// response the framework rendered for it, inside the middleware: with
// StatusClassifier a 4xx error is stored and replayed like a written 4xx.
func testHandlerErrorClassified(t *testing.T, s *suite) {
	cfg := s.config()
	cfg.Classify = idem.StatusClassifier
	var runs atomic.Int64
	base := s.serve(t, cfg, func(context.Context, Request) Reply {
		runs.Add(1)
		return Reply{Status: http.StatusConflict, Err: errors.New("duplicate payment")}
	})
	first := send(t, base, "alice", "k-err-4xx", paymentBody)
	WantStatus(t, "4xx handler error", first, http.StatusConflict)
	again := send(t, base, "alice", "k-err-4xx", paymentBody)
	WantStatus(t, "its replay", again, http.StatusConflict)
	if !again.Replayed() || !bytes.Equal(again.Body, first.Body) || runs.Load() != 1 {
		t.Fatalf("a 4xx handler error was not stored: replayed %v, body %q then %q, %d runs", again.Replayed(), first.Body, again.Body, runs.Load())
	}
}

// testPanicReleased: a panic releases the key and reaches the framework's
// recovery, whose 500 is what the client gets, with nothing the handler
// wrote before it panicked (the framework traps: a buffer left installed
// swallows the recovery's response, a response left committed stops it).
func testPanicReleased(t *testing.T, s *suite) {
	for i, tc := range []struct {
		name  string
		reply Reply
	}{
		{"before writing", Reply{Panic: "boom"}},
		{"after writing", Reply{Status: http.StatusCreated, Panic: "boom", Body: []byte("half a payment"),
			Header: http.Header{"Location": {"/payments/half"}, "Set-Cookie": {"session=half"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, h := s.flaky(func(context.Context, Request) Reply { return tc.reply })
			base := s.serve(t, s.config(), h)
			key := fmt.Sprintf("k-panic-%d", i)
			first := send(t, base, "alice", key, paymentBody)
			WantStatus(t, "panicking handler", first, http.StatusInternalServerError)
			if bytes.Contains(first.Body, []byte("half")) || first.Header.Get("Location") != "" || first.Header.Get("Set-Cookie") != "" {
				t.Fatalf("the handler's partial response reached the client: %v %q", first.Header, first.Body)
			}
			s.wantReleasedThenRetried(t, base, p, key, first)
		})
	}
}

func testNothingBeforeCommit(t *testing.T, s *suite) {
	flushed, release := make(chan struct{}), make(chan struct{})
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		r.WriteEarly([]byte("partial"))
		close(flushed)
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		// Status 200: the early write already implied it on net/http.
		return Reply{Status: http.StatusOK, Body: []byte("partial and the rest")}
	})
	var firstByte atomic.Bool
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { firstByte.Store(true) }}
	done := make(chan Response, 1)
	go func() {
		r, err := sendErr(httptrace.WithClientTrace(context.Background(), trace), base, "alice", "k-flush", paymentBody)
		if err != nil {
			t.Errorf("request: %v", err)
		}
		done <- r
	}()
	select {
	case <-flushed:
	case <-time.After(5 * time.Second):
		t.Fatal("handler never ran")
	}
	time.Sleep(200 * time.Millisecond)
	if firstByte.Load() {
		close(release)
		t.Fatal("the client received bytes the handler flushed before the outcome was committed")
	}
	close(release)
	r := <-done
	WantStatus(t, "after release", r, http.StatusOK)
	if string(r.Body) != "partial and the rest" && string(r.Body) != "partialpartial and the rest" {
		t.Fatalf("body %q", r.Body)
	}
}

func testFailedCommit(t *testing.T, s *suite) {
	var runs atomic.Int64
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		r.WriteEarly([]byte("secret-early"))
		if err := s.b.WriteEffect(ctx, effectID(r)); err != nil {
			return Reply{Status: 599}
		}
		if err := s.b.PoisonTx(ctx); err != nil {
			return Reply{Status: 599}
		}
		return Reply{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"secret":"handler body"}`)}
	})
	r := send(t, base, "alice", "k-commit", paymentBody)
	WantProblem(t, "failed commit", r, http.StatusInternalServerError, idem.ProblemCommitFailed)
	if bytes.Contains(r.Body, []byte("secret")) {
		t.Fatalf("the handler's body reached the client although its commit failed: %s", r.Body)
	}
	if n := effects(t, s.b, "alice", "k-commit"); n != 0 {
		t.Fatalf("%d effects committed", n)
	}
	// The key was released: the retry runs the handler again.
	_ = send(t, base, "alice", "k-commit", paymentBody)
	if runs.Load() != 2 {
		t.Fatalf("retry after a failed commit ran the handler %d times in all, want 2", runs.Load())
	}
}

func testTransactionAndDeadline(t *testing.T, s *suite) {
	cfg := s.config()
	var problem atomic.Value
	base := s.serve(t, cfg, func(ctx context.Context, r Request) Reply {
		deadline, ok := ctx.Deadline()
		switch {
		case !ok:
			problem.Store("handler context has no deadline")
		case time.Until(deadline) > cfg.RequestTimeout:
			problem.Store(fmt.Sprintf("deadline %v away, RequestTimeout is %v", time.Until(deadline), cfg.RequestTimeout))
		}
		if _, ok := idemadapter.LeaseFrom(ctx); !ok {
			problem.Store("handler context carries no lease")
		}
		if err := s.b.WriteEffect(ctx, effectID(r)); err != nil {
			problem.Store("handler context carries no transaction: " + err.Error())
		}
		return Reply{Status: http.StatusCreated, Body: []byte("ok")}
	})
	WantStatus(t, "request", send(t, base, "alice", "k-ctx", paymentBody), http.StatusCreated)
	if p := problem.Load(); p != nil {
		t.Fatal(p)
	}
	if n := effects(t, s.b, "alice", "k-ctx"); n != 1 {
		t.Fatalf("the write made through the handler's context did not commit with the record (%d)", n)
	}
}

func testDeadlineReleases(t *testing.T, s *suite) {
	cfg := s.config()
	cfg.RequestTimeout, cfg.StoreTimeout, cfg.Lease = 300*time.Millisecond, time.Second, 2*time.Second
	p, h := s.flaky(func(ctx context.Context, r Request) Reply {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		return Reply{Status: http.StatusCreated, Body: []byte("too late")}
	})
	base := s.serve(t, cfg, h)
	start := time.Now()
	first := send(t, base, "alice", "k-slow", paymentBody)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("request took %v with a 300ms deadline", took)
	}
	if first.Status < 500 || bytes.Contains(first.Body, []byte("too late")) {
		t.Fatalf("a handler past its deadline answered %d %s", first.Status, first.Body)
	}
	s.wantReleasedThenRetried(t, base, p, "k-slow", first)
}

func testPrincipalsIsolated(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	alice := send(t, base, "alice", "k-shared", paymentBody)
	bob := send(t, base, "bob", "k-shared", `{"amount":5,"currency":"USD"}`)
	WantStatus(t, "alice", alice, http.StatusCreated)
	WantStatus(t, "bob with alice's key", bob, http.StatusCreated)
	if bob.Header.Get(idem.ReplayedHeader) != "" || bytes.Equal(alice.Body, bob.Body) {
		t.Fatal("bob received alice's stored response")
	}
	if again := send(t, base, "alice", "k-shared", paymentBody); !bytes.Equal(again.Body, alice.Body) {
		t.Fatal("alice's replay changed after bob used the key")
	}
	if p.runs.Load() != 2 {
		t.Fatalf("runs = %d, want one per principal", p.runs.Load())
	}
}

func testBodyRestored(t *testing.T, s *suite) {
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		sum := sha256.Sum256(r.Body)
		return Reply{Status: http.StatusCreated, Body: []byte(hex.EncodeToString(sum[:]))}
	})
	body := `{"amount":1000,"currency":"EUR","description":"` + strings.Repeat("x", 100_000) + `"}`
	r := send(t, base, "alice", "k-body", body)
	sum := sha256.Sum256([]byte(body))
	if string(r.Body) != hex.EncodeToString(sum[:]) {
		t.Fatalf("handler saw another body than the client sent (status %d)", r.Status)
	}
}

func testBodyTooLarge(t *testing.T, s *suite) {
	cfg := s.config()
	cfg.MaxBodyBytes = 64
	p := &payments{b: s.b}
	base := s.serve(t, cfg, p.handle)
	r := send(t, base, "alice", "k-big", `{"description":"`+strings.Repeat("x", 200)+`"}`)
	WantProblem(t, "oversized body", r, http.StatusRequestEntityTooLarge, idem.ProblemBodyTooLarge)
	if p.runs.Load() != 0 {
		t.Fatal("handler ran for an oversized body")
	}
	if _, err := s.b.Store.Get(context.Background(), "alice", "k-big"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("an oversized request claimed its key: %v", err)
	}
}

func testOptionalKey(t *testing.T, s *suite) {
	cfg := s.config()
	cfg.KeyOptional = true
	var runs atomic.Int64
	base := s.serve(t, cfg, func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		return Reply{Status: http.StatusCreated, Body: r.Body}
	})
	for range 2 {
		r := send(t, base, "alice", "", paymentBody)
		if r.Status != http.StatusCreated || string(r.Body) != paymentBody {
			t.Fatalf("request without a key on an optional route: %d %s", r.Status, r.Body)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times for two keyless requests", runs.Load())
	}
	// A key header sent empty or blank is not a missing key: it is
	// refused, never run without idempotency.
	for _, blank := range []string{"", "   "} {
		r := send(t, base, "alice", "", paymentBody, idem.DefaultHeader, blank)
		WantProblem(t, fmt.Sprintf("key header %q on an optional route", blank), r, http.StatusBadRequest, idem.ProblemKeyInvalid)
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran for a request whose key header was empty or blank (%d runs)", runs.Load())
	}
}

func testReplayReauthorized(t *testing.T, s *suite) {
	cfg := s.config()
	var revoked atomic.Bool
	cfg.AuthorizeReplay = func(ctx context.Context, principal string, rec idem.Record) error {
		if revoked.Load() {
			return errors.New("account closed")
		}
		return nil
	}
	p := &payments{b: s.b}
	base := s.serve(t, cfg, p.handle)
	first := send(t, base, "alice", "k-authz", paymentBody)
	WantStatus(t, "first", first, http.StatusCreated)
	WantStatus(t, "authorised replay", send(t, base, "alice", "k-authz", paymentBody), http.StatusCreated)
	revoked.Store(true)
	denied := send(t, base, "alice", "k-authz", paymentBody)
	WantProblem(t, "replay after authorisation was withdrawn", denied, http.StatusForbidden, idem.ProblemForbidden)
	if bytes.Contains(denied.Body, []byte("pay_")) || bytes.Contains(denied.Body, []byte("account closed")) {
		t.Fatalf("403 leaks the stored response or the hook's error: %s", denied.Body)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", p.runs.Load())
	}
}

func testStoredRecord(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.serve(t, s.config(), p.handle)
	secret := `{"amount":1000,"currency":"EUR","description":"card 4242 4242 4242 4242"}`
	WantStatus(t, "first", send(t, base, "alice", "k-record", secret, "X-Request-Id", "req-original-1"), http.StatusCreated)
	rec, err := s.b.Store.Get(context.Background(), "alice", "k-record")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idemstore.StateCompleted || rec.Response == nil {
		t.Fatalf("record = %+v", rec)
	}
	if len(rec.Fingerprint) != idemstore.FingerprintSize || rec.Fingerprint[0] != idemadapter.FingerprintVersion {
		t.Fatalf("stored fingerprint is %x, want the version byte and an HMAC-SHA-256", rec.Fingerprint)
	}
	for name := range rec.Response.Header {
		switch name {
		case "Content-Type", "Location", "Content-Language", "Cache-Control":
		default:
			t.Fatalf("stored header %s is not on the allow-list", name)
		}
	}
	// Look for the card's text, not for "4242" alone: the lease token (hex),
	// the timestamps and the handler's nanosecond field hold random digits,
	// and a few records in a thousand have "4242" among them.
	const card = "card 4242"
	if bytes.Contains(rec.Response.Body, []byte(card)) || strings.Contains(fmt.Sprintf("%+v %+v", rec, *rec.Response), card) {
		t.Fatal("the request body was stored")
	}
	if rec.RequestID != "req-original-1" {
		t.Fatalf("stored request id %q, want the original request's", rec.RequestID)
	}
}

func testProblemsLeakNothing(t *testing.T, s *suite) {
	cfg := s.config()
	cfg.MaxBodyBytes = 256
	var calls atomic.Int64
	// bob's first request holds its key in the handler until released, so
	// his second is a 409 however slow the machine is.
	bobRuns, bobRelease := make(chan struct{}), make(chan struct{})
	base := s.serve(t, cfg, func(ctx context.Context, r Request) Reply {
		switch calls.Add(1) {
		case 1:
			_ = s.b.PoisonTx(ctx) // the commit fails with the store's own error text
		case 2:
			close(bobRuns)
			select {
			case <-bobRelease:
			case <-ctx.Done():
			}
		}
		return Reply{Status: http.StatusCreated, Body: []byte(`{"id":"pay_secret"}`)}
	})
	var problems []Response
	problems = append(problems,
		send(t, base, "alice", "k-leak", paymentBody), // commit failed
		send(t, base, "", "k-leak", paymentBody),      // 401
		send(t, base, "alice", "", paymentBody),       // 400 missing
		send(t, base, "alice", "bad key", paymentBody),
		send(t, base, "alice", "k-big", `{"d":"`+strings.Repeat("x", 300)+`"}`),
	)
	done := make(chan Response, 1)
	go func() { r, _ := sendErr(context.Background(), base, "bob", "k-leak", paymentBody); done <- r }()
	select {
	case <-bobRuns:
	case <-time.After(10 * time.Second):
		t.Fatal("bob's first request never reached the handler")
	}
	problems = append(problems, send(t, base, "bob", "k-leak", paymentBody)) // 409 while bob's runs
	close(bobRelease)
	<-done
	problems = append(problems, send(t, base, "bob", "k-leak", `{"amount":2}`)) // 422
	for _, p := range problems {
		if p.Header.Get("Content-Type") != idem.ProblemContentType {
			t.Fatalf("status %d is not a problem: %s", p.Status, p.Body)
		}
		var doc map[string]any
		if err := json.Unmarshal(p.Body, &doc); err != nil {
			t.Fatalf("problem body is not JSON: %s", p.Body)
		}
		for _, field := range []string{"type", "title", "status"} {
			if doc[field] == nil {
				t.Fatalf("problem lacks %q: %s", field, p.Body)
			}
		}
		lower := strings.ToLower(string(p.Body))
		for _, leak := range []string{"select ", "insert ", "update ", "sqlstate", "goroutine", ".go:", "panic", "poison", "pay_secret", "alice", "bob", "k-leak", "memstore", "pgx", "gorm"} {
			if strings.Contains(lower, leak) {
				t.Fatalf("problem (status %d) contains %q: %s", p.Status, leak, p.Body)
			}
		}
	}
}

// testHostileBodies sends bodies a canonicaliser could get wrong. Each is
// handled (no panic), replayed when sent again byte for byte, and never
// mistaken for its sibling, which differs in a way a lossy canonical form
// would erase.
func testHostileBodies(t *testing.T, s *suite) {
	var runs atomic.Int64
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		sum := sha256.Sum256(r.Body)
		return Reply{Status: http.StatusCreated, Body: []byte(hex.EncodeToString(sum[:]))}
	})
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	pairs := []struct{ name, a, b string }{
		{"invalid UTF-8", "{\"d\":\"\xff\"}", "{\"d\":\"\xfe\"}"},
		{"duplicate members", `{"a":1,"a":2}`, `{"a":2,"a":1}`},
		{"beyond float64 precision", `{"amount":9007199254740993}`, `{"amount":9007199254740992}`},
		{"out of range numbers", `{"amount":1e400}`, `{"amount":2e400}`},
		{"lone surrogates", `{"d":"\ud800"}`, `{"d":"\ud801"}`},
		{"deep nesting", deep(5000), deep(4999)},
		{"content type that lies", "amount=1&currency=EUR", "amount=1&currency=EUR&x="},
	}
	for i, p := range pairs {
		key := fmt.Sprintf("k-hostile-%d", i)
		first := send(t, base, "alice", key, p.a)
		WantStatus(t, p.name, first, http.StatusCreated)
		again := send(t, base, "alice", key, p.a)
		if !again.Replayed() || !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("%s: the same bytes were not replayed: %d %s", p.name, again.Status, again.Body)
		}
		WantProblem(t, p.name+" sibling", send(t, base, "alice", key, p.b), http.StatusUnprocessableEntity, idem.ProblemKeyReused)
	}
	if n := runs.Load(); n != int64(len(pairs)) {
		t.Fatalf("handler ran %d times for %d distinct requests", n, len(pairs))
	}
}

// testSlowAndBrokenBodies: a body that arrives slowly is read whole before
// the claim; a body the client abandons half way claims nothing.
func testSlowAndBrokenBodies(t *testing.T, s *suite) {
	var runs atomic.Int64
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		return Reply{Status: http.StatusCreated, Body: r.Body}
	})
	post := func(key string, body io.Reader) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, base+"/payments", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set(idem.DefaultHeader, key)
		return client.Do(req)
	}
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`{"amount":1000,`))
		time.Sleep(300 * time.Millisecond)
		_, _ = pw.Write([]byte(`"currency":"EUR"}`))
		_ = pw.Close()
	}()
	resp, err := post("k-slow-body", pr)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(got) != `{"amount":1000,"currency":"EUR"}` {
		t.Fatalf("slow body: %d %s", resp.StatusCode, got)
	}

	pr, pw = io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`{"amount":1000,`))
		time.Sleep(100 * time.Millisecond)
		_ = pw.CloseWithError(errors.New("client gave up"))
	}()
	if resp, err := post("k-broken-body", pr); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("a body abandoned half way answered %d", resp.StatusCode)
		}
	}
	time.Sleep(200 * time.Millisecond) // let the server finish with the broken request
	if _, err := s.b.Store.Get(context.Background(), "alice", "k-broken-body"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("an abandoned body claimed its key: %v", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want once (the slow body only)", runs.Load())
	}
}
