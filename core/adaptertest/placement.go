package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
)

// The tests of where and how the middleware is mounted: its constructor,
// its place among the framework's middleware, and what it keeps of the
// response and the transaction around it.

// testNewRequiresEngineAndPrincipal: the adapter's New refuses a Config
// without an engine or without a principal function, naming the field,
// and the harness passes on idem.New's refusal of an invalid engine
// configuration.
func testNewRequiresEngineAndPrincipal(t *testing.T, s *suite) {
	for _, tc := range []struct {
		name  string
		setup Setup
		want  string // in New's error, which wraps ErrInvalidConfig; "" when it succeeds
	}{
		{"valid", Setup{Config: s.config()}, ""},
		{"no engine", Setup{Config: s.config(), NoEngine: true}, "Engine is required"},
		{"no principal function", Setup{Config: s.config(), NoPrincipal: true}, "Principal is required"},
		{"no engine, no principal function", Setup{Config: s.config(), NoEngine: true, NoPrincipal: true}, "Engine is required"},
		{"invalid engine config", Setup{Config: idem.Config{FingerprintKey: storetest.FingerprintKey}}, "Store is required"},
	} {
		tc.setup.Handler = (&payments{b: s.b}).handle
		_, err := s.h.Serve(t, tc.setup)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: New = %v, want success", tc.name, err)
		case tc.want != "" && (!errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: New = %v, want ErrInvalidConfig naming %q", tc.name, err, tc.want)
		}
	}
}

// step is one request of a placement test and what it must get.
type step struct {
	method, path, principal, key string
	status                       int
	replayed                     bool
}

func (st step) run(t *testing.T, base string) Response {
	t.Helper()
	r := Send(t, st.method, base+st.path, st.principal, st.key, paymentBody)
	WantStatus(t, fmt.Sprintf("%s %s key %q", st.method, st.path, st.key), r, st.status)
	if r.Replayed() != st.replayed {
		t.Fatalf("%s %s key %q: replayed %v, want %v", st.method, st.path, st.key, r.Replayed(), st.replayed)
	}
	return r
}

// testGroupAndGlobal: on a route group the middleware guards the group's
// routes only; on the whole router, every route. A replay ends the chain:
// the handler does not run again.
func testGroupAndGlobal(t *testing.T, s *suite) {
	for _, tc := range []struct {
		name      string
		placement Placement
		steps     []step
		runs      int64 // handler executions in all
	}{
		{"group", OnGroup, []step{
			{http.MethodGet, "/outside", "", "", http.StatusOK, false}, // neither auth nor idempotency
			{http.MethodPost, "/payments", "alice", "k-group", http.StatusCreated, false},
			{http.MethodPost, "/payments", "alice", "k-group", http.StatusCreated, true},
			{http.MethodPost, "/payments", "alice", "", http.StatusBadRequest, false},
		}, 2},
		{"global", Global, []step{
			{http.MethodGet, "/outside", "alice", "", http.StatusBadRequest, false},
			{http.MethodPost, "/outside", "alice", "k-global", http.StatusOK, false},
			{http.MethodPost, "/outside", "alice", "k-global", http.StatusOK, true},
			{http.MethodPost, "/payments", "", "k-global-anon", http.StatusUnauthorized, false},
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			base := s.start(t, Setup{Config: s.config(), Placement: tc.placement, Handler: func(ctx context.Context, r Request) Reply {
				runs.Add(1)
				return Reply{Status: map[bool]int{true: http.StatusOK, false: http.StatusCreated}[r.Path == "/outside"],
					Body: fmt.Appendf(nil, "run %d", runs.Load())}
			}})
			var first Response
			for _, st := range tc.steps {
				r := st.run(t, base)
				switch {
				case !st.replayed:
					first = r
				case !bytes.Equal(r.Body, first.Body):
					t.Fatalf("replay %q, want %q", r.Body, first.Body)
				}
			}
			if n := runs.Load(); n != tc.runs {
				t.Fatalf("handler ran %d times, want %d", n, tc.runs)
			}
		})
	}
}

// testBeforeAuth: mounted before authentication, the middleware finds no
// principal and fails closed: 401, nothing claimed, the handler not run.
func testBeforeAuth(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.start(t, Setup{Config: s.config(), Placement: BeforeAuth, Handler: p.handle})
	r := send(t, base, "alice", "k-before-auth", paymentBody)
	WantProblem(t, "middleware before auth", r, http.StatusUnauthorized, idem.ProblemUnauthenticated)
	s.wantUntouched(t, p, "alice", "k-before-auth")
}

