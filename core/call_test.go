package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/adaptertest"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// The call-level API: Engine.Do on a memstore, one test per guarantee.

func call(key, input string) idem.Call {
	return idem.Call{Principal: "alice", Key: key, Operation: "CreatePayment",
		Encoding: "application/json", Input: []byte(input)}
}

// effectFn writes one effect in the store's transaction (memstore.OnCommit)
// and answers status with body.
func effectFn(count *atomic.Int64, status int, body string) func(ctx context.Context) (idem.Response, error) {
	return func(ctx context.Context) (idem.Response, error) {
		tx, ok := memstore.Tx(ctx)
		if !ok {
			return idem.Response{}, errors.New("no transaction in ctx")
		}
		tx.OnCommit(func() { count.Add(1) })
		return idem.Response{Status: status, Header: map[string][]string{"grpc-meta": {"v"}}, Body: []byte(body)}, nil
	}
}

func newCallEngine(t *testing.T, cfg idem.Config) *idem.Engine {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = memstore.MustNew()
	}
	if cfg.FingerprintKey == nil {
		cfg.FingerprintKey = storetest.FingerprintKey
	}
	e, err := idem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	var events []idem.Event
	var mu sync.Mutex
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey, Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})})
	var effects atomic.Int64
	first, err := e.Do(context.Background(), call("k1", `{"amount":1,"currency":"EUR"}`), effectFn(&effects, 201, "pay_1"))
	if err != nil || first.Replayed || first.State != idemstore.StateCompleted || first.Outcome != idem.OutcomeClaimed || string(first.Body) != "pay_1" {
		t.Fatalf("first = %+v, %v", first, err)
	}
	// The same input in another member order and spacing is the same call.
	again, err := e.Do(context.Background(), call("k1", `{ "currency":"EUR", "amount":1 }`), effectFn(&effects, 201, "pay_2"))
	if err != nil || !again.Replayed || again.State != idemstore.StateCompleted || string(again.Body) != "pay_1" || again.Status != 201 {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	// The call's header is stored as fn returned it, with no HTTP
	// allow-list and no HTTP replay header.
	const metaKey = "grpc-meta" // a gRPC key, stored as given
	if meta := map[string][]string(again.Header)[metaKey]; len(meta) != 1 || meta[0] != "v" || again.Header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("replayed header = %v", again.Header)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Outcome != idem.OutcomeClaimed || events[1].Outcome != idem.OutcomeReplayed ||
		events[0].Path != "CreatePayment" || events[1].Status != 201 || !events[0].TxUsed || events[0].Key != "k1" {
		t.Fatalf("events = %+v", events)
	}
}

func TestDoRefusals(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey, MaxBodyBytes: 64})
	var effects atomic.Int64
	fn := effectFn(&effects, 200, "ok")
	if _, err := e.Do(context.Background(), call("k", `{"a":1}`), fn); err != nil {
		t.Fatal(err)
	}
	perr := errors.New("token expired")
	for _, tc := range []struct {
		name string
		c    idem.Call
		want idem.ProblemType
	}{
		{"no principal", idem.Call{Key: "k2", Operation: "op"}, idem.ProblemUnauthenticated},
		{"principal error", idem.Call{Principal: "alice", PrincipalErr: perr, Key: "k2", Operation: "op"}, idem.ProblemUnauthenticated},
		{"principal invalid", idem.Call{Principal: "a\x00b", Key: "k2", Operation: "op"}, idem.ProblemPrincipalInvalid},
		{"key missing", idem.Call{Principal: "alice", Operation: "op"}, idem.ProblemKeyMissing},
		{"key invalid", idem.Call{Principal: "alice", Key: "a b", Operation: "op"}, idem.ProblemKeyInvalid},
		{"input too large", idem.Call{Principal: "alice", Key: "k3", Operation: "op", Input: make([]byte, 65)}, idem.ProblemBodyTooLarge},
		{"other input", call("k", `{"a":2}`), idem.ProblemKeyReused},
		{"other operation", idem.Call{Principal: "alice", Key: "k", Operation: "Refund", Encoding: "application/json", Input: []byte(`{"a":1}`)}, idem.ProblemKeyReused},
	} {
		res, err := e.Do(context.Background(), tc.c, fn)
		var ce *idem.CallError
		if !errors.As(err, &ce) || ce.Problem != tc.want {
			t.Errorf("%s: Do = %+v, %v; want %s", tc.name, res, err, tc.want)
			continue
		}
		if p, ok := idem.ProblemOf(err); !ok || p != tc.want {
			t.Errorf("%s: ProblemOf = %s", tc.name, p)
		}
		if ce.Retryable() {
			t.Errorf("%s: retryable", tc.name)
		}
	}
	var ce *idem.CallError
	_, err := e.Do(context.Background(), idem.Call{Principal: "alice", PrincipalErr: perr, Key: "k2", Operation: "op"}, fn)
	if !errors.As(err, &ce) || !errors.Is(err, perr) || ce.Status() != http.StatusUnauthorized {
		t.Fatalf("principal error not kept: %v", err)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestDoInProgressConflict(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey, RequestTimeout: 10 * time.Second})
	inside, release := make(chan struct{}), make(chan struct{})
	var effects atomic.Int64
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), call("k", "{}"), func(ctx context.Context) (idem.Response, error) {
			close(inside)
			<-release
			return effectFn(&effects, 200, "ok")(ctx)
		})
		done <- err
	}()
	<-inside
	_, err := e.Do(context.Background(), call("k", "{}"), effectFn(&effects, 200, "second"))
	var ce *idem.CallError
	if !errors.As(err, &ce) || ce.Problem != idem.ProblemKeyInUse || ce.RetryAfter < time.Second || !ce.Retryable() {
		t.Fatalf("concurrent Do = %v, want key in use with RetryAfter", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("effects = %d", n)
	}
}

