package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// faultyStore is a memstore whose Claim and Settle can be made to fail
// with a chosen error, and which records how the engine treats the key
// afterwards.
type faultyStore struct {
	*memstore.Store
	claimErr error
	// claimAnswerLost: the claim commits, then its caller sees an error.
	claimAnswerLost bool
	settleErr       error
	// rollbackEnded: Rollback reports the transaction ended behind the
	// store, as a store does after a raw COMMIT.
	rollbackEnded bool
	settleDur     time.Duration // Settle waits this long (bounded by its ctx) before failing

	mu          sync.Mutex
	releaseErrs []error // ctx.Err() at each Release
}

func (s *faultyStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if s.claimAnswerLost {
		_, _ = s.Store.Claim(ctx, req)
		return idemstore.ClaimResult{}, context.Canceled
	}
	if s.claimErr != nil {
		return idemstore.ClaimResult{}, s.claimErr
	}
	return s.Store.Claim(ctx, req)
}

func (s *faultyStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, l)
	return ctx, faultyTx{Tx: tx, s: s}, err
}

func (s *faultyStore) Release(ctx context.Context, l idemstore.Lease) error {
	s.mu.Lock()
	s.releaseErrs = append(s.releaseErrs, ctx.Err())
	s.mu.Unlock()
	return s.Store.Release(ctx, l)
}

type faultyTx struct {
	idemstore.Tx
	s *faultyStore
}

func (t faultyTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	if t.s.rollbackEnded {
		return fmt.Errorf("idemtest: rollback: %w", idemstore.ErrTxEnded)
	}
	return err
}

func (t faultyTx) Settle(ctx context.Context, out idemstore.Outcome) error {
	if t.s.settleErr == nil {
		return t.Tx.Settle(ctx, out)
	}
	if t.s.settleDur > 0 {
		select {
		case <-time.After(t.s.settleDur):
		case <-ctx.Done():
		}
	}
	_ = t.Tx.Rollback(ctx)
	return t.s.settleErr
}

func TestSettleErrorsDecideTheKeysFate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		err         error
		wantStatus  int
		wantType    idem.ProblemType
		wantOutcome idem.OutcomeLabel
		wantState   idemstore.State // "" means released
	}{
		{"transaction ended behind the store", fmt.Errorf("idemtest: settle: %w", idemstore.ErrTxEnded),
			500, idem.ProblemTxEnded, idem.OutcomeTxEnded, idemstore.StateInProgress},
		{"misconfigured store", fmt.Errorf("idemtest: settle: %w: no table", idem.ErrMisconfigured),
			500, idem.ProblemMisconfigured, idem.OutcomeStoreError, ""},
		{"commit failed", errors.New("idemtest: settle: connection reset"),
			500, idem.ProblemCommitFailed, idem.OutcomeStoreError, ""},
		{"lease lost", idemstore.ErrLeaseLost, 409, idem.ProblemLeaseLost, idem.OutcomeLeaseLost, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: memstore.MustNew(), settleErr: tc.err}
			var ev idem.Event
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.DiscardHandler),
				Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) { ev = e })})
			if err != nil {
				t.Fatal(err)
			}
			att, _ := e.Begin(context.Background(), request("alice", "k"))
			resp := att.Finish(idem.Result{Status: 201, Body: []byte(`{}`)})
			if resp.Status != tc.wantStatus || !bytes.Contains(resp.Body, []byte(tc.wantType)) {
				t.Fatalf("answered %d %s, want %d %s", resp.Status, resp.Body, tc.wantStatus, tc.wantType)
			}
			if ev.Outcome != tc.wantOutcome {
				t.Fatalf("outcome %q, want %q", ev.Outcome, tc.wantOutcome)
			}
			rec, err := store.Get(context.Background(), "alice", "k")
			switch {
			case tc.wantState == "" && tc.err != idemstore.ErrLeaseLost && (err != nil || rec.State != idemstore.StateReleased):
				t.Fatalf("key not released: %+v, %v", rec, err)
			case tc.wantState != "" && (err != nil || rec.State != tc.wantState):
				t.Fatalf("record %+v, %v; want it kept %s", rec, err, tc.wantState)
			}
			if tc.wantType == idem.ProblemTxEnded {
				// Kept, Uncertain, its lease ended: without Reconcile no
				// retry runs the handler again, so no Retry-After invites
				// one; the retry is answered outcome-unknown.
				if ra := resp.Header.Get("Retry-After"); ra != "" {
					t.Fatalf("a tx-ended answer without Reconcile carries Retry-After %q", ra)
				}
				if !rec.Uncertain || rec.LeaseExpiresAt.After(time.Now()) {
					t.Fatalf("record %+v: want it Uncertain with its lease ended", rec)
				}
				retry, again := e.Begin(context.Background(), request("alice", "k"))
				if retry != nil {
					retry.Abort()
					t.Fatal("a retry ran the handler of a record whose outcome is unknown")
				}
				if again.Status != http.StatusConflict || !bytes.Contains(again.Body, []byte(idem.ProblemOutcomeUnknown)) {
					t.Fatalf("retry answered %d %s, want 409 %s", again.Status, again.Body, idem.ProblemOutcomeUnknown)
				}
			}
		})
	}
}