// testPrincipalError: a principal function that fails answers 401 even
// with a principal beside its error, claims nothing, and its error reaches
// the Event.
func testPrincipalError(t *testing.T, s *suite) {
	errExpired := errors.New("token expired")
	var (
		mu     sync.Mutex
		events []idem.Event
	)
	cfg := s.config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observer = idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})
	p := &payments{b: s.b}
	base := s.start(t, Setup{Config: cfg, Handler: p.handle, PrincipalErr: errExpired})
	r := send(t, base, "alice", "k-principal-err", paymentBody)
	WantProblem(t, "principal error", r, http.StatusUnauthorized, idem.ProblemUnauthenticated)
	s.wantUntouched(t, p, "alice", "k-principal-err")
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Outcome != idem.OutcomeUnauthenticated || !errors.Is(events[0].Err, errExpired) {
		t.Fatalf("events %+v, want one unauthenticated carrying the principal function's error", events)
	}
}

// testEarlierHeaders: headers set before the middleware (CORS, request
// ids) are on every response: the first, a replay, the engine's problems,
// and a problem that replaces the handler's response, which carries none
// of the handler's headers.
func testEarlierHeaders(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	base := s.start(t, Setup{Config: s.config(), Header: http.Header{"Access-Control-Allow-Origin": {"*"}},
		Handler: func(ctx context.Context, r Request) Reply {
			if r.Path != "/payments/poisoned" {
				return p.handle(ctx, r)
			}
			_ = s.b.PoisonTx(ctx)
			return Reply{Status: http.StatusCreated, Header: http.Header{"X-Handler": {"1"}}, Body: []byte("secret")}
		}})
	for _, st := range []step{
		{http.MethodPost, "/payments", "alice", "k-cors", http.StatusCreated, false},
		{http.MethodPost, "/payments", "alice", "k-cors", http.StatusCreated, true},
		{http.MethodPost, "/payments", "alice", "", http.StatusBadRequest, false},
		{http.MethodPost, "/payments/poisoned", "alice", "k-cors-poisoned", http.StatusInternalServerError, false},
	} {
		r := st.run(t, base)
		if r.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Fatalf("%s key %q: status %d lost the earlier header: %v", st.path, st.key, r.Status, r.Header)
		}
		if st.path == "/payments/poisoned" && (r.ProblemType() != string(idem.ProblemCommitFailed) ||
			r.Header.Get("X-Handler") != "" || strings.Contains(string(r.Body), "secret")) {
			t.Fatalf("failed commit: %d %v %q", r.Status, r.Header, r.Body)
		}
	}
}

// testTransactionCommits: the write the handler makes through its context
// commits with the record when the outcome is stored (2xx, 4xx), and not
// when it is released (5xx).
func testTransactionCommits(t *testing.T, s *suite) {
	base := s.serve(t, s.config(), func(ctx context.Context, r Request) Reply {
		if err := s.b.WriteEffect(ctx, effectID(r)); err != nil {
			return Reply{Status: 599, Body: []byte("no transaction in the handler's context: " + err.Error())}
		}
		var status int
		_, _ = fmt.Sscanf(r.Path, "/payments/%d", &status)
		return Reply{Status: status, Body: []byte(r.Path)}
	})
	for _, tc := range []struct {
		status  int
		effects int
		state   idemstore.State
	}{
		{http.StatusCreated, 1, idemstore.StateCompleted},
		{http.StatusUnprocessableEntity, 1, idemstore.StateFailed},
		{http.StatusBadGateway, 0, idemstore.StateReleased}, // nothing stored, the nonce kept

	} {
		key := fmt.Sprintf("k-tx-%d", tc.status)
		r := Send(t, http.MethodPost, fmt.Sprintf("%s/payments/%d", base, tc.status), "alice", key, paymentBody)
		WantStatus(t, key, r, tc.status)
		if n := effects(t, s.b, "alice", key); n != tc.effects {
			t.Fatalf("%d: %d committed effects, want %d", tc.status, n, tc.effects)
		}
		if rec, err := s.b.Store.Get(context.Background(), "alice", key); err != nil || rec.State != tc.state {
			t.Fatalf("%d: record %+v, %v; want %s", tc.status, rec, err, tc.state)
		}
	}
}