func TestDoReleasesTransientOutcomes(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey})
	var effects, runs atomic.Int64
	boom := errors.New("ledger unavailable")
	// An error from fn: rolled back, released, returned as it is.
	res, err := e.Do(context.Background(), call("k", "{}"), func(ctx context.Context) (idem.Response, error) {
		runs.Add(1)
		_, _ = effectFn(&effects, 200, "")(ctx)
		return idem.Response{}, boom
	})
	if !errors.Is(err, boom) || res.State != "" || res.Outcome != idem.OutcomeReleased {
		t.Fatalf("fn error: %+v, %v", res, err)
	}
	// A transient status (503) without an error: released, no error.
	res, err = e.Do(context.Background(), call("k", "{}"), func(ctx context.Context) (idem.Response, error) {
		runs.Add(1)
		_, _ = effectFn(&effects, 200, "")(ctx)
		return idem.Response{Status: 503}, nil
	})
	if err != nil || res.State != "" || res.Status != 503 || res.Outcome != idem.OutcomeReleased {
		t.Fatalf("503: %+v, %v", res, err)
	}
	// A panic: rolled back and released, and the panic goes on.
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic swallowed")
			}
		}()
		_, _ = e.Do(context.Background(), call("k", "{}"), func(ctx context.Context) (idem.Response, error) {
			runs.Add(1)
			_, _ = effectFn(&effects, 200, "")(ctx)
			panic("boom")
		})
	}()
	// The retry really retries.
	res, err = e.Do(context.Background(), call("k", "{}"), func(ctx context.Context) (idem.Response, error) {
		runs.Add(1)
		return effectFn(&effects, 0, "done")(ctx)
	})
	// Status 0 under Config.Classify is 200, and stored as 200.
	if err != nil || res.State != idemstore.StateCompleted || res.Status != 200 || runs.Load() != 4 || effects.Load() != 1 {
		t.Fatalf("retry: %+v, %v, runs %d, effects %d", res, err, runs.Load(), effects.Load())
	}
	again, _ := e.Do(context.Background(), call("k", "{}"), effectFn(&effects, 200, "x"))
	if !again.Replayed || again.Status != 200 || string(again.Body) != "done" {
		t.Fatalf("replay: %+v", again)
	}
}

// grpcLike classifies gRPC-style codes: 0 completes, 3 fails, others release.
func grpcLike(status int, err error) idem.Disposition {
	switch {
	case err != nil:
		return idem.Release
	case status == 0:
		return idem.Complete
	case status == 3:
		return idem.Fail
	}
	return idem.Release
}

func TestDoCallClassifier(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey})
	var effects atomic.Int64
	c := call("ok", "{}")
	c.Classify = grpcLike
	res, err := e.Do(context.Background(), c, effectFn(&effects, 0, "reply"))
	if err != nil || res.State != idemstore.StateCompleted || res.Status != 0 {
		t.Fatalf("code 0: %+v, %v", res, err)
	}
	res, _ = e.Do(context.Background(), c, effectFn(&effects, 0, "other"))
	if !res.Replayed || res.Status != 0 || string(res.Body) != "reply" {
		t.Fatalf("code 0 replay: %+v", res)
	}
	c.Key = "invalid"
	res, err = e.Do(context.Background(), c, effectFn(&effects, 3, "bad input"))
	if err != nil || res.State != idemstore.StateFailed {
		t.Fatalf("code 3: %+v, %v", res, err)
	}
	res, _ = e.Do(context.Background(), c, effectFn(&effects, 0, "other"))
	if !res.Replayed || res.State != idemstore.StateFailed || res.Status != 3 {
		t.Fatalf("code 3 replay: %+v", res)
	}
	c.Key = "unavailable"
	res, _ = e.Do(context.Background(), c, effectFn(&effects, 14, ""))
	if res.State != "" || res.Outcome != idem.OutcomeReleased {
		t.Fatalf("code 14: %+v", res)
	}
	if n := effects.Load(); n != 2 {
		t.Fatalf("effects = %d, want 2 (the released one rolled back)", n)
	}
}