// A settle that used up the store timeout must not leave the release with
// an expired context: the key would stay blocked for the whole lease.
func TestReleaseAfterTimedOutSettleGetsItsOwnTime(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: memstore.MustNew(), settleErr: errors.New("idemtest: settle timed out"), settleDur: time.Hour}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, StoreTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "k"))
	att.Finish(idem.Result{Status: 201, Body: []byte(`{}`)})
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.releaseErrs) != 1 || store.releaseErrs[0] != nil {
		t.Fatalf("Release contexts' errors at call time = %v, want one live context", store.releaseErrs)
	}
	if rec, free := storetest.Free(t, store, "alice", "k"); !free {
		t.Fatalf("key not released after the failed settle: %+v", rec)
	}
}

func TestMisconfiguredClaimIsNotRetryable(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: memstore.MustNew(), claimErr: fmt.Errorf("idemtest: claim: %w: relation does not exist", idem.ErrMisconfigured)}
	var logged bytes.Buffer
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, resp := e.Begin(context.Background(), request("alice", "k"))
	if resp.Status != 500 || !bytes.Contains(resp.Body, []byte(idem.ProblemMisconfigured)) || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("answered %d %v %s, want 500 %s without Retry-After", resp.Status, resp.Header, resp.Body, idem.ProblemMisconfigured)
	}
	if !strings.Contains(logged.String(), "relation does not exist") || !strings.Contains(logged.String(), "level=ERROR") {
		t.Fatalf("log = %q, want the store's error at ERROR", logged.String())
	}
}

// Without a Logger, what an operator must see still reaches slog.Default;
// the normal outcomes do not.
func TestStoreErrorsReachTheDefaultLogger(t *testing.T) {
	var logged bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	ok, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := ok.Begin(context.Background(), request("alice", "fine"))
	tx, _ := memstore.Tx(att.Context())
	tx.OnCommit(func() {})
	att.Finish(idem.Result{Status: 201})
	if logged.Len() != 0 {
		t.Fatalf("a normal request logged %q without a Logger", logged.String())
	}
	broken, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: &faultyStore{Store: memstore.MustNew(),
		claimErr: fmt.Errorf("idemtest: claim: %w: permission denied", idem.ErrMisconfigured)}})
	if err != nil {
		t.Fatal(err)
	}
	broken.Begin(context.Background(), request("alice", "k"))
	if !strings.Contains(logged.String(), "permission denied") {
		t.Fatalf("default log = %q, want the store error", logged.String())
	}
}