func TestDoOptionalKey(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey, KeyOptional: true})
	ran := 0
	res, err := e.Do(context.Background(), idem.Call{Operation: "op"}, func(ctx context.Context) (idem.Response, error) {
		ran++
		if _, ok := memstore.Tx(ctx); ok {
			t.Error("a call without a key got a transaction")
		}
		return idem.Response{Status: 200}, nil
	})
	if err != nil || ran != 1 || res.State != "" || res.Outcome != idem.OutcomeNoKey {
		t.Fatalf("no key: %+v, %v", res, err)
	}
}

func TestDoDeadlineAndCommitFailure(t *testing.T) {
	t.Parallel()
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey, RequestTimeout: 50 * time.Millisecond})
	var effects atomic.Int64
	_, err := e.Do(context.Background(), call("slow", "{}"), func(ctx context.Context) (idem.Response, error) {
		_, _ = effectFn(&effects, 200, "")(ctx)
		<-ctx.Done()
		return idem.Response{Status: 200}, nil
	})
	var ce *idem.CallError
	if !errors.As(err, &ce) || ce.Problem != idem.ProblemTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	_, err = e.Do(context.Background(), call("poisoned", "{}"), func(ctx context.Context) (idem.Response, error) {
		tx, _ := memstore.Tx(ctx)
		tx.FailCommit(errors.New("disk full"))
		return effectFn(&effects, 200, "")(ctx)
	})
	if !errors.As(err, &ce) || ce.Problem != idem.ProblemCommitFailed || ce.RetryAfter != time.Second {
		t.Fatalf("commit failure: %v", err)
	}
	res, err := e.Do(context.Background(), call("poisoned", "{}"), effectFn(&effects, 200, "ok"))
	if err != nil || res.Replayed || effects.Load() != 1 {
		t.Fatalf("after a failed commit the retry must run: %+v, %v, effects %d", res, err, effects.Load())
	}
}

func TestDoLeaseLostAndReconcile(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var reconciled atomic.Int64
	e := newCallEngine(t, idem.Config{FingerprintKey: storetest.FingerprintKey,
		Store: memstore.MustNew(memstore.WithClock(clk.Now)), RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second,
		Reconcile: func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
			reconciled.Add(1)
			// The provider says the first attempt's charge went through.
			return &idem.Response{Status: 0, Body: []byte("from provider")}, nil
		},
	})
	var effects atomic.Int64
	inside, resume := make(chan string), make(chan struct{})
	done := make(chan error, 1)
	c := call("k", "{}")
	c.Classify = grpcLike
	go func() {
		_, err := e.Do(context.Background(), c, func(ctx context.Context) (idem.Response, error) {
			k, _ := idem.DownstreamKey(ctx, "charge")
			inside <- k
			<-resume
			return effectFn(&effects, 0, "late")(ctx)
		})
		done <- err
	}()
	k1 := <-inside
	clk.Add(4 * time.Second) // the holder looks dead: its lease expired
	res, err := e.Do(context.Background(), c, effectFn(&effects, 0, "never"))
	if err != nil || res.Outcome != idem.OutcomeStaleReclaimed || string(res.Body) != "from provider" || res.State != idemstore.StateCompleted || res.Status != 0 {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	close(resume)
	var ce *idem.CallError
	if err := <-done; !errors.As(err, &ce) || ce.Problem != idem.ProblemLeaseLost || !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("old holder: %v, want lease lost", err)
	}
	if effects.Load() != 0 || reconciled.Load() != 1 || len(k1) != 64 {
		t.Fatalf("effects %d, reconciled %d, downstream key %q", effects.Load(), reconciled.Load(), k1)
	}
	res, _ = e.Do(context.Background(), c, effectFn(&effects, 0, "never"))
	if !res.Replayed || string(res.Body) != "from provider" {
		t.Fatalf("replay after reconcile: %+v", res)
	}
}

// BenchmarkDo measures the call API's overhead on a memstore against
// calling the function directly. The function uses no transaction, which
// AllowTxUnused says is meant (the engine would log a warning per call),
// and the store's bounds leave room for every first call of a run.
func BenchmarkDo(b *testing.B) {
	e, _ := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: adaptertest.BenchStore(), AllowTxUnused: true})
	input := []byte(`{"amount":1000,"currency":"EUR","description":"coffee"}`)
	fn := func(ctx context.Context) (idem.Response, error) {
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
	}
	b.Run("Direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fn(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FirstCall", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			c := idem.Call{Principal: "acct_1", Key: "first-" + itoa(i), Operation: "CreatePayment", Encoding: "application/json", Input: input}
			if _, err := e.Do(context.Background(), c, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		c := idem.Call{Principal: "acct_1", Key: "replayed", Operation: "CreatePayment", Encoding: "application/json", Input: input}
		if _, err := e.Do(context.Background(), c, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if res, err := e.Do(context.Background(), c, fn); err != nil || !res.Replayed {
				b.Fatal(err)
			}
		}
	})
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}