func TestWarnTxUnused(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		var logged bytes.Buffer
		e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), AllowTxUnused: allow,
			Logger: slog.New(slog.NewTextHandler(&logged, nil))})
		if err != nil {
			t.Fatal(err)
		}
		for _, used := range []bool{true, false} {
			logged.Reset()
			att, _ := e.Begin(context.Background(), request("alice", fmt.Sprint("k", used)))
			if used {
				tx, _ := memstore.Tx(att.Context())
				tx.OnCommit(func() {})
			}
			att.Finish(idem.Result{Status: 201})
			// Loud by default: a 2xx that never touched the transaction
			// warns unless AllowTxUnused says it is meant.
			if warned, want := strings.Contains(logged.String(), "level=WARN"), !used && !allow; warned != want {
				t.Fatalf("AllowTxUnused %v, handler used the transaction %v: warned %v, want %v; log %q", allow, used, warned, want, logged.String())
			}
		}
	}
}

// TestFirstAnonymousRequestIsLogged: a request without a principal is the
// client's business, but the first one may be a middleware placed before
// authentication: it is logged once, at Warn, even without a Logger.
func TestFirstAnonymousRequestIsLogged(t *testing.T) {
	t.Parallel()
	var logged bytes.Buffer
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, resp := e.Begin(context.Background(), request("", "k")); resp.Status != http.StatusUnauthorized {
			t.Fatalf("anonymous: %d, want 401", resp.Status)
		}
	}
	if n := strings.Count(logged.String(), "place it after"); n != 1 {
		t.Fatalf("the hint was logged %d times, want once; log %q", n, logged.String())
	}
	if !strings.Contains(logged.String(), "level=WARN") {
		t.Fatalf("the hint is not a warning: %q", logged.String())
	}
}

// ownedStore is a memstore whose Settle reports that the handler called
// Rollback on the handle, as the SQL stores do.
type ownedStore struct{ *memstore.Store }

func (s ownedStore) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	ctx, tx, err := s.Store.BeginTx(ctx, l)
	return ctx, ownedTx{tx}, err
}

type ownedTx struct{ idemstore.Tx }

func (t ownedTx) Settle(ctx context.Context, _ idemstore.Outcome) error {
	_ = t.Tx.Rollback(ctx)
	return fmt.Errorf("idemtest: settle: the handler rolled back: %w", idem.ErrTxOwned)
}

// TestHandlerThatEndsTheTransactionIsNotToldToRetry: a handler that called
// Rollback (pgx's defer tx.Rollback habit) or Commit on the handle gets a
// problem of its own that does not say retrying is safe, logged as the
// handler's doing, and the key is released: nothing committed.
func TestHandlerThatEndsTheTransactionIsNotToldToRetry(t *testing.T) {
	t.Parallel()
	var logged bytes.Buffer
	store := ownedStore{memstore.MustNew()}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "k"))
	resp := att.Finish(idem.Result{Status: 201, Body: []byte(`{}`)})
	if resp.Status != 500 || !bytes.Contains(resp.Body, []byte(idem.ProblemTxOwned)) || bytes.Contains(resp.Body, []byte("safe")) {
		t.Fatalf("answered %d %s, want 500 %s that does not call retrying safe", resp.Status, resp.Body, idem.ProblemTxOwned)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Fatalf("Retry-After %q for a bug a retry repeats", ra)
	}
	if !strings.Contains(logged.String(), "outcome=tx_owned") || !strings.Contains(logged.String(), "the handler called Commit or Rollback") {
		t.Fatalf("log %q, want the handler named as the cause", logged.String())
	}
	if _, free := storetest.Free(t, store, "alice", "k"); !free {
		t.Fatal("the key was not released")
	}
}

func TestPrincipalAndRequestIDBounds(t *testing.T) {
	t.Parallel()
	var ev idem.Event
	store := memstore.MustNew()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) { ev = e })})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		principal string
		ok        bool
	}{
		{"at the limit", strings.Repeat("p", idemstore.MaxPrincipalLength), true},
		{"one byte over", strings.Repeat("p", idemstore.MaxPrincipalLength+1), false},
		{"3000 bytes", strings.Repeat("p", 3000), false},
		{"invalid UTF-8", "alice\xff", false},
		{"NUL byte", "ali\x00ce", false},
	} {
		att, resp := e.Begin(context.Background(), request(tc.principal, "k-"+tc.name[:2]))
		if tc.ok {
			if att == nil {
				t.Fatalf("%s: refused with %d %s", tc.name, resp.Status, resp.Body)
			}
			att.Finish(idem.Result{Status: 201})
			continue
		}
		if att != nil || resp.Status != 400 || !bytes.Contains(resp.Body, []byte(idem.ProblemPrincipalInvalid)) || ev.Outcome != idem.OutcomePrincipalInvalid {
			t.Fatalf("%s: attempt %v, answer %+v, outcome %q; want 400 %s", tc.name, att != nil, resp, ev.Outcome, idem.ProblemPrincipalInvalid)
		}
	}
	for _, tc := range []struct{ sent, stored string }{
		{"plain-id", "plain-id"},
		{strings.Repeat("é", 200), strings.Repeat("é", 127)}, // 400 bytes cut at a character boundary
		{"a\x00b\xffc", "a\uFFFDb\uFFFDc"},
	} {
		key := fmt.Sprintf("rid-%d", len(tc.sent))
		req := request("alice", key)
		req.RequestID = tc.sent
		att, _ := e.Begin(context.Background(), req)
		att.Finish(idem.Result{Status: 201})
		rec, err := store.Get(context.Background(), "alice", key)
		if err != nil || rec.RequestID != tc.stored {
			t.Fatalf("request id %q stored as %q (%v), want %q", tc.sent, rec.RequestID, err, tc.stored)
		}
	}
	if _, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, MaxKeyLength: idemstore.MaxKeyLengthLimit + 1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("MaxKeyLength over what stores hold: New = %v", err)
	}
}

func TestProblemsNameTheConfiguredHeader(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Header: "X-Request-Key", MaxKeyLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	_, missing := e.Begin(context.Background(), request("alice", ""))
	_, invalid := e.Begin(context.Background(), request("alice", strings.Repeat("k", 65)))
	for _, resp := range []*idem.Response{missing, invalid} {
		if !bytes.Contains(resp.Body, []byte("X-Request-Key")) || bytes.Contains(resp.Body, []byte("Idempotency-Key")) {
			t.Fatalf("problem %s does not name the configured header", resp.Body)
		}
	}
	if !bytes.Contains(invalid.Body, []byte("1 to 64")) {
		t.Fatalf("problem %s does not name the configured limit", invalid.Body)
	}
}

func TestTimeoutHasItsOwnProblem(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), RequestTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "slow"))
	<-att.Context().Done()
	resp := att.Finish(idem.Result{Status: 201})
	if resp.Status != 503 || !bytes.Contains(resp.Body, []byte(idem.ProblemTimeout)) {
		t.Fatalf("a handler past its deadline: %d %s, want 503 %s", resp.Status, resp.Body, idem.ProblemTimeout)
	}
}

func TestTxUsedInEvent(t *testing.T) {
	t.Parallel()
	var ev idem.Event
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) { ev = e })})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "unused"))
	att.Finish(idem.Result{Status: http.StatusCreated})
	if ev.TxUsed {
		t.Fatal("TxUsed for a handler that never touched the transaction")
	}
	att, _ = e.Begin(context.Background(), request("alice", "used"))
	tx, _ := memstore.Tx(att.Context())
	tx.OnCommit(func() {})
	att.Finish(idem.Result{Status: http.StatusCreated})
	if !ev.TxUsed {
		t.Fatal("TxUsed false for a handler that wrote through the transaction")
	}
}

// A claim that committed while its caller saw an error (the client hung up
// mid-claim) must not block the key for a whole lease: the engine releases
// it, fenced by the attempt's own token.
func TestClaimWhoseAnswerWasLostIsReleased(t *testing.T) {
	t.Parallel()
	store := &faultyStore{Store: memstore.MustNew(), claimAnswerLost: true}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, resp := e.Begin(context.Background(), request("alice", "k")); resp == nil || resp.Status != 503 {
		t.Fatalf("answer to a lost claim: %+v", resp)
	}
	if rec, free := storetest.Free(t, store, "alice", "k"); !free {
		t.Fatalf("the lost claim still holds the key: %+v", rec)
	}
	// Another attempt's claim is not touched by the release.
	store.claimAnswerLost = false
	held, _ := e.Begin(context.Background(), request("alice", "held"))
	defer held.Abort()
	store.claimAnswerLost = true
	e.Begin(context.Background(), request("alice", "held"))
	if rec, err := store.Get(context.Background(), "alice", "held"); err != nil || rec.State != idemstore.StateInProgress {
		t.Fatalf("a lost claim on a key another attempt holds released that attempt's claim: %+v, %v", rec, err)
	}
}

// A handler that ended its transaction behind the store and then failed
// (a 500, an error, a panic) must not get its key released: the part it
// committed would run again on the retry.
func TestEndedTransactionIsNotReleasedOnFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(att *idem.Attempt) *idem.Response
	}{
		{"500", func(att *idem.Attempt) *idem.Response { return att.Finish(idem.Result{Status: 500}) }},
		{"handler error", func(att *idem.Attempt) *idem.Response {
			return att.Finish(idem.Result{Status: 201, Err: errors.New("boom")})
		}},
		{"response too large", func(att *idem.Attempt) *idem.Response {
			return att.Finish(idem.Result{Status: 201, Overflow: true})
		}},
		{"panic", func(att *idem.Attempt) *idem.Response { att.Abort(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &faultyStore{Store: memstore.MustNew(), rollbackEnded: true}
			var ev idem.Event
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.DiscardHandler),
				Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) { ev = e })})
			if err != nil {
				t.Fatal(err)
			}
			att, _ := e.Begin(context.Background(), request("alice", "k"))
			resp := tc.run(att)
			if ev.Outcome != idem.OutcomeTxEnded {
				t.Fatalf("outcome %q, want %q", ev.Outcome, idem.OutcomeTxEnded)
			}
			if resp != nil && (resp.Status != 500 || !bytes.Contains(resp.Body, []byte(idem.ProblemTxEnded))) {
				t.Fatalf("answered %d %s, want 500 %s", resp.Status, resp.Body, idem.ProblemTxEnded)
			}
			if rec, err := store.Get(context.Background(), "alice", "k"); err != nil || rec.State != idemstore.StateInProgress {
				t.Fatalf("record %+v, %v; want it kept in progress", rec, err)
			}
		})
	}
}

// TestStreamedResponseIsLoggedOnce: a handler that flushes (gin's
// c.Stream, http.ResponseController) meant to stream; the response is
// held until the commit all the same, and the engine says so once, at
// Warn, even without a Logger.
func TestStreamedResponseIsLoggedOnce(t *testing.T) {
	var logged bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	for _, tc := range []struct {
		name  string
		flush func(*idemadapter.ResponseBuffer)
		warns int
	}{
		{"no flush", func(*idemadapter.ResponseBuffer) {}, 0},
		{"Flush", func(b *idemadapter.ResponseBuffer) { b.Flush() }, 1},
		{"ResponseController", func(b *idemadapter.ResponseBuffer) { _ = http.NewResponseController(b).Flush() }, 1},
	} {
		logged.Reset()
		e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), AllowTxUnused: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			r := httptest.NewRequest(http.MethodPost, "/events", strings.NewReader(`{}`))
			r.Header.Set(idem.DefaultHeader, fmt.Sprint("k", i))
			w := httptest.NewRecorder()
			idemadapter.HandleHTTP(e, w, r, "alice", func(_ *http.Request, b *idemadapter.ResponseBuffer) error {
				_, _ = b.Write([]byte("chunk 1\n"))
				tc.flush(b)
				_, _ = b.Write([]byte("chunk 2\n"))
				return nil
			})
			if w.Code != http.StatusOK || w.Body.String() != "chunk 1\nchunk 2\n" {
				t.Fatalf("%s, request %d: %d %q, want the whole body", tc.name, i, w.Code, w.Body)
			}
		}
		if n := strings.Count(logged.String(), "level=WARN msg=\"idempotency: a handler flushed or streamed"); n != tc.warns {
			t.Fatalf("%s: two requests logged the warning %d times, want %d: %q", tc.name, n, tc.warns, logged.String())
		}
	}
}
